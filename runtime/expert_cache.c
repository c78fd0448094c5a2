/* expert_cache — the device expert cache's policy (see expert_cache.h). */
#include "runtime/expert_cache.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

struct ec_layer {
    int slots;
    int32_t *slot_of;   /* (n_expert) the slot holding each expert, or -1 */
    int32_t *expert_of; /* (slots) the expert in each slot, or -1 */
    double *score;      /* (n_expert) steps that chose it, decayed per step of this layer */
    uint64_t *last;     /* (n_expert) the layer step that last chose it (0: never) */
    uint64_t stamp;     /* this layer's steps so far */
};

struct expert_cache {
    int n_layers, n_expert, can_stream;
    double decay, fetch_s;
    double call_s, busy;   /* the host call's fixed seconds; its slow-down while copies run */
    struct step_cost cost; /* cpu_s less call_s: an expert's share of a host call */
    uint64_t *ebytes;      /* (n_layers) */
    struct ec_layer *L;
    /* One decision's arrays (n_expert each), lent to the caller through struct expert_plan. */
    uint8_t *where;
    int32_t *slot, *fetch, *rows, *miss, *victim;
    int sort_layer; /* the layer whose misses and victims are being sorted */
    struct expert_cache_stats st;
};

void expert_cache_free(struct expert_cache *c)
{
    if (!c) return;
    for (int l = 0; c->L && l < c->n_layers; l++) {
        free(c->L[l].slot_of);
        free(c->L[l].expert_of);
        free(c->L[l].score);
        free(c->L[l].last);
    }
    free(c->L);
    free(c->ebytes);
    free(c->where);
    free(c->slot);
    free(c->fetch);
    free(c->rows);
    free(c->miss);
    free(c->victim);
    free(c);
}

int expert_cache_init(struct expert_cache **out, const struct expert_cache_params *p)
{
    *out = NULL;
    if (p->n_layers < 1 || p->n_expert < 1 || !p->slots || !p->expert_bytes || !(p->decay >= 0) ||
        !(p->decay < 1))
        return FERRY_ERR_INVALID;
    for (int l = 0; l < p->n_layers; l++)
        if (p->slots[l] < 0) return FERRY_ERR_INVALID;
    struct expert_cache *c = calloc(1, sizeof *c);
    if (!c) return FERRY_ERR_NOMEM;
    const size_t E = (size_t)p->n_expert;
    c->n_layers = p->n_layers, c->n_expert = p->n_expert, c->can_stream = p->can_stream;
    c->decay = p->decay, c->fetch_s = p->fetch_s, c->cost = p->cost;
    c->call_s = p->cost.n_cpu > 0 ? expert_cache_call_s(p->cost.cpu_s[0], p->host_set_s, p->host_set_n) : 0;
    for (int i = 0; i < c->cost.n_cpu && i < STEP_COST_MAX_M; i++)
        c->cost.cpu_s[i] = fmax(0, c->cost.cpu_s[i] - c->call_s);
    c->busy = p->host_busy > 1 ? p->host_busy : 1;
    c->ebytes = malloc((size_t)p->n_layers * sizeof *c->ebytes);
    c->L = calloc((size_t)p->n_layers, sizeof *c->L);
    c->where = malloc(E);
    c->slot = malloc(E * sizeof *c->slot);
    c->fetch = malloc(E * sizeof *c->fetch);
    c->rows = malloc(E * sizeof *c->rows);
    c->miss = malloc(E * sizeof *c->miss);
    c->victim = malloc(E * sizeof *c->victim);
    if (!c->ebytes || !c->L || !c->where || !c->slot || !c->fetch || !c->rows || !c->miss || !c->victim)
        goto nomem;
    for (int l = 0; l < p->n_layers; l++) {
        struct ec_layer *y = &c->L[l];
        c->ebytes[l] = p->expert_bytes[l];
        y->slots = p->slots[l] < p->n_expert ? p->slots[l] : p->n_expert;
        y->slot_of = malloc(E * sizeof *y->slot_of);
        y->expert_of = malloc(((size_t)y->slots + 1) * sizeof *y->expert_of);
        y->score = calloc(E, sizeof *y->score);
        y->last = calloc(E, sizeof *y->last);
        if (!y->slot_of || !y->expert_of || !y->score || !y->last) goto nomem;
        /* The start-up residency: experts 0, 1, ... in slots 0, 1, ..., none of them scored yet. */
        for (int e = 0; e < p->n_expert; e++) y->slot_of[e] = e < y->slots ? e : -1;
        for (int s = 0; s < y->slots; s++) y->expert_of[s] = s;
        if (y->slots) c->st.layers++, c->st.slots += y->slots;
    }
    *out = c;
    return FERRY_OK;
nomem:
    expert_cache_free(c);
    return FERRY_ERR_NOMEM;
}

