/* step_plan — per-step placement of host layers (see step_plan.h). */
#include "runtime/step_plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/ring.h"

#define SIM_STEPS 3 /* steady state: the last of three identical steps (the first has nothing prefetched) */

double step_cost_cpu_layer(const struct step_cost *c, uint64_t bytes, int m)
{
    if (c->n_cpu <= 0 || c->cpu_ref_bytes == 0) return INFINITY;
    const int n = c->n_cpu;
    double t;
    if (m <= c->cpu_m[0]) {
        t = c->cpu_s[0];
    } else if (m >= c->cpu_m[n - 1]) {
        /* Past the largest measured size the host is compute bound: time grows with m. */
        t = c->cpu_s[n - 1] * m / c->cpu_m[n - 1];
    } else {
        int i = 1;
        while (c->cpu_m[i] < m) i++;
        const double a = (double)(m - c->cpu_m[i - 1]) / (c->cpu_m[i] - c->cpu_m[i - 1]);
        t = c->cpu_s[i - 1] + a * (c->cpu_s[i] - c->cpu_s[i - 1]);
    }
    return t * (double)bytes / (double)c->cpu_ref_bytes;
}

static double gpu_layer(const struct step_plan_input *in, int l, int m)
{
    const struct step_cost *c = &in->cost;
    const double mem = c->hbm > 0 ? (double)in->layer_bytes[l] / c->hbm : 0;
    const double math = c->gpu_flops > 0 ? 2.0 * (double)in->layer_params[l] * m / c->gpu_flops : 0;
    return c->gpu_layer_s + (mem > math ? mem : math);
}

/* Bytes of piece p of layer l (the whole layer when the input gives no pieces). */
static uint64_t piece_of(const struct step_plan_input *in, int l, int p)
{
    return in->piece_bytes ? in->piece_bytes[(size_t)l * in->n_pieces + p] : in->layer_bytes[l];
}

/* The copies of the simulated steps: where each lies in the ring, when its use ended. */
struct sim_copy {
    uint64_t off, bytes;
    double release;
};

double step_plan_simulate(const struct step_plan_input *in, const enum placement *where, int m)
{
    const struct step_cost *c = &in->cost;
    const int L = in->n_layers, np = in->piece_bytes ? in->n_pieces : 1;
    int S = 0, any_cpu = 0;
    for (int l = 0; l < L; l++) {
        S += where[l] == PLACEMENT_STREAM;
        any_cpu += where[l] == PLACEMENT_CPU;
    }
    const double pace = in->pace && any_cpu ? step_pace_expect(in->pace, any_cpu) : 1.0;
    /* the bytes the streamed pieces rotate through: what the parked layers leave of the ring */
    const uint64_t cap = step_plan_park_layout(in->ring_bytes, in->layer_bytes, where, L, NULL);
    if ((S && (cap == 0 || np <= 0)) || cap == UINT64_MAX) return INFINITY;
    /* The link shares host memory with the CPU's layers. It ran at h2d_loaded beside layers of one token
     * (the host reading its weights as fast as it can); at m tokens the host reads them t(1)/t(m) as fast,
     * and the link loses that share of the difference (a prompt's layers on AMX tiles barely touch it). */
    double h2d = c->h2d;
    if (any_cpu && c->h2d_loaded > 0) {
        const double t1 = step_cost_cpu_layer(c, c->cpu_ref_bytes, 1),
                     tm = step_cost_cpu_layer(c, c->cpu_ref_bytes, m);
        const double share = tm > 0 && tm > t1 ? t1 / tm : 1.0;
        h2d = c->h2d_loaded + (c->h2d - c->h2d_loaded) * (1.0 - share);
    }
    struct sim_copy *cp = NULL;
    if (S && !(cp = malloc(sizeof *cp * (size_t)S * (size_t)np * SIM_STEPS))) return INFINITY;
    const double xfer = c->h2d > 0 ? 1.0 / c->h2d : 0;
    double t = 0, link = 0, end[SIM_STEPS];
    int u = 0;
    for (int r = 0; r < SIM_STEPS; r++) {
        t += c->step_s;
        for (int l = 0; l < L; l++) {
            switch (where[l]) {
            case PLACEMENT_GPU:
            case PLACEMENT_PARK: /* (copied once: the prediction is of steps that follow each other) */
                t += gpu_layer(in, l, m);
                break;
            case PLACEMENT_STREAM: {
                const double dev = gpu_layer(in, l, m);
                for (int p = 0; p < np; p++) {
                    const uint64_t b = piece_of(in, l, p);
                    if (b == 0) continue; /* (a layer with fewer pieces) */
                    if (b > cap) {
                        free(cp);
                        return INFINITY;
                    }
                    cp[u].bytes = b;
                    cp[u].off = u ? ring_place(cap, cp[u - 1].off + cp[u - 1].bytes, b) : 0;
                    /* A copy runs once the uses of the copies it overwrites are done (and at most
                     * RING_MAX_WAIT wait), in use order on the one copy stream. */
                    double start = link;
                    for (int j = u - 1; j >= 0 && j > u - RING_HISTORY; j--)
                        if (cp[j].off < cp[u].off + b && cp[u].off < cp[j].off + cp[j].bytes &&
                            cp[j].release > start)
                            start = cp[j].release;
                    if (u >= RING_MAX_WAIT && cp[u - RING_MAX_WAIT].release > start)
                        start = cp[u - RING_MAX_WAIT].release;
                    link = start + (h2d > 0 ? (double)b / h2d : 0);
                    if (link > t) t = link;
                    t += in->layer_bytes[l] ? dev * (double)b / (double)in->layer_bytes[l] : dev / np;
                    cp[u++].release = t;
                }
                break;
            }
            case PLACEMENT_CPU:
                if (l == 0 || where[l - 1] != PLACEMENT_CPU)
                    t += c->sync_s + m * c->run_bytes_per_token * xfer;
                t += pace * step_cost_cpu_layer(c, in->layer_bytes[l], m);
                if (!(in->no_attend && in->no_attend[l])) /* its attention on the device */
                    t += c->sync_s + m * c->layer_bytes_per_token * xfer;
                break;
            }
        }
        t += c->hbm > 0 ? (double)in->head_bytes / c->hbm : 0;
        end[r] = t;
    }
    free(cp);
    return end[SIM_STEPS - 1] - end[SIM_STEPS - 2];
}

