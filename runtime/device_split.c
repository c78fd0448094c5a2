/* device_split — the plan for several GPUs of one host (see device_split.h). */
#include "runtime/device_split.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

/* Layers of [lo, hi) with planes in a pool (mask NULL: every one). */
static int planes_in(const uint8_t *mask, int lo, int hi)
{
    if (!mask) return hi - lo;
    int n = 0;
    for (int i = lo; i < hi; i++) n += mask[i] != 0;
    return n;
}

/* The share of `bytes` that `part` of `all` planes take, rounded up (all of it when part == all). */
static uint64_t share(uint64_t bytes, int part, int all)
{
    return all > 0 ? (bytes * (uint64_t)part + (uint64_t)all - 1) / (uint64_t)all : 0;
}

static uint64_t host_map(const struct device_map_input *m, uint64_t bytes)
{
    return m->host_map_div ? (bytes + m->host_map_div - 1) / m->host_map_div : 0;
}

static uint64_t block_of(const struct device_map_input *m, int l)
{
    return m->layer_sizes ? m->layer_sizes[l] : m->layer_bytes;
}

/* The input of device d's range [lo, hi) (several: its share of the KV pools, no extension; kv_pin > 0 holds
 * the pool at that many positions). With one device it is the model's input with its budget. */
static struct device_map_input range_input(const struct device_split_input *in, int d, int lo, int hi,
                                           int64_t kv_pin)
{
    const struct device_map_input *m = &in->model;
    struct device_map_input s = *m;
    s.budget = in->budget[d];
    if (in->n_devices == 1) return s;
    const int L = m->n_layers;
    s.n_layers = hi - lo;
    s.layer_sizes = m->layer_sizes ? m->layer_sizes + lo : NULL;
    s.resident_mask = m->resident_mask ? m->resident_mask + lo : NULL;
    s.stream_only = m->stream_only ? m->stream_only + lo : NULL;
    s.head_bytes = hi == L ? m->head_bytes : 0;
    const int kp = planes_in(in->kv_layer, 0, L), kd = planes_in(in->kv_layer, lo, hi);
    s.kv_token_bytes = share(m->kv_token_bytes, kd, kp);
    s.fixed_bytes = m->fixed_bytes - in->kv_fixed_bytes + share(in->kv_fixed_bytes, kd, kp);
    s.kv_swa_bytes = share(m->kv_swa_bytes, planes_in(in->swa_layer, lo, hi), planes_in(in->swa_layer, 0, L));
    s.kv_ext_max = 0;
    s.kv_ext_host = 0;
    if (kv_pin > 0) s.kv_tokens_max = s.kv_tokens_floor = s.kv_tokens_min = kv_pin;
    return s;
}

/* Expert models: device d's plan with every block of its range resident and the experts of its first c layers
 * in host memory, c as few as fit (or the model's first cpu_moe layers), as forward_cuda.c plans one device.
 * sizes: (n_layers) scratch. */
static int plan_experts(const struct device_split_input *in, struct device_map_input *s, int lo,
                        uint64_t *sizes, struct device_split_part *p, char err[256])
{
    const struct device_map_input *m = &in->model;
    const int n = s->n_layers;
    const uint64_t fixed = s->fixed_bytes;
    s->gpu_layers = n;
    s->resident_mask = NULL;
    s->layer_sizes = sizes;
    int c = in->cpu_moe < 0 ? 0 : in->cpu_moe - lo;
    c = c < 0 ? 0 : c > n ? n : c;
    for (;; c++) {
        uint64_t big = 0, experts_map = 0;
        for (int i = 0; i < n; i++) {
            sizes[i] = block_of(m, lo + i) + (i >= c ? in->expert_bytes[lo + i] : 0);
            if (sizes[i] > big) big = sizes[i];
            if (i < c) experts_map += host_map(m, in->expert_bytes[lo + i]);
        }
        s->layer_bytes = big;
        const uint64_t cache = c && in->expert_cache > 0 ? (uint64_t)in->expert_cache : 0;
        s->fixed_bytes = fixed + (c ? in->expert_stage_bytes : 0) + cache + experts_map;
        const int rc = device_map_plan(s, &p->map, err);
        if (rc != FERRY_ERR_DEVICE_MEM || in->cpu_moe >= 0 || c >= n) {
            p->cpu_moe = c;
            if (rc) return rc;
            p->map.host_map_bytes += experts_map;
            p->map.moe_layers = n, p->map.cpu_moe = c, p->map.expert_cache_bytes = cache;
            if (c && in->expert_cache < 0 && in->cpu_moe < 0 && s->budget > p->map.bytes_total) {
                uint64_t more = s->budget - p->map.bytes_total;
                if (in->expert_slot_bytes) more = more / in->expert_slot_bytes * in->expert_slot_bytes;
                p->map.expert_cache_bytes = more;
                p->map.bytes_total += more;
            }
            return FERRY_OK;
        }
        device_map_free(&p->map);
    }
}