int expert_cache_slots(const struct expert_cache *c, int l)
{
    return c && l >= 0 && l < c->n_layers ? c->L[l].slots : 0;
}

int expert_cache_slot_expert(const struct expert_cache *c, int l, int s)
{
    if (!c || l < 0 || l >= c->n_layers || s < 0 || s >= c->L[l].slots) return -1;
    return c->L[l].expert_of[s];
}

void expert_cache_set_slot_bytes(struct expert_cache *c, uint64_t bytes)
{
    if (c) c->st.slot_bytes = bytes;
}

void expert_cache_stats(const struct expert_cache *c, struct expert_cache_stats *st)
{
    if (c)
        *st = c->st;
    else
        memset(st, 0, sizeof *st);
}

/* The order misses are placed in: most rows first (their host time is largest), then the higher score, then
 * the lower id. */
static int miss_cmp(const void *a, const void *b, void *arg)
{
    const struct expert_cache *c = arg;
    const struct ec_layer *y = &c->L[c->sort_layer];
    const int s = *(const int32_t *)a, t = *(const int32_t *)b;
    if (c->rows[s] != c->rows[t]) return c->rows[s] > c->rows[t] ? -1 : 1;
    if (y->score[s] != y->score[t]) return y->score[s] > y->score[t] ? -1 : 1;
    return s < t ? -1 : 1;
}

/* Victims in eviction order: empty slots first, then the lowest score, the least recently chosen, the lowest
 * slot. */
static int victim_cmp(const void *a, const void *b, void *arg)
{
    const struct expert_cache *c = arg;
    const struct ec_layer *y = &c->L[c->sort_layer];
    const int s = *(const int32_t *)a, t = *(const int32_t *)b;
    const int es = y->expert_of[s], et = y->expert_of[t];
    if ((es < 0) != (et < 0)) return es < 0 ? -1 : 1;
    if (es >= 0) {
        if (y->score[es] != y->score[et]) return y->score[es] < y->score[et] ? -1 : 1;
        if (y->last[es] != y->last[et]) return y->last[es] < y->last[et] ? -1 : 1;
    }
    return s < t ? -1 : 1;
}