/* 1 when host layer l runs on the CPU on every step (CPU-only). */
static int cpu_fixed(const struct step_plan_input *in, int l)
{
    return in->where[l] != PLACEMENT_GPU && in->cpu_only && in->cpu_only[l];
}

/* 1 when host layer l may run on the CPU or stream, step by step (neither stream-only nor CPU-only). */
static int computable(const struct step_plan_input *in, int l)
{
    return in->where[l] != PLACEMENT_GPU && !(in->stream_only && in->stream_only[l]) && !cpu_fixed(in, l);
}

/* The device_map's host layers with c of the h computable ones (spread evenly among them) on the CPU, the
 * rest streamed. */
static void assign(const struct step_plan_input *in, int c, int h, enum placement *w)
{
    for (int l = 0, j = 0; l < in->n_layers; l++) {
        if (in->where[l] == PLACEMENT_GPU) {
            w[l] = PLACEMENT_GPU;
            continue;
        }
        if (!computable(in, l)) {
            w[l] = cpu_fixed(in, l) ? PLACEMENT_CPU : PLACEMENT_STREAM;
            continue;
        }
        w[l] = (int64_t)(j + 1) * c / h > (int64_t)j * c / h ? PLACEMENT_CPU : PLACEMENT_STREAM;
        j++;
    }
}

uint64_t step_plan_park_layout(uint64_t ring_bytes, const uint64_t *layer_bytes, const enum placement *where,
                               int n_layers, uint64_t *park_off)
{
    uint64_t end = ring_bytes / RING_ALIGN * RING_ALIGN;
    for (int l = 0; l < n_layers; l++) {
        if (where[l] != PLACEMENT_PARK) continue;
        const uint64_t b = ring_align(layer_bytes[l]);
        if (b == 0 || b > end) return UINT64_MAX;
        end -= b;
        if (park_off) park_off[l] = end;
    }
    return end == ring_bytes / RING_ALIGN * RING_ALIGN ? ring_bytes : end;
}

/* Parks up to k of w's streamed layers (the first ones): as many as leave two of the largest pieces of any
 * host layer (engine.c's step_where may stream a CPU layer of the plan). Returns how many it parked. */
