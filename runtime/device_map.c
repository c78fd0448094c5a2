/* device_map — the placement planner (see device_map.h). */
#include "runtime/device_map.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/ring.h"

#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

/* bytes in GiB with two decimals (from 1 GiB) or MiB with one, rounded up or down to the last digit. */
static void size_str(char *buf, size_t cap, uint64_t bytes, int up)
{
    const int gib = bytes >= (uint64_t)GIB;
    const double units = (double)bytes / (gib ? GIB / 100 : MIB / 10);
    const double r = up ? ceil(units) : floor(units);
    snprintf(buf, cap, gib ? "%.2f GiB" : "%.1f MiB", r / (gib ? 100 : 10));
}

int device_map_too_small(char err[256], uint64_t budget, uint64_t minimum, const char *detail)
{
    char b[32], m[32];
    size_str(b, sizeof b, budget, 0);
    size_str(m, sizeof m, minimum, 1);
    snprintf(err, 256, "GPU budget %s is too small: the minimum is %s (%s)", b, m, detail);
    return FERRY_ERR_DEVICE_MEM;
}

static uint64_t layer_size(const struct device_map_input *in, int i)
{
    return in->layer_sizes ? in->layer_sizes[i] : in->layer_bytes;
}

static int cpu_only(const struct device_map_input *in, int i)
{
    return in->cpu_only && in->cpu_only[i];
}

static uint64_t state_of(const struct device_map_input *in, int i)
{
    return in->state_bytes ? in->state_bytes[i] : 0;
}

/* Bresenham spread: layer i streams when the running share of streamed layers steps up at i. */
static enum placement spread(int i, int streamed, int L)
{
    return (int64_t)(i + 1) * streamed / L > (int64_t)i * streamed / L ? PLACEMENT_STREAM : PLACEMENT_GPU;
}

/* Where layer i lives when `resident` layers stay on the device: the caller's mask, or the even spread. */
static enum placement where_of(const struct device_map_input *in, int i, int resident)
{
    if (in->resident_mask) return in->resident_mask[i] ? PLACEMENT_GPU : PLACEMENT_STREAM;
    return spread(i, in->n_layers - resident, in->n_layers);
}

/* The largest layer that streams when `resident` layers stay on the device (0: none streams; a CPU-only
 * host layer never does). */
static uint64_t largest_streamed(const struct device_map_input *in, int resident)
{
    uint64_t big = 0;
    for (int i = 0; i < in->n_layers; i++)
        if (where_of(in, i, resident) != PLACEMENT_GPU && !cpu_only(in, i) && layer_size(in, i) > big)
            big = layer_size(in, i);
    return big;
}

/* The largest piece that streams (a layer's largest matrix group; the whole layer when not given). */
static uint64_t largest_piece(const struct device_map_input *in, int resident)
{
    const uint64_t big = largest_streamed(in, resident);
    return in->piece_bytes && in->piece_bytes < big ? in->piece_bytes : big;
}

/* The ring's bytes beside `resident` layers: the caller's layers' worth, else two of the largest pieces (the
 * planner grows it later); 0 when nothing streams. */
static uint64_t ring_min(const struct device_map_input *in, int resident)
{
    const uint64_t big = largest_streamed(in, resident);
    if (!big || in->no_ring) return 0;
    if (in->ring_layers > 0) return ring_align((uint64_t)in->ring_layers * big);
    return 2 * ring_align(largest_piece(in, resident));
}

/* The device's page tables for `bytes` of pinned host memory (0 when not counted). */
static uint64_t host_map(const struct device_map_input *in, uint64_t bytes)
{
    return in->host_map_div ? (bytes + in->host_map_div - 1) / in->host_map_div : 0;
}

/* The page tables of the host layers when `resident` layers stay on the device. */
static uint64_t host_layers_map(const struct device_map_input *in, int resident)
{
    uint64_t map = 0;
    for (int i = 0; i < in->n_layers; i++)
        if (where_of(in, i, resident) != PLACEMENT_GPU) map += host_map(in, layer_size(in, i));
    return map;
}