/* Device d's plan of [lo, hi) into p (p->map allocated on success; on FERRY_ERR_DEVICE_MEM its bytes_minimum
 * holds the minimum). */
static int plan_part(const struct device_split_input *in, int d, int lo, int hi, int64_t kv_pin,
                     uint64_t *sizes, struct device_split_part *p, char err[256])
{
    memset(p, 0, sizeof *p);
    p->ordinal = in->ordinal[d];
    p->budget = in->budget[d];
    p->first = lo;
    p->end = hi;
    struct device_map_input s = range_input(in, d, lo, hi, kv_pin);
    const int rc =
        in->expert_bytes ? plan_experts(in, &s, lo, sizes, p, err) : device_map_plan(&s, &p->map, err);
    if (rc) return rc;
    for (int i = 0; i < hi - lo; i++) {
        if (p->map.where[i] != PLACEMENT_GPU) p->host_bytes += block_of(&in->model, lo + i);
        if (in->expert_bytes && i < p->cpu_moe) p->host_bytes += in->expert_bytes[lo + i];
    }
    return FERRY_OK;
}

void device_split_free(struct device_split *s)
{
    if (!s) return;
    for (int d = 0; d < s->n_devices; d++) device_map_free(&s->part[d].map);
    memset(s, 0, sizeof *s);
}

/* How good a split is (better: every device fits, else less missing; then fewer bytes in host memory, more KV
 * positions, the fullest device less full). */
struct score {
    int fits;
    uint64_t missing;
    uint64_t host;
    int64_t kv;
    double fullest;
};

static int better(const struct score *a, const struct score *b)
{
    if (a->fits != b->fits) return a->fits;
    if (!a->fits) return a->missing < b->missing;
    if (a->host != b->host) return a->host < b->host;
    if (a->kv != b->kv) return a->kv > b->kv;
    return a->fullest < b->fullest - 1e-12;
}

/* The plan of the split at bound (device d holds [bound[d], bound[d + 1])) into out and its score; the first
 * device that does not fit is named in err. Returns FERRY_OK (fitting or not) or an error that is not the
 * budget's. */