static int park(const struct step_plan_input *in, enum placement *w, int k)
{
    if (in->no_park || in->ring_bytes == 0 || k <= 0) return 0;
    const int np = in->piece_bytes ? in->n_pieces : 1;
    uint64_t piece = 0;
    for (int l = 0; l < in->n_layers; l++) {
        if (in->where[l] == PLACEMENT_GPU || cpu_fixed(in, l)) continue;
        for (int p = 0; p < np; p++)
            if (piece_of(in, l, p) > piece) piece = piece_of(in, l, p);
    }
    const uint64_t room = in->ring_bytes / RING_ALIGN * RING_ALIGN, need = 2 * ring_align(piece);
    if (piece == 0 || room <= need) return 0;
    uint64_t spare = room - need;
    int n = 0;
    for (int l = 0; l < in->n_layers && n < k; l++) {
        if (w[l] != PLACEMENT_STREAM || ring_align(in->layer_bytes[l]) > spare) continue;
        spare -= ring_align(in->layer_bytes[l]);
        w[l] = PLACEMENT_PARK;
        n++;
    }
    return n;
}

/* c of the hc computable host layers on the CPU (assign), the rest of the h host layers streamed, with the
 * number of parked ones that makes the fastest step at m tokens: into w, its time returned (tmp: scratch). */
static double with_parks(const struct step_plan_input *in, int c, int hc, int h, int m, enum placement *w,
                         enum placement *tmp)
{
    assign(in, c, hc ? hc : 1, w);
    double best = step_plan_simulate(in, w, m);
    for (int k = 1; k <= h - c; k++) {
        assign(in, c, hc ? hc : 1, tmp);
        if (park(in, tmp, k) < k) break;
        const double t = step_plan_simulate(in, tmp, m);
        if (t < best) {
            best = t;
            memcpy(w, tmp, sizeof *w * (size_t)in->n_layers);
        }
    }
    return best;
}

static int make_buckets(struct step_plan *out, int n_layers, int max_tokens)
{
    memset(out, 0, sizeof *out);
    if (n_layers <= 0 || max_tokens <= 0) return FERRY_ERR_INVALID;
    int b = 0;
    for (int t = 1;; t *= 2) {
        if (b == STEP_PLAN_MAX_BUCKETS) return FERRY_ERR_INVALID;
        out->tokens[b++] = t < max_tokens ? t : max_tokens;
        if (t >= max_tokens) break;
    }
    out->n_layers = n_layers;
    out->n_buckets = b;
    out->where = malloc(sizeof *out->where * (size_t)b * (size_t)n_layers);
    return out->where ? FERRY_OK : FERRY_ERR_NOMEM;
}

int step_plan_uniform(struct step_plan *out, int n_layers, int max_tokens, enum placement where)
{
    int rc = make_buckets(out, n_layers, max_tokens);
    if (rc) return rc;
    for (int i = 0; i < out->n_buckets * n_layers; i++) out->where[i] = where;
    for (int b = 0; b < out->n_buckets; b++) out->n_cpu[b] = where == PLACEMENT_CPU ? n_layers : 0;
    return FERRY_OK;
}

/* Parses the forced plan of bucket b into w; FERRY_ERR_INVALID when it does not fit the device_map. */
static int forced(const struct step_plan_input *in, int b, enum placement *w, char err[256])
{
    const char *s = in->force;
    for (int i = 0; i < b; i++) {
        const char *slash = strchr(s, '/');
        if (!slash) break;
        s = slash + 1;
    }
    const size_t len = strcspn(s, "/");
    if ((int)len != in->n_layers) {
        snprintf(err, 256, "forced plan '%.*s' has %zu layers, the model %d", (int)len, s, len, in->n_layers);
        return FERRY_ERR_INVALID;
    }
    for (int l = 0; l < in->n_layers; l++) {
        const int host = in->where[l] != PLACEMENT_GPU;
        switch (s[l]) {
        case 'g':
            w[l] = PLACEMENT_GPU;
            break;
        case 's':
            w[l] = PLACEMENT_STREAM;
            break;
        case 'c':
            w[l] = PLACEMENT_CPU;
            break;
        case 'p':
            w[l] = PLACEMENT_PARK;
            break;
        default:
            snprintf(err, 256, "forced plan: '%c' at layer %d is not g, s, c or p", s[l], l);
            return FERRY_ERR_INVALID;
        }
        const int ringed = w[l] == PLACEMENT_STREAM || w[l] == PLACEMENT_PARK;
        if (host && cpu_fixed(in, l) && w[l] != PLACEMENT_CPU) {
            snprintf(
                err, 256,
                "forced plan: layer %d must be 'c' (the host's cores compute it on every step: its state "
                "lives in host memory)",
                l);
            return FERRY_ERR_INVALID;
        }
        if (w[l] == PLACEMENT_CPU && host && !computable(in, l) && !cpu_fixed(in, l)) {
            snprintf(err, 256,
                     "forced plan: layer %d cannot be 'c' (the host's cores cannot compute it: it streams)",
                     l);
            return FERRY_ERR_INVALID;
        }
        if (host != (w[l] != PLACEMENT_GPU) || (ringed && in->ring_bytes == 0)) {
            snprintf(err, 256, "forced plan: layer %d cannot be '%c' (it is %s)", l, s[l],
                     host ? (in->ring_bytes ? "in host memory" : "in host memory, with no ring")
                          : "resident");
            return FERRY_ERR_INVALID;
        }
    }
    /* the streamed pieces must fit what the parked layers leave */
    const uint64_t cap = step_plan_park_layout(in->ring_bytes, in->layer_bytes, w, in->n_layers, NULL);
    const int np = in->piece_bytes ? in->n_pieces : 1;
    uint64_t largest = 0;
    for (int l = 0; l < in->n_layers; l++)
        for (int p = 0; p < np && w[l] == PLACEMENT_STREAM; p++)
            if (piece_of(in, l, p) > largest) largest = piece_of(in, l, p);
    if (cap == UINT64_MAX || largest > cap) {
        snprintf(err, 256, "forced plan: the parked layers do not fit the ring beside the streamed pieces");
        return FERRY_ERR_INVALID;
    }
    return FERRY_OK;
}