int expert_cache_decide(struct expert_cache *c, int l, const int32_t *ids, int n_ids, struct expert_plan *out)
{
    memset(out, 0, sizeof *out);
    if (!c || l < 0 || l >= c->n_layers || n_ids < 1 || !ids) return FERRY_ERR_INVALID;
    const int E = c->n_expert;
    for (int p = 0; p < n_ids; p++)
        if (ids[p] < 0 || ids[p] >= E) return FERRY_ERR_RANGE;
    struct ec_layer *y = &c->L[l];
    memset(c->rows, 0, (size_t)E * sizeof *c->rows);
    for (int p = 0; p < n_ids; p++) c->rows[ids[p]]++;
    y->stamp++;
    int n_miss = 0;
    for (int e = 0; e < E; e++) {
        y->score[e] *= c->decay;
        c->where[e] = EXPERT_NONE;
        c->slot[e] = -1;
        if (!c->rows[e]) continue;
        y->score[e] += 1;
        y->last[e] = y->stamp;
        out->n_chosen++;
        if (y->slot_of[e] >= 0) {
            c->where[e] = EXPERT_HIT;
            c->slot[e] = y->slot_of[e];
            out->n_hit++;
        } else {
            c->miss[n_miss++] = e;
        }
    }
    int n_victim = 0;
    for (int s = 0; s < y->slots; s++)
        if (y->expert_of[s] < 0 || c->where[y->expert_of[s]] != EXPERT_HIT) c->victim[n_victim++] = s;
    c->sort_layer = l;
    qsort_r(c->miss, (size_t)n_miss, sizeof *c->miss, miss_cmp, c);
    qsort_r(c->victim, (size_t)n_victim, sizeof *c->victim, victim_cmp, c);

    /* The misses the slots admit, in order, each against its victim: a fetch's link time counts over 1 + the
     * score it brings beyond its victim's only when its score before this step shows recent use. */
    const struct step_cost *k = &c->cost;
    const double bytes = (double)c->ebytes[l];
    const double link_one = c->fetch_s + (k->h2d > 0 ? bytes / k->h2d : INFINITY);
    const double dev_one = k->hbm > 0 ? bytes / k->hbm : 0;
    int v = 0, n_cand = 0;
    double host_rest = 0; /* the shares of the misses no slot admits */
    for (int i = 0; i < n_miss; i++) {
        const int e = c->miss[i];
        const int old = v < n_victim ? y->expert_of[c->victim[v]] : -1;
        const double vs = old >= 0 ? y->score[old] : 0;
        if (v < n_victim && (old < 0 || y->score[e] >= vs)) {
            c->where[e] = EXPERT_FETCH; /* a candidate, for now */
            c->slot[e] = c->victim[v++];
            c->fetch[n_cand++] = e;
        } else {
            c->where[e] = EXPERT_HOST;
            host_rest += step_cost_cpu_layer(k, c->ebytes[l], c->rows[e]);
        }
    }
    /* The leading j candidates fetched, the rest on the host: the j that ends the step soonest (ties: more
     * fetches). The device's products follow the copies; the host's one call runs beside them. */
    const int n_rest = out->n_chosen - out->n_hit - n_cand;
    double best = INFINITY, link_eff = 0, best_host = 0;
    int n_fetch = 0;
    for (int j = 0; j <= n_cand; j++) {
        if (j) {
            const int e = c->fetch[j - 1], old = y->expert_of[c->slot[e]];
            const double gain = y->score[e] - 1 >= EXPERT_CACHE_REUSE
                                    ? fmax(0, y->score[e] - (old >= 0 ? y->score[old] : 0))
                                    : 0;
            link_eff += link_one / (1 + gain);
        }
        double share = host_rest;
        for (int i = j; i < n_cand; i++) share += step_cost_cpu_layer(k, c->ebytes[l], c->rows[c->fetch[i]]);
        const double host_j =
            n_rest + n_cand - j > 0 ? k->sync_s + (c->call_s + share) * (j ? c->busy : 1) : 0;
        const double end = fmax(link_eff + dev_one * (out->n_hit + j), host_j);
        if (end <= best) best = end, n_fetch = j, best_host = host_j;
    }
    for (int i = n_fetch; i < n_cand; i++) { /* the candidates left to the host */
        c->where[c->fetch[i]] = EXPERT_HOST;
        c->slot[c->fetch[i]] = -1;
    }
    out->n_host = n_rest + n_cand - n_fetch;
    out->n_fetch = n_fetch;
    const double link = n_fetch ? n_fetch * link_one : 0;
    out->link_s = link, out->host_s = best_host;
    out->predicted_s = fmax(link + dev_one * (out->n_hit + n_fetch), best_host);
    /* Misses beyond what the slots took: streaming them all may beat the host's cores. */
    if (c->can_stream && out->n_host) {
        const double link_all = n_miss * link_one, stream_s = link_all + dev_one * out->n_chosen;
        if (stream_s < out->predicted_s) {
            for (int e = 0; e < E; e++) {
                c->slot[e] = -1;
                if (c->where[e] != EXPERT_NONE) c->where[e] = EXPERT_STREAM;
            }
            out->stream = 1;
            out->n_stream = out->n_chosen;
            out->n_hit = out->n_fetch = out->n_host = 0;
            out->fetch_bytes = (uint64_t)n_miss * c->ebytes[l];
            out->link_s = link_all, out->host_s = 0, out->predicted_s = stream_s;
            n_fetch = 0;
        }
    }
    for (int i = 0; i < n_fetch; i++) { /* the cache as the copies leave it */
        const int e = c->fetch[i], s = c->slot[e], old = y->expert_of[s];
        if (old >= 0) y->slot_of[old] = -1;
        y->expert_of[s] = e;
        y->slot_of[e] = s;
    }
    if (!out->stream) out->fetch_bytes = (uint64_t)n_fetch * c->ebytes[l];
    out->where = c->where, out->slot = c->slot, out->fetch = c->fetch, out->rows = c->rows;
    struct expert_cache_stats *st = &c->st;
    st->steps++;
    st->chosen += (uint64_t)out->n_chosen;
    st->hits += (uint64_t)out->n_hit;
    st->fetches += (uint64_t)out->n_fetch;
    st->host += (uint64_t)out->n_host;
    st->streamed += (uint64_t)out->n_stream;
    if (out->stream)
        st->stream_bytes += out->fetch_bytes;
    else
        st->fetch_bytes += out->fetch_bytes;
    return FERRY_OK;
}