static int plan_split(const struct device_split_input *in, const int *bound, uint64_t *sizes,
                      struct device_split *out, struct score *sc, char err[256])
{
    const int D = in->n_devices;
    memset(out, 0, sizeof *out);
    memset(sc, 0, sizeof *sc);
    out->n_devices = D;
    sc->fits = 1;
    for (int d = 0; d < D; d++) {
        struct device_split_part *p = &out->part[d];
        char e[256] = "";
        const int rc = plan_part(in, d, bound[d], bound[d + 1], 0, sizes, p, e);
        if (rc == FERRY_ERR_DEVICE_MEM) {
            if (sc->fits)
                snprintf(err, 256, "GPU %d (layers %d-%d of %d): %s", p->ordinal, bound[d], bound[d + 1] - 1,
                         in->model.n_layers, e);
            sc->fits = 0;
            sc->missing += p->map.bytes_minimum > p->budget ? p->map.bytes_minimum - p->budget : 1;
        } else if (rc) {
            snprintf(err, 256, "GPU %d (layers %d-%d): %s", p->ordinal, bound[d], bound[d + 1] - 1, e);
            return rc;
        }
    }
    if (!sc->fits) return FERRY_OK;
    /* Every sequence spans every layer: the pools hold what the tightest device allows. */
    int64_t kv = 0;
    for (int d = 0; d < D; d++)
        if (out->part[d].map.kv_tokens && (!kv || out->part[d].map.kv_tokens < kv))
            kv = out->part[d].map.kv_tokens;
    for (int d = 0; D > 1 && kv && d < D; d++) {
        struct device_split_part *p = &out->part[d];
        if (p->map.kv_tokens <= kv) continue;
        device_map_free(&p->map);
        char e[256] = "";
        const int rc = plan_part(in, d, bound[d], bound[d + 1], kv, sizes, p, e);
        if (rc) { /* (it held more positions than these beside its smallest plan: not expected) */
            snprintf(err, 256, "GPU %d (layers %d-%d): %s", p->ordinal, bound[d], bound[d + 1] - 1, e);
            return rc == FERRY_ERR_DEVICE_MEM ? FERRY_ERR_INVALID : rc;
        }
    }
    out->kv_tokens = kv;
    sc->kv = kv;
    for (int d = 0; d < D; d++) {
        const struct device_split_part *p = &out->part[d];
        const double full = (double)p->map.bytes_total / (double)p->budget;
        sc->host += p->host_bytes;
        if (full > sc->fullest) sc->fullest = full;
        out->predicted_step_s += p->map.predicted_step_s;
    }
    if (in->peer_bytes_per_s > 0)
        out->peer_s = (double)(D - 1) * (double)in->hidden_bytes / in->peer_bytes_per_s;
    out->predicted_step_s += out->peer_s;
    return FERRY_OK;
}

/* The first guess: layers in proportion to what each budget holds beside its fixed bytes (and the head on the
 * last), each device at least one. */
static void first_guess(const struct device_split_input *in, int *bound)
{
    const int D = in->n_devices, L = in->model.n_layers;
    double cap[DEVICE_SPLIT_MAX], all = 0;
    for (int d = 0; d < D; d++) {
        uint64_t fixed = in->model.fixed_bytes + (d == D - 1 ? in->model.head_bytes : 0);
        cap[d] = in->budget[d] > fixed ? (double)(in->budget[d] - fixed) : 1.0;
        all += cap[d];
    }
    double run = 0;
    bound[0] = 0;
    bound[D] = L;
    for (int d = 1; d < D; d++) {
        run += cap[d - 1];
        int b = (int)(run / all * L + 0.5);
        if (b < bound[d - 1] + 1) b = bound[d - 1] + 1;
        if (b > L - (D - d)) b = L - (D - d);
        bound[d] = b;
    }
}

int device_split_plan(const struct device_split_input *in, struct device_split *out, char err[256])
{
    memset(out, 0, sizeof *out);
    err[0] = 0;
    const int D = in->n_devices, L = in->model.n_layers;
    if (D < 1 || D > DEVICE_SPLIT_MAX || L < D) {
        snprintf(err, 256, "%d devices for %d layers: a plan takes 1 to %d devices, at most one per layer", D,
                 L, DEVICE_SPLIT_MAX);
        return FERRY_ERR_INVALID;
    }
    for (int d = 0; d < D; d++)
        if (!in->budget[d]) {
            snprintf(err, 256, "GPU %d has no budget: give --gpu-memory one size per device", in->ordinal[d]);
            return FERRY_ERR_INVALID;
        }
    if (D > 1 && in->model.gpu_layers >= 0) {
        snprintf(err, 256,
                 "--gpu-layers is planned for one device only (several split the layers themselves)");
        return FERRY_ERR_INVALID;
    }
    if (in->expert_bytes && !in->model.layer_sizes && !in->model.layer_bytes) {
        snprintf(err, 256, "an expert model's plan needs its layers' blocks");
        return FERRY_ERR_INVALID;
    }
    uint64_t *sizes = malloc((size_t)L * sizeof *sizes);
    if (!sizes) return FERRY_ERR_NOMEM;
    int bound[DEVICE_SPLIT_MAX + 1];
    first_guess(in, bound);
    struct score best, sc;
    char e[256] = "";
    int rc = plan_split(in, bound, sizes, out, &best, err);
    /* Each boundary in turn to its best place, until none moves (with two devices: every split is tried). */
    for (int round = 0, moved = 1; !rc && moved && D > 1 && round < 16; round++) {
        moved = 0;
        for (int i = 1; !rc && i < D; i++)
            for (int b = bound[i - 1] + 1; !rc && b < bound[i + 1]; b++) {
                if (b == bound[i]) continue;
                int trial[DEVICE_SPLIT_MAX + 1];
                memcpy(trial, bound, sizeof trial);
                trial[i] = b;
                struct device_split cand;
                e[0] = 0;
                rc = plan_split(in, trial, sizes, &cand, &sc, e);
                if (!rc && better(&sc, &best)) {
                    device_split_free(out);
                    *out = cand;
                    best = sc;
                    bound[i] = b;
                    moved = 1;
                    snprintf(err, 256, "%s", e);
                } else {
                    device_split_free(&cand);
                    if (rc) snprintf(err, 256, "%s", e);
                }
            }
    }
    free(sizes);
    if (!rc && !best.fits) rc = FERRY_ERR_DEVICE_MEM;
    if (rc) {
        device_split_free(out);
        return rc;
    }
    err[0] = 0;
    return FERRY_OK;
}