int step_plan_make(const struct step_plan_input *in, struct step_plan *out, char err[256])
{
    int rc = make_buckets(out, in->n_layers, in->max_tokens);
    if (rc) {
        snprintf(err, 256, "invalid step plan request (%d layers, %d tokens)", in->n_layers, in->max_tokens);
        return rc;
    }
    const int L = in->n_layers;
    int h = 0, hc = 0, hf = 0; /* host layers; of them, computable ones and CPU-only ones */
    for (int l = 0; l < L; l++)
        h += in->where[l] != PLACEMENT_GPU, hc += computable(in, l), hf += cpu_fixed(in, l);
    for (int l = 0; l < L && in->stream_only && in->cpu_only; l++)
        if (in->stream_only[l] && in->cpu_only[l]) {
            snprintf(err, 256, "invalid step plan request: layer %d both stream-only and CPU-only", l);
            step_plan_free(out);
            return FERRY_ERR_INVALID;
        }
    if (h > hc + hf && in->ring_bytes == 0) {
        snprintf(err, 256, "invalid step plan request: %d host layers stream only, and there is no ring",
                 h - hc - hf);
        step_plan_free(out);
        return FERRY_ERR_INVALID;
    }
    h -= hf; /* (the host layers that may stream) */
    enum placement *trial = malloc(sizeof *trial * (size_t)L * 3), *streamed = trial + L,
                   *tmp = trial + 2 * L;
    if (!trial) {
        step_plan_free(out);
        return FERRY_ERR_NOMEM;
    }
    for (int b = 0; b < out->n_buckets && !rc; b++) {
        const int m = out->tokens[b];
        enum placement *w = out->where + (size_t)b * L;
        if (in->ring_bytes > 0) out->stream_s[b] = with_parks(in, 0, hc, h, m, streamed, tmp);
        if (in->force) {
            rc = forced(in, b, w, err);
        } else if (in->mode == STEP_MODE_STREAM && in->ring_bytes > 0) {
            memcpy(w, streamed, sizeof *w * (size_t)L);
        } else if (in->mode == STEP_MODE_CPU || in->ring_bytes == 0 || hc == 0) {
            assign(in, hc, hc ? hc : 1, w);
        } else {
            /* AUTO: the fastest c; more host layers only when they beat streaming all of them by the margin.
             */
            double best = out->stream_s[b];
            memcpy(w, streamed, sizeof *w * (size_t)L);
            for (int c = 1; c <= hc; c++) {
                const double t = with_parks(in, c, hc, h, m, trial, tmp);
                if (t < best && t < out->stream_s[b] * (1.0 - in->margin)) {
                    best = t;
                    memcpy(w, trial, sizeof *w * (size_t)L);
                }
            }
            /* The plan in use stays unless the choice beats it, both at their expected paces, by the margin:
             * a pace judged between two counts must not flip the plan to and fro. */
            const struct step_plan *k = in->keep;
            if (k && k->n_layers == L && k->n_buckets == out->n_buckets && k->tokens[b] == m) {
                const enum placement *kw = k->where + (size_t)b * L;
                const double t_keep = step_plan_simulate(in, kw, m);
                if (isfinite(t_keep) && !(best < t_keep * (1.0 - STEP_PACE_KEEP)))
                    memcpy(w, kw, sizeof *w * (size_t)L);
            }
        }
        if (rc) break;
        const double t = step_plan_simulate(in, w, m);
        out->predicted_s[b] = isfinite(t) ? t : 0;
        if (!isfinite(out->stream_s[b])) out->stream_s[b] = 0;
        for (int l = 0; l < L; l++) {
            out->n_cpu[b] += w[l] == PLACEMENT_CPU;
            out->n_stream[b] += w[l] == PLACEMENT_STREAM || w[l] == PLACEMENT_PARK;
            out->n_park[b] += w[l] == PLACEMENT_PARK;
        }
    }
    free(trial);
    if (rc) step_plan_free(out);
    return rc;
}