/* Device bytes of the layers' state when `resident` layers stay on the device: every layer's but a CPU-only
 * host layer's. */
static uint64_t states_bytes(const struct device_map_input *in, int resident)
{
    uint64_t st = 0;
    for (int i = 0; i < in->n_layers; i++)
        if (where_of(in, i, resident) == PLACEMENT_GPU || !cpu_only(in, i)) st += state_of(in, i);
    return st;
}

/* Device bytes of the weights when `resident` layers stay on the device and the rest stream through a ring
 * of ring_min (their page tables and the layers' device state included). */
static uint64_t weights_bytes(const struct device_map_input *in, int resident)
{
    uint64_t res = 0;
    for (int i = 0; i < in->n_layers; i++)
        if (where_of(in, i, resident) == PLACEMENT_GPU) res += layer_size(in, i);
    return res + ring_min(in, resident) + host_layers_map(in, resident) + states_bytes(in, resident);
}

/* The most resident layers beside a pool of kv_floor positions (or what the smallest plan leaves, if less,
 * never below kv_min); the pool's positions in *kv_out. */
static int fit_beside(const struct device_map_input *in, uint64_t base, int64_t kv_floor, int64_t kv_min,
                      int64_t blk, int min_resident, int64_t *kv_out)
{
    const uint64_t kvt = in->kv_token_bytes;
    const int auto_kv = kvt > 0;
    int64_t kv = kv_floor;
    const uint64_t w_min = weights_bytes(in, min_resident);
    if (auto_kv && in->budget < base + w_min + (uint64_t)kv * kvt && in->budget > base + w_min)
        kv = (int64_t)((in->budget - base - w_min) / kvt) / blk * blk;
    if (kv < kv_min) kv = kv_min;
    int resident = in->n_layers; /* (every layer may still fit beside the floor) */
    while (resident > min_resident && base + weights_bytes(in, resident) + (uint64_t)kv * kvt > in->budget)
        resident--;
    resident -= in->fewer_resident;
    if (resident < min_resident) resident = min_resident;
    *kv_out = kv;
    return resident;
}