int expert_plan_pairs(const struct expert_plan *pl, const int32_t *ids, const float *wts, int n_ids, int k,
                      int32_t *slot, int32_t *htok, int32_t *hid, float *hw)
{
    int hn = 0;
    for (int p = 0; p < n_ids; p++) {
        const int e = ids[p];
        if (pl->where[e] == EXPERT_HOST) {
            slot[p] = -1;
            htok[hn] = p / k, hid[hn] = e, hw[hn] = wts[p];
            hn++;
        } else {
            slot[p] = pl->slot[e];
        }
    }
    return hn;
}

double expert_cache_call_s(double one_s, double set_s, int n)
{
    if (n < 2 || !(one_s > 0) || !(set_s > 0) || !isfinite(one_s) || !isfinite(set_s)) return 0;
    const double fixed = one_s - (set_s - one_s) / (n - 1);
    return fixed < 0 ? 0 : fixed > one_s ? one_s : fixed;
}

int expert_cache_split(uint64_t bytes, int n_layers, int n_expert, const uint8_t *host,
                       uint64_t (*slot_bytes)(const void *ctx, int l, int s), const void *ctx, int *slots)
{
    int lo = 0, hi = n_expert > 0 ? n_expert : 0; /* the answer lies in [lo, hi] */
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        uint64_t need = 0;
        for (int l = 0; l < n_layers && need <= bytes; l++)
            if (host[l]) need += slot_bytes(ctx, l, mid);
        if (need <= bytes)
            lo = mid;
        else
            hi = mid - 1;
    }
    for (int l = 0; l < n_layers; l++) slots[l] = host[l] ? lo : 0;
    return lo;
}

int expert_cache_format(const struct expert_cache_stats *st, char *buf, size_t cap)
{
    if (!st->slots) return snprintf(buf, cap, "expert cache: none");
    const double steps = st->steps ? (double)st->steps : 1;
    return snprintf(
        buf, cap,
        "expert cache: %d slots over %d layers (%.1f MiB); %llu layer steps: %.1f%% of %llu chosen "
        "experts hit, %llu fetched (%.2f MiB a layer step), %llu on the host, %llu streamed "
        "(%.2f MiB a layer step)",
        st->slots, st->layers, st->slot_bytes / 1048576.0, (unsigned long long)st->steps,
        st->chosen ? 100.0 * (double)st->hits / (double)st->chosen : 0.0, (unsigned long long)st->chosen,
        (unsigned long long)st->fetches, st->fetch_bytes / 1048576.0 / steps, (unsigned long long)st->host,
        (unsigned long long)st->streamed, st->stream_bytes / 1048576.0 / steps);
}