void step_plan_free(struct step_plan *p)
{
    if (!p) return;
    free(p->where);
    memset(p, 0, sizeof *p);
}

int step_plan_bucket(const struct step_plan *p, int n_tokens)
{
    int b = 0;
    while (b + 1 < p->n_buckets && p->tokens[b] < n_tokens) b++;
    return b;
}

double step_plan_workload_s(const struct step_plan *p, int n_seqs, int prompt, int gen)
{
    if (p->n_buckets <= 0 || n_seqs <= 0 || prompt < 0 || gen < 0) return 0;
    const int big = p->tokens[p->n_buckets - 1];
    const int64_t total = (int64_t)n_seqs * prompt, full = total / big, rest = total % big;
    const double t_big = p->predicted_s[p->n_buckets - 1];
    const double t_rest = rest ? p->predicted_s[step_plan_bucket(p, (int)rest)] : 0;
    const double t_dec = p->predicted_s[step_plan_bucket(p, n_seqs)];
    if ((full && t_big <= 0) || (rest && t_rest <= 0) || (gen && t_dec <= 0)) return 0;
    /* more sequences than the largest step decode in several steps */
    const int64_t dec_steps = (int64_t)gen * ((n_seqs + big - 1) / big);
    return (double)full * t_big + t_rest + (double)dec_steps * t_dec;
}

const enum placement *step_plan_where(const struct step_plan *p, int n_tokens)
{
    return p->where + (size_t)step_plan_bucket(p, n_tokens) * p->n_layers;
}

int step_plan_format(const struct step_plan *p, char *buf, size_t cap)
{
    size_t n = 0;
#define EMIT(...)                                                                                            \
    do {                                                                                                     \
        int w_ = snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0, __VA_ARGS__);                    \
        if (w_ > 0) n += (size_t)w_;                                                                         \
    } while (0)
    EMIT("step plan (per step size: host layers computed by the CPU / streamed; predicted step time):\n");
    for (int b = 0; b < p->n_buckets; b++) {
        EMIT("  %5d tokens: %2d cpu, %2d stream", p->tokens[b], p->n_cpu[b], p->n_stream[b]);
        if (p->n_park[b]) EMIT(" (%d of them parked)", p->n_park[b]);
        if (p->predicted_s[b] > 0) EMIT("; predicted %.2f ms", p->predicted_s[b] * 1e3);
        if (p->stream_s[b] > 0 && p->n_cpu[b]) EMIT(" (streaming all: %.2f ms)", p->stream_s[b] * 1e3);
        EMIT("\n");
    }
    const int show[2] = {0, p->n_buckets - 1};
    for (int i = 0; i < (p->n_buckets > 1 ? 2 : 1); i++) {
        EMIT("  layers at %d tokens: ", p->tokens[show[i]]);
        for (int l = 0; l < p->n_layers; l++) {
            const enum placement w = p->where[(size_t)show[i] * p->n_layers + l];
            EMIT("%c", w == PLACEMENT_GPU      ? 'g'
                       : w == PLACEMENT_STREAM ? 's'
                       : w == PLACEMENT_PARK   ? 'p'
                                               : 'c');
        }
        EMIT("\n");
    }
#undef EMIT
    return (int)n;
}