int device_map_plan(const struct device_map_input *in, struct device_map *out, char err[256])
{
    memset(out, 0, sizeof *out);
    const int L = in->n_layers;
    const int auto_kv = in->kv_token_bytes > 0;
    if (L <= 0 || in->gpu_layers < -1 || in->gpu_layers > L || in->ring_layers < 0 ||
        (auto_kv && (in->kv_block <= 0 || in->kv_tokens_min <= 0 || in->kv_tokens_max < in->kv_tokens_min))) {
        snprintf(err, 256, "invalid placement request (layers %d, --gpu-layers %d)", L, in->gpu_layers);
        return FERRY_ERR_INVALID;
    }
    for (int i = 0; i < L && in->stream_only; i++)
        if (in->stream_only[i] && cpu_only(in, i)) {
            snprintf(err, 256, "invalid placement request: layer %d both stream-only and CPU-only", i);
            return FERRY_ERR_INVALID;
        }
    const uint64_t base0 = in->fixed_bytes + in->kv_swa_bytes + in->head_bytes, kvt = in->kv_token_bytes;
    const int64_t blk = auto_kv ? in->kv_block : 1;
    const int64_t kv_max = auto_kv ? in->kv_tokens_max / blk * blk : 0;
    /* The page tables of the largest extension this plan may have, kept aside while layers and the pool are
     * placed (an extension exists only beside host layers: with every layer resident they are not). */
    const int64_t ext_most = in->kv_ext_max < kv_max ? in->kv_ext_max / blk * blk : kv_max;
    const uint64_t ext_map = auto_kv && ext_most > 0 ? host_map(in, (uint64_t)ext_most * kvt) : 0;
    uint64_t base = base0 + ext_map;
    int64_t kv_min = auto_kv ? (in->kv_tokens_min + blk - 1) / blk * blk : 0;
    int64_t kv_floor = auto_kv ? in->kv_tokens_floor / blk * blk : 0;
    if (kv_floor < kv_min) kv_floor = kv_min;
    if (kv_floor > kv_max) kv_floor = kv_max > kv_min ? kv_max : kv_min;
    int n_mask = 0;
    if (in->resident_mask)
        for (int i = 0; i < L; i++) n_mask += in->resident_mask[i] != 0;
    /* The smallest plan: every layer streams (through the smallest ring; with no ring, the host computes),
     * or the caller's resident layers stay. */
    const int min_resident = in->resident_mask ? n_mask : in->gpu_layers >= 0 ? in->gpu_layers : 0;
    const uint64_t smallest = base + weights_bytes(in, min_resident);
    /* With an extension the host's cores attend to, one full-length sequence need not be on the device: a
     * device position saves the host reading it once a step while a sequence is that long, a byte of resident
     * layer saves the same on every step. So beside the layers the device keeps KV_DEVICE_POSITIONS (where
     * prompts' chunks attend at the device's speed), or one sequence if shorter, and the extension holds the
     * rest; a budget that cannot hold even that beside the smallest plan keeps what fits (whole blocks, at
     * least one). */
    const int64_t seq = kv_min;
    const int seq_may_split =
        auto_kv && in->kv_ext_host && in->kv_ext_max >= kv_min && !in->resident_mask && in->gpu_layers < 0;
    int64_t dev_min = kv_min;
    if (seq_may_split) {
        const int64_t dev = (KV_DEVICE_POSITIONS + blk - 1) / blk * blk;
        if (dev_min > dev) dev_min = dev;
        if (smallest + (uint64_t)kv_min * kvt > in->budget && in->budget >= smallest + (uint64_t)blk * kvt) {
            kv_min = (int64_t)((in->budget - smallest) / kvt) / blk * blk;
            kv_floor = kv_min;
        }
        if (dev_min > kv_min) dev_min = kv_min;
    }
    out->bytes_minimum = smallest + (uint64_t)(seq_may_split ? blk : kv_min) * kvt;

    int resident;
    int64_t kv = kv_max;
    if (in->resident_mask) {
        resident = n_mask;
        kv = kv_min;
    } else if (in->gpu_layers >= 0) {
        resident = in->gpu_layers;
        kv = kv_min; /* grows below into what the layers leave */
    } else if (in->budget >= base0 + weights_bytes(in, L) + (uint64_t)kv_max * kvt) {
        resident = L;
    } else {
        resident = fit_beside(in, base, kv_floor, kv_min, blk, min_resident, &kv);
        /* An extension the host attends to is cheap: the layers go first, unless all of them would fit. */
        if (auto_kv && in->kv_ext_host && in->kv_ext_max > 0 && kv_floor > dev_min) {
            int64_t kv2;
            const int r2 = fit_beside(in, base, dev_min, dev_min, blk, min_resident, &kv2);
            if (r2 < L) resident = r2, kv = kv2;
        }
    }
    if (kv < dev_min) kv = dev_min;
    if (resident == L) base = base0; /* no extension */
    /* The ring grows into what the layers leave beside the pool's floor, up to two of the largest streamed
     * layers; then the pool takes the rest, up to its maximum. */
    uint64_t ring = ring_min(in, resident);
    const uint64_t used = base + weights_bytes(in, resident) + (uint64_t)kv * kvt;
    if (ring && in->ring_layers == 0 && in->budget > used) {
        const uint64_t most = 2 * ring_align(largest_streamed(in, resident));
        uint64_t grown = ring + (in->budget - used) / RING_ALIGN * RING_ALIGN;
        if (grown > most) grown = most;
        if (grown > ring) ring = grown;
    }
    const uint64_t weights = weights_bytes(in, resident) - ring_min(in, resident) + ring;
    if (auto_kv && in->budget > base + weights) {
        int64_t fit = (int64_t)((in->budget - base - weights) / kvt) / blk * blk;
        if (fit > kv_max) fit = kv_max;
        if (fit > kv) kv = fit;
    }
    uint64_t total = base + weights + (uint64_t)kv * kvt;
    if (total > in->budget) {
        char detail[160];
        if (auto_kv && seq_may_split)
            snprintf(detail, sizeof detail,
                     "%d layers streamed, one block of the KV pool on the device and the rest in host memory",
                     L - min_resident);
        else if (auto_kv)
            snprintf(detail, sizeof detail,
                     "%d layers streamed, a KV pool of %lld positions = one --ctx-size sequence",
                     L - min_resident, (long long)kv_min);
        else if (in->no_ring)
            snprintf(detail, sizeof detail, "%d resident layers, %d computed by the host's cores",
                     min_resident, L - min_resident);
        else
            snprintf(detail, sizeof detail, "%d resident layers, %d streamed through a ring of %.1f MiB",
                     min_resident, L - min_resident, ring_min(in, min_resident) / MIB);
        return device_map_too_small(err, in->budget, out->bytes_minimum, detail);
    }
    for (int i = 0; i < L && in->no_ring && in->stream_only; i++)
        if (in->stream_only[i] && where_of(in, i, resident) != PLACEMENT_GPU) {
            snprintf(err, 256,
                     "layer %d would live in host memory, where only streaming can run it, and this plan has "
                     "no ring",
                     i);
            return FERRY_ERR_UNSUPPORTED;
        }
    if (in->stream_only) {
        if (!(out->stream_only = malloc((size_t)L))) return FERRY_ERR_NOMEM;
        memcpy(out->stream_only, in->stream_only, (size_t)L);
    }
    if (in->cpu_only) {
        if (!(out->cpu_only = malloc((size_t)L))) {
            device_map_free(out);
            return FERRY_ERR_NOMEM;
        }
        memcpy(out->cpu_only, in->cpu_only, (size_t)L);
    }
    out->where = malloc((size_t)L * sizeof *out->where);
    if (!out->where) {
        device_map_free(out);
        return FERRY_ERR_NOMEM;
    }
    uint64_t streamed_bytes = 0, all_bytes = 0;
    for (int i = 0; i < L; i++) {
        out->where[i] = where_of(in, i, resident);
        all_bytes += layer_size(in, i);
        if (out->where[i] == PLACEMENT_STREAM && !cpu_only(in, i)) streamed_bytes += layer_size(in, i);
        out->n_stream_only += out->where[i] != PLACEMENT_GPU && in->stream_only && in->stream_only[i];
        out->n_cpu_only += out->where[i] != PLACEMENT_GPU && cpu_only(in, i);
    }
    out->state_bytes = states_bytes(in, resident);
    out->n_layers = L;
    out->n_resident = resident;
    out->n_streamed = L - resident;
    out->ring_bytes = ring;
    out->piece_bytes = ring ? largest_piece(in, resident) : 0;
    out->kv_tokens = auto_kv ? kv : 0;
    out->kv_seq_split = auto_kv && kv < seq;
    out->kv_bytes = (uint64_t)out->kv_tokens * kvt;
    if (auto_kv && resident < L && kv < kv_max && in->kv_ext_max > 0) {
        int64_t ext = kv_max - kv;
        if (ext > in->kv_ext_max) ext = in->kv_ext_max / blk * blk;
        out->kv_ext_tokens = ext;
        out->kv_ext_bytes = (uint64_t)ext * kvt;
        out->kv_ext_host = in->kv_ext_host;
        out->host_map_bytes = host_map(in, out->kv_ext_bytes); /* (at most ext_map) */
    }
    /* what the plan costs: the extension's page tables as they are, not as kept aside */
    total = total - (base - base0) + out->host_map_bytes;
    out->host_map_bytes += host_layers_map(in, resident);
    out->kv_swa_bytes = in->kv_swa_bytes;
    out->kv_swa_tokens = in->kv_swa_tokens;
    out->bytes_total = total;
    double t_link = in->h2d_bytes_per_s > 0 ? (double)streamed_bytes / in->h2d_bytes_per_s : 0;
    double t_hbm = in->hbm_bytes_per_s > 0 ? ((double)all_bytes + in->head_bytes) / in->hbm_bytes_per_s : 0;
    out->predicted_step_s = t_link > t_hbm ? t_link : t_hbm;
    return FERRY_OK;
}