/* Appends to buf (snprintf semantics: *n counts what would have been written). */
__attribute__((format(printf, 4, 5))) static void emit(char *buf, size_t cap, size_t *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int w = vsnprintf(buf + (*n < cap ? *n : cap), *n < cap ? cap - *n : 0, fmt, ap);
    va_end(ap);
    if (w > 0) *n += (size_t)w;
}

int device_split_format(const struct device_split *s, char *buf, size_t cap)
{
    size_t n = 0;
#define EMIT(...) emit(buf, cap, &n, __VA_ARGS__)
    EMIT("device_split: %d device%s, layers", s->n_devices, s->n_devices == 1 ? "" : "s");
    for (int d = 0; d < s->n_devices; d++)
        EMIT("%s %d-%d", d ? " |" : "", s->part[d].first, s->part[d].end - 1);
    if (s->kv_tokens) EMIT("; KV pool of %lld positions on every device", (long long)s->kv_tokens);
    EMIT("; predicted batch-1 step when streaming %.2f ms", s->predicted_step_s * 1e3);
    if (s->peer_s > 0) EMIT(" (of it %.3f ms of peer copies)", s->peer_s * 1e3);
    EMIT("\n");
    for (int d = 0; d < s->n_devices; d++) {
        const struct device_split_part *p = &s->part[d];
        const struct device_map *m = &p->map;
        EMIT("  GPU %d: layers %d-%d, %d resident, %d in host memory", p->ordinal, p->first, p->end - 1,
             m->n_resident, m->n_streamed);
        if (m->moe_layers && m->cpu_moe) EMIT(", experts of its first %d in host memory", m->cpu_moe);
        if (m->expert_cache_bytes) EMIT(" (expert cache %.1f MiB)", m->expert_cache_bytes / MIB);
        if (m->kv_tokens) EMIT("; KV %lld positions (%.2f GiB)", (long long)m->kv_tokens, m->kv_bytes / GIB);
        if (m->kv_ext_tokens) EMIT(" and %lld in host memory", (long long)m->kv_ext_tokens);
        if (m->ring_bytes) EMIT("; ring %.1f MiB", m->ring_bytes / MIB);
        if (d == 0) EMIT("; embedding rows in");
        if (d == s->n_devices - 1) EMIT("; output head");
        EMIT("; %.2f of %.2f GiB (minimum %.2f); step %.2f ms\n", m->bytes_total / GIB, p->budget / GIB,
             m->bytes_minimum / GIB, m->predicted_step_s * 1e3);
        for (int i = 0; i < m->n_layers;) {
            int j = i;
            while (j + 1 < m->n_layers && m->where[j + 1] == m->where[i]) j++;
            EMIT("    layers %3d-%-3d %s\n", p->first + i, p->first + j,
                 m->where[i] == PLACEMENT_GPU ? "gpu" : "host");
            i = j + 1;
        }
    }
#undef EMIT
    return (int)n;
}