void step_pace_init(struct step_pace *p)
{
    memset(p, 0, sizeof *p);
    p->pace = p->base = 1.0;
    for (int i = 0; i < STEP_PACE_SLOTS; i++) p->slot[i].n_cpu = -1;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double clamp_pace(double x)
{
    return x < STEP_PACE_MIN ? STEP_PACE_MIN : x > STEP_PACE_MAX ? STEP_PACE_MAX : x;
}

double step_pace_expect(const struct step_pace *p, int n_cpu)
{
    const int k = n_cpu < 1 ? 1 : n_cpu >= STEP_PACE_KEYS ? STEP_PACE_KEYS - 1 : n_cpu;
    if (p->seen[k] > 0) return p->seen[k];
    int lo = k - 1, hi = k + 1;
    while (lo >= 1 && !(p->seen[lo] > 0)) lo--;
    while (hi < STEP_PACE_KEYS && !(p->seen[hi] > 0)) hi++;
    if (lo < 1) return p->base; /* below every count seen */
    if (hi == STEP_PACE_KEYS) return p->seen[lo];
    return p->seen[lo] + (p->seen[hi] - p->seen[lo]) * (double)(k - lo) / (double)(hi - lo);
}

int step_pace_observe(struct step_pace *p, int n_cpu, double seconds, double lo, double hi)
{
    if (n_cpu < 1 || !(seconds > 0) || !(lo > 0) || !(hi >= lo) || !isfinite(seconds) || !isfinite(hi))
        return 0;
    const int key = n_cpu < STEP_PACE_KEYS ? n_cpu : STEP_PACE_KEYS - 1;
    /* the slot of this count, else the one unused longest */
    int s = 0;
    for (int i = 0; i < STEP_PACE_SLOTS; i++) {
        if (p->slot[i].n_cpu == key) {
            s = i;
            break;
        }
        if (p->slot[i].used < p->slot[s].used) s = i;
    }
    if (p->slot[s].n_cpu != key) {
        p->slot[s].n_cpu = key;
        p->slot[s].n = 0;
    }
    p->slot[s].used = ++p->clock;
    double *r = p->slot[s].ratio;
    if (p->slot[s].n == STEP_PACE_WINDOW) {
        memmove(r, r + 1, sizeof r[0] * (STEP_PACE_WINDOW - 1));
        p->slot[s].n--;
    }
    r[p->slot[s].n++] = seconds < lo ? seconds / lo : seconds > hi ? seconds / hi : 1.0;
    if (p->slot[s].n < STEP_PACE_WINDOW) return 0;
    double sorted[STEP_PACE_WINDOW];
    memcpy(sorted, r, sizeof sorted);
    qsort(sorted, STEP_PACE_WINDOW, sizeof sorted[0], cmp_double);
    const double med = clamp_pace(sorted[STEP_PACE_WINDOW / 2]);
    const double was = p->seen[key];
    const double ref = was > 0 ? was : step_pace_expect(p, key);
    if (med <= ref * STEP_PACE_BAND && med >= ref / STEP_PACE_BAND) {
        /* inside the band: the expectation holds (a first judgement confirms it for this count) */
        p->seen[key] = ref;
        p->pace = ref;
        return 0;
    }
    if (was > 0) { /* a count seen before moved: the host changed, for every count */
        for (int i = 1; i < STEP_PACE_KEYS; i++)
            if (p->seen[i] > 0) p->seen[i] = clamp_pace(p->seen[i] * med / was);
        p->base = clamp_pace(p->base * med / was);
    } else {
        /* Fewer CPU layers than any seen, tried on the base's word and found off it: fewer still are
         * expected at their pace. (The first count ever judged leaves the base: that one may be slow for
         * its own count.) */
        int below = 0, above = 0;
        for (int i = 1; i < STEP_PACE_KEYS; i++)
            if (i != key && p->seen[i] > 0) below |= i<key, above |= i> key;
        if (!below && above) p->base = med;
    }
    p->seen[key] = med;
    p->pace = med;
    p->slot[s].n = 0;
    return 1;
}

int step_plan_ext_shift(double cpu_s, double stream_s, double attn_bytes, double rate, int n_cpu)
{
    if (!(attn_bytes > 0) || !(rate > 0) || !(stream_s > 0) || n_cpu <= 0) return 0;
    const double t_a = attn_bytes / rate;
    int best = 0;
    double best_s = cpu_s + t_a;
    for (int j = 1; j <= n_cpu; j++) {
        const double f = (double)j / n_cpu;
        const double link = cpu_s + (stream_s - cpu_s) * f, host = cpu_s * (1.0 - f) + t_a;
        const double s = link > host ? link : host;
        if (s < best_s) best = j, best_s = s;
    }
    return best;
}

struct step_cost step_cost_paced(const struct step_cost *c, double pace)
{
    struct step_cost r = *c;
    for (int i = 0; i < r.n_cpu; i++) r.cpu_s[i] *= pace;
    return r;
}