void device_map_free(struct device_map *m)
{
    if (!m) return;
    free(m->where);
    free(m->stream_only);
    free(m->cpu_only);
    memset(m, 0, sizeof *m);
}

int device_map_format(const struct device_map *m, char *buf, size_t cap)
{
    size_t n = 0;
#define EMIT(...)                                                                                            \
    do {                                                                                                     \
        int w_ = snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0, __VA_ARGS__);                    \
        if (w_ > 0) n += (size_t)w_;                                                                         \
    } while (0)
    char ring[64] = "no ring";
    if (m->ring_bytes)
        snprintf(ring, sizeof ring, "a ring of %.1f MiB (pieces up to %.1f MiB)", m->ring_bytes / 1048576.0,
                 m->piece_bytes / 1048576.0);
    char least[32];
    size_str(least, sizeof least, m->bytes_minimum, 1);
    EMIT("device_map: %d layers resident, %d in host memory, %s; %.2f GiB in use (minimum %s); "
         "predicted batch-1 step when streaming %.2f ms\n",
         m->n_resident, m->n_streamed, ring, m->bytes_total / GIB, least, m->predicted_step_s * 1e3);
    if (m->kv_tokens)
        EMIT("  KV pool sized to the budget: %lld positions (%.2f GiB)\n", (long long)m->kv_tokens,
             m->kv_bytes / GIB);
    if (m->kv_swa_bytes)
        EMIT("  sliding-window layers' own KV pool: %lld positions (%.2f GiB), each sequence's window\n",
             (long long)m->kv_swa_tokens, m->kv_swa_bytes / GIB);
    if (m->kv_seq_split)
        EMIT("  the device holds fewer positions than one --ctx-size sequence: a longer sequence's later "
             "positions live in the extension below (resident layers took the room)\n");
    if (m->kv_ext_tokens)
        EMIT("  KV pool extension in host memory: %lld positions (%.2f GiB), used when the device's are all "
             "taken; %s\n",
             (long long)m->kv_ext_tokens, m->kv_ext_bytes / GIB,
             m->kv_ext_host ? "decode tokens' attention over them runs on the host's cores"
                            : "the device reads them over the link");
    if (m->n_stream_only)
        EMIT("  %d of the host layers always stream: the host's cores cannot compute them (a recurrent "
             "layer's state lives on the device)\n",
             m->n_stream_only);
    if (m->n_cpu_only)
        EMIT("  %d of the host layers are computed by the host's cores on every step, never streamed "
             "(recurrent "
             "layers: their state lives in host memory)\n",
             m->n_cpu_only);
    if (m->state_bytes)
        EMIT("  recurrent state on the device: %.1f MiB (the device's recurrent layers, every slot)\n",
             m->state_bytes / 1048576.0);
    if (m->moe_layers && m->cpu_moe)
        EMIT("  experts: those of layers 0-%d in host memory, computed by the host's cores%s; of %d layers "
             "resident\n",
             m->cpu_moe - 1, m->expert_cache_bytes ? " or cached on the device" : "",
             m->moe_layers - m->cpu_moe);
    if (m->moe_layers && m->expert_cache_bytes)
        EMIT("  expert cache: %.1f MiB of slots for the host layers' most used experts\n",
             m->expert_cache_bytes / 1048576.0);
    else if (m->moe_layers && !m->cpu_moe)
        EMIT("  experts: all resident\n");
        /* (a host layer the host's cores compute on every step: "host, cpu") */
#define KIND(i) (m->where[i] == PLACEMENT_GPU ? 0 : m->cpu_only && m->cpu_only[i] ? 2 : 1)
    for (int i = 0; i < m->n_layers;) {
        int j = i;
        while (j + 1 < m->n_layers && KIND(j + 1) == KIND(i)) j++;
        EMIT("  layers %3d-%-3d %s\n", i, j, KIND(i) == 0 ? "gpu" : KIND(i) == 2 ? "host, cpu" : "host");
        i = j + 1;
    }
#undef KIND
#undef EMIT
    return (int)n;
}
