/* test_expert_cache — the device expert cache's policy on synthetic routing traces: a skewed trace against
 * plain LRU (the policy with decay 0, itself checked step by step against an LRU written here), ties and
 * out-of-range ids, the cost model's choice between the link and the host's cores against its closed form,
 * streaming a step that touches most experts, a cache of no slots (every chosen expert on the host, as
 * without a cache), and the split of a budget into slots; on an H100's measured start-up figures, the host's
 * experts priced as one call, evenly spread routing (no fetch amortised, no step predicted slower than all
 * on the host), skewed routing (the hot quarter kept), a fast link (every admitted miss fetched), and the
 * reuse discount only on evidence of reuse. Pure arithmetic (no device). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/expert_cache.h"

#define MB (1024.0 * 1024.0)

/* The host's timing of one expert of `bytes`: 30 µs at 1 row, 400 µs at 64 (Qwen3-30B-A3B's Q4_K experts
 * on 16 cores are about that), a 20 µs round trip; the device reads at 3 TB/s. */
static struct step_cost costs(double h2d, uint64_t bytes)
{
    struct step_cost c = {.h2d = h2d, .hbm = 3e12, .sync_s = 20e-6, .n_cpu = 2, .cpu_ref_bytes = bytes};
    c.cpu_m[0] = 1, c.cpu_s[0] = 30e-6;
    c.cpu_m[1] = 64, c.cpu_s[1] = 400e-6;
    return c;
}

static int slots_of[4];
static uint64_t bytes_of[4];

static struct expert_cache *make(int n_layers, int n_expert, int slots, double decay, double h2d, int stream)
{
    for (int l = 0; l < n_layers; l++) slots_of[l] = slots, bytes_of[l] = 3 * 1024 * 1024;
    const struct expert_cache_params p = {.n_layers = n_layers,
                                          .n_expert = n_expert,
                                          .slots = slots_of,
                                          .expert_bytes = bytes_of,
                                          .decay = decay,
                                          .can_stream = stream,
                                          .cost = costs(h2d, bytes_of[0]),
                                          .fetch_s = 5e-6};
    struct expert_cache *c = NULL;
    cr_assert_eq(expert_cache_init(&c, &p), FERRY_OK);
    return c;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

/* One token's k distinct experts: each pick from the hot quarter (experts 4i + 1) with probability `skew`,
 * else from all of them. */
static void pick(int32_t *ids, int k, int n_expert, double skew)
{
    for (int j = 0; j < k;) {
        int e = (next_u32() % 1000) < skew * 1000 ? (int)(next_u32() % (n_expert / 4)) * 4 + 1
                                                  : (int)(next_u32() % n_expert);
        int dup = 0;
        for (int i = 0; i < j; i++) dup |= ids[i] == e;
        if (!dup) ids[j++] = e;
    }
}

/* The link fast and the host slow: every miss is fetched while a slot can take it. */
#define FAST_LINK 1e13

static void run_trace(struct expert_cache *c, int steps, int tokens, int k, int n_expert, double skew,
                      uint64_t seed)
{
    rng = seed;
    int32_t ids[64 * 8];
    struct expert_plan pl;
    for (int s = 0; s < steps; s++) {
        for (int t = 0; t < tokens; t++) pick(ids + t * k, k, n_expert, skew);
        cr_assert_eq(expert_cache_decide(c, 0, ids, tokens * k, &pl), FERRY_OK);
    }
}

/* Qwen3-30B-A3B's routing shape (128 experts, 8 per token) with a quarter of the experts taking 85% of the
 * picks (88.75% with the cold picks that land on them), 40 slots: the decayed counts keep the hot quarter in
 * its slots, where LRU lets the cold picks push hot experts out. */
Test(expert_cache, skewed_trace_beats_lru)
{
    struct expert_cache *freq = make(1, 128, 40, EXPERT_CACHE_DECAY, FAST_LINK, 0),
                        *lru = make(1, 128, 40, 0.0, FAST_LINK, 0);
    run_trace(freq, 4000, 1, 8, 128, 0.85, 7);
    run_trace(lru, 4000, 1, 8, 128, 0.85, 7);
    struct expert_cache_stats a, b;
    expert_cache_stats(freq, &a);
    expert_cache_stats(lru, &b);
    const double ha = (double)a.hits / a.chosen, hb = (double)b.hits / b.chosen;
    fprintf(stderr, "skewed trace: hit rate %.3f (decayed counts) vs %.3f (LRU); fetched %.0f vs %.0f MiB\n",
            ha, hb, a.fetch_bytes / MB, b.fetch_bytes / MB);
    cr_expect_eq(a.chosen, b.chosen);
    cr_expect_eq(a.hits + a.fetches, a.chosen, "the fast link fetches every miss");
    /* The hot quarter (32 of the 40 slots) alone is 85% of the picks: at least that is a hit. */
    cr_expect_geq(ha, 0.85, "hit rate %.3f", ha);
    cr_expect_lt(a.fetch_bytes, b.fetch_bytes * 8 / 10, "fetched %llu bytes, LRU %llu",
                 (unsigned long long)a.fetch_bytes, (unsigned long long)b.fetch_bytes);
    /* Uniform routing has nothing to keep: the two policies are close (neither far ahead). */
    struct expert_cache *fu = make(1, 64, 20, EXPERT_CACHE_DECAY, FAST_LINK, 0),
                        *lu = make(1, 64, 20, 0.0, FAST_LINK, 0);
    run_trace(fu, 4000, 1, 4, 64, 0.0, 9);
    run_trace(lu, 4000, 1, 4, 64, 0.0, 9);
    expert_cache_stats(fu, &a);
    expert_cache_stats(lu, &b);
    cr_expect_lt(fabs((double)a.hits / a.chosen - (double)b.hits / b.chosen), 0.06);
    cr_expect_lt((double)a.hits / a.chosen, 0.45, "20 of 64 uniform experts cannot hit much more than 31%%");
    expert_cache_free(freq);
    expert_cache_free(lru);
    expert_cache_free(fu);
    expert_cache_free(lu);
}

/* Decay 0 is LRU: checked step by step against a plain LRU (the least recently chosen slot goes, never-chosen
 * and equally old ones by the lowest slot; a step's misses in id order, every miss fetched). */
Test(expert_cache, decay_zero_is_lru)
{
    enum { E = 24, S = 7, K = 3, T = 2 };
    struct expert_cache *c = make(1, E, S, 0.0, FAST_LINK, 0);
    int held[S];
    long last[S];
    for (int s = 0; s < S; s++) held[s] = s, last[s] = 0;
    rng = 11;
    int32_t ids[T * K];
    for (long step = 1; step <= 3000; step++) {
        for (int t = 0; t < T; t++) pick(ids + t * K, K, E, 0.5);
        struct expert_plan pl;
        cr_assert_eq(expert_cache_decide(c, 0, ids, T * K, &pl), FERRY_OK);
        int chosen[E] = {0}, rows[E] = {0};
        for (int i = 0; i < T * K; i++) chosen[ids[i]] = 1, rows[ids[i]]++;
        int in[E];
        for (int e = 0; e < E; e++) in[e] = -1;
        for (int s = 0; s < S; s++) in[held[s]] = s;
        for (int s = 0; s < S; s++)
            if (chosen[held[s]]) last[s] = step;
        /* misses: most rows first, then the lower id (their scores are all 1) */
        for (int r = T * K; r >= 1; r--)
            for (int e = 0; e < E; e++) {
                if (!chosen[e] || rows[e] != r || in[e] >= 0) continue;
                int v = -1;
                for (int s = 0; s < S; s++)
                    if (last[s] < step && (v < 0 || last[s] < last[v])) v = s;
                cr_assert_geq(v, 0);
                cr_assert_eq(pl.where[e], EXPERT_FETCH, "step %ld: expert %d", step, e);
                cr_assert_eq(pl.slot[e], v, "step %ld: expert %d into slot %d, LRU says %d", step, e,
                             pl.slot[e], v);
                held[v] = e, last[v] = step, in[e] = v;
            }
        for (int s = 0; s < S; s++)
            cr_assert_eq(expert_cache_slot_expert(c, 0, s), held[s], "step %ld", step);
    }
    expert_cache_free(c);
}

/* Equal scores and ages: the lowest slot goes first; equal misses: the lower id takes the one slot. */
Test(expert_cache, ties)
{
    struct expert_cache *c = make(1, 4, 2, EXPERT_CACHE_DECAY, FAST_LINK, 0);
    struct expert_plan pl;
    const int32_t a[1] = {2};
    cr_assert_eq(expert_cache_decide(c, 0, a, 1, &pl), FERRY_OK);
    cr_expect_eq(pl.where[2], EXPERT_FETCH);
    cr_expect_eq(pl.slot[2], 0, "two unscored residents: the lower slot goes");
    cr_expect_eq(expert_cache_slot_expert(c, 0, 0), 2);
    cr_expect_eq(expert_cache_slot_expert(c, 0, 1), 1);
    /* 2 now has score 1, 1 still 0: 3 evicts 1 */
    const int32_t b[1] = {3};
    cr_assert_eq(expert_cache_decide(c, 0, b, 1, &pl), FERRY_OK);
    cr_expect_eq(pl.slot[3], 1);
    expert_cache_free(c);

    /* one slot, two equal misses: expert 2 (the lower id) is fetched, 3 goes to the host */
    c = make(1, 4, 1, EXPERT_CACHE_DECAY, FAST_LINK, 0);
    const int32_t d[2] = {3, 2};
    cr_assert_eq(expert_cache_decide(c, 0, d, 2, &pl), FERRY_OK);
    cr_expect_eq(pl.where[2], EXPERT_FETCH);
    cr_expect_eq(pl.where[3], EXPERT_HOST);
    cr_expect_eq(pl.n_fetch, 1);
    cr_expect_eq(pl.fetch[0], 2);
    cr_expect_eq(pl.n_host, 1);
    cr_expect_eq(pl.n_chosen, 2);
    /* the same expert twice in a step (two tokens) is one expert of two rows */
    const int32_t e[4] = {2, 0, 2, 1};
    cr_assert_eq(expert_cache_decide(c, 0, e, 4, &pl), FERRY_OK);
    cr_expect_eq(pl.n_chosen, 3);
    cr_expect_eq(pl.rows[2], 2);
    cr_expect_eq(pl.where[2], EXPERT_HIT);
    expert_cache_free(c);
}

Test(expert_cache, out_of_range_ids_change_nothing)
{
    struct expert_cache *c = make(2, 8, 3, EXPERT_CACHE_DECAY, FAST_LINK, 0);
    struct expert_plan pl;
    const int32_t bad[3][2] = {{5, -1}, {8, 0}, {4, 2147483647}};
    for (int i = 0; i < 3; i++)
        cr_expect_eq(expert_cache_decide(c, 1, bad[i], 2, &pl), FERRY_ERR_RANGE, "ids %d %d", bad[i][0],
                     bad[i][1]);
    const int32_t ok[1] = {6};
    cr_expect_eq(expert_cache_decide(c, 2, ok, 1, &pl), FERRY_ERR_INVALID, "layer 2 of 2");
    cr_expect_eq(expert_cache_decide(c, -1, ok, 1, &pl), FERRY_ERR_INVALID);
    cr_expect_eq(expert_cache_decide(c, 0, ok, 0, &pl), FERRY_ERR_INVALID);
    struct expert_cache_stats st;
    expert_cache_stats(c, &st);
    cr_expect_eq(st.steps, 0);
    for (int s = 0; s < 3; s++) cr_expect_eq(expert_cache_slot_expert(c, 1, s), s);
    cr_expect_eq(expert_cache_slot_expert(c, 1, 3), -1);
    cr_expect_eq(expert_cache_slot_expert(c, 5, 0), -1);
    /* the layer's first valid step after them is a plain miss */
    cr_assert_eq(expert_cache_decide(c, 1, ok, 1, &pl), FERRY_OK);
    cr_expect_eq(pl.where[6], EXPERT_FETCH);
    expert_cache_free(c);

    const int sl[1] = {-1};
    const uint64_t by[1] = {1};
    const struct expert_cache_params p = {.n_layers = 1, .n_expert = 8, .slots = sl, .expert_bytes = by};
    cr_expect_eq(expert_cache_init(&c, &p), FERRY_ERR_INVALID);
    const int s0[1] = {2};
    struct expert_cache_params q = {
        .n_layers = 1, .n_expert = 8, .slots = s0, .expert_bytes = by, .decay = 1.0};
    cr_expect_eq(expert_cache_init(&c, &q), FERRY_ERR_INVALID, "decay 1 never forgets");
    q.decay = NAN;
    cr_expect_eq(expert_cache_init(&c, &q), FERRY_ERR_INVALID);
    cr_expect_null(c);
}

/* One miss, nothing else on either side, never chosen before (no evidence of reuse): fetched exactly when its
 * full link time and launches plus its product on the device are at most the host's time for it plus the
 * round trip; a sweep of link rates flips once, host to fetch. */
Test(expert_cache, link_rate_flips_host_and_fetch)
{
    const uint64_t bytes = 3 * 1024 * 1024;
    for (int rows = 1; rows <= 64; rows *= 4) {
        int flips = 0, prev = EXPERT_HOST;
        for (double h2d = 1e8; h2d < 1e13; h2d *= 1.25) {
            struct expert_cache *c = make(1, 16, 8, EXPERT_CACHE_DECAY, h2d, 0);
            int32_t ids[64];
            for (int i = 0; i < rows; i++) ids[i] = 12; /* rows tokens, k = 1, all on expert 12 (a miss) */
            struct expert_plan pl;
            cr_assert_eq(expert_cache_decide(c, 0, ids, rows, &pl), FERRY_OK);
            const double host = 30e-6 + (400e-6 - 30e-6) * (rows - 1) / 63.0 + 20e-6;
            const double link = 5e-6 + bytes / h2d + bytes / 3e12; /* the copy, then the product */
            const int want = link <= host ? EXPERT_FETCH : EXPERT_HOST;
            cr_expect_eq(pl.where[12], want,
                         "rows %d, link %.3g GB/s: %d, want %d (link %.3g s, host %.3g s)", rows, h2d / 1e9,
                         pl.where[12], want, link, host);
            if (want == EXPERT_FETCH) {
                cr_expect_eq(pl.fetch_bytes, bytes);
                cr_expect_eq(expert_cache_slot_expert(c, 0, 0), 12);
            } else {
                cr_expect_eq(pl.fetch_bytes, 0);
                cr_expect_eq(expert_cache_slot_expert(c, 0, 0), 0, "a host expert takes no slot");
            }
            flips += pl.where[12] != prev;
            prev = pl.where[12];
            expert_cache_free(c);
        }
        cr_expect_eq(flips, 1, "rows %d: the choice flipped %d times over the sweep", rows, flips);
        cr_expect_eq(prev, EXPERT_FETCH);
    }
}

/* A hot resident is not evicted for an expert seen once: the newcomer is computed by the host. */
Test(expert_cache, one_off_expert_spares_hot_ones)
{
    struct expert_cache *c = make(1, 8, 2, EXPERT_CACHE_DECAY, FAST_LINK, 0);
    struct expert_plan pl;
    const int32_t hot[2] = {0, 1};
    for (int i = 0; i < 5; i++) cr_assert_eq(expert_cache_decide(c, 0, hot, 2, &pl), FERRY_OK);
    cr_expect_eq(pl.n_hit, 2);
    const int32_t once[1] = {5};
    cr_assert_eq(expert_cache_decide(c, 0, once, 1, &pl), FERRY_OK);
    cr_expect_eq(pl.where[5], EXPERT_HOST);
    cr_expect_eq(expert_cache_slot_expert(c, 0, 0), 0);
    cr_expect_eq(expert_cache_slot_expert(c, 0, 1), 1);
    /* chosen on every step while 0 and 1 rest, 5's score passes theirs and it moves in */
    int moved = 0;
    for (int i = 0; i < 20 && !moved; i++) {
        cr_assert_eq(expert_cache_decide(c, 0, once, 1, &pl), FERRY_OK);
        moved = pl.where[5] == EXPERT_FETCH;
    }
    cr_expect(moved, "expert 5 never entered the cache");
    expert_cache_free(c);
}

/* No slots: every chosen expert is computed by the host, whatever the link (today's host experts); with a
 * staging area and a large step on a fast link, the step streams instead. */
Test(expert_cache, zero_slots_is_host_experts)
{
    const double links[3] = {1e9, 5e10, FAST_LINK};
    for (int i = 0; i < 3; i++) {
        struct expert_cache *c = make(2, 16, 0, EXPERT_CACHE_DECAY, links[i], 0);
        cr_expect_eq(expert_cache_slots(c, 0), 0);
        cr_expect_eq(expert_cache_slot_expert(c, 0, 0), -1);
        rng = 3;
        int32_t ids[8 * 4];
        for (int s = 0; s < 50; s++) {
            const int tokens = 1 + s % 8;
            for (int t = 0; t < tokens; t++) pick(ids + t * 4, 4, 16, 0.8);
            struct expert_plan pl;
            cr_assert_eq(expert_cache_decide(c, s % 2, ids, tokens * 4, &pl), FERRY_OK);
            cr_expect_eq(pl.n_host, pl.n_chosen);
            cr_expect_eq(pl.stream, 0);
            for (int e = 0; e < 16; e++) cr_expect_eq(pl.slot[e], -1);
        }
        struct expert_cache_stats st;
        expert_cache_stats(c, &st);
        cr_expect_eq(st.hits + st.fetches + st.streamed, 0);
        cr_expect_eq(st.fetch_bytes, 0);
        cr_expect_eq(st.host, st.chosen);
        cr_expect_eq(st.slots, 0);
        expert_cache_free(c);
    }
    struct expert_cache *c = make(1, 16, 0, EXPERT_CACHE_DECAY, 5e10, 1);
    int32_t ids[64 * 4];
    rng = 5;
    for (int t = 0; t < 64; t++) pick(ids + t * 4, 4, 16, 0.0);
    struct expert_plan pl;
    cr_assert_eq(expert_cache_decide(c, 0, ids, 64 * 4, &pl), FERRY_OK);
    cr_expect_eq(pl.stream, 1, "64 tokens on 16 experts at 50 GB/s: streaming beats the host");
    cr_expect_eq(pl.n_stream, pl.n_chosen);
    cr_expect_eq(pl.fetch_bytes, (uint64_t)pl.n_chosen * 3 * 1024 * 1024);
    const int32_t one[4] = {0, 1, 2, 3};
    cr_assert_eq(expert_cache_decide(c, 0, one, 4, &pl), FERRY_OK);
    cr_expect_eq(pl.stream, 0, "one token: 4 experts on the host beat streaming them");
    cr_expect_eq(pl.n_host, 4);
    expert_cache_free(c);
}

/* A step of 256 tokens touches all 64 experts: fetching 8 into the slots and computing 56 on the host loses
 * to streaming them all, which leaves the cache as it was. */
Test(expert_cache, large_step_streams_and_keeps_the_cache)
{
    struct expert_cache *c = make(1, 64, 8, EXPERT_CACHE_DECAY, 5e10, 1);
    int32_t ids[256 * 4];
    rng = 13;
    for (int t = 0; t < 256; t++) pick(ids + t * 4, 4, 64, 0.0);
    struct expert_plan pl;
    cr_assert_eq(expert_cache_decide(c, 0, ids, 256 * 4, &pl), FERRY_OK);
    cr_expect_eq(pl.n_chosen, 64);
    cr_expect_eq(pl.stream, 1);
    cr_expect_eq(pl.fetch_bytes, (uint64_t)(64 - 8) * 3 * 1024 * 1024, "the misses cross the link");
    for (int s = 0; s < 8; s++) cr_expect_eq(expert_cache_slot_expert(c, 0, s), s);
    struct expert_cache_stats st;
    expert_cache_stats(c, &st);
    cr_expect_eq(st.streamed, 64);
    cr_expect_eq(st.fetches, 0);
    cr_expect_eq(st.stream_bytes, pl.fetch_bytes);
    /* without a staging area the same step fetches what the slots take and the host computes the rest */
    struct expert_cache *d = make(1, 64, 8, EXPERT_CACHE_DECAY, 5e10, 0);
    cr_assert_eq(expert_cache_decide(d, 0, ids, 256 * 4, &pl), FERRY_OK);
    cr_expect_eq(pl.stream, 0);
    cr_expect_eq(pl.n_hit + pl.n_fetch + pl.n_host, 64);
    cr_expect_leq(pl.n_hit + pl.n_fetch, 8);
    expert_cache_free(c);
    expert_cache_free(d);
}

/* A step's pairs split by its plan: a device pair reads its expert's slot, a host pair is listed (in pair
 * order, with its token and weight) and left out of the slot table; every pair lands on exactly one side. */
Test(expert_cache, pairs_follow_the_plan)
{
    enum { E = 16, K = 4, T = 6 };
    struct expert_cache *c =
        make(1, E, 5, EXPERT_CACHE_DECAY, 3e10, 0); /* hot misses fetched, cold ones on the host */
    rng = 21;
    int32_t ids[T * K], slot[T * K], htok[T * K], hid[T * K];
    float wts[T * K], hw[T * K];
    int hosted = 0, fetched = 0;
    for (int step = 0; step < 40; step++) {
        for (int t = 0; t < T; t++) pick(ids + t * K, K, E, 0.6);
        for (int p = 0; p < T * K; p++) wts[p] = 0.01f * (float)(p + 1);
        struct expert_plan pl;
        cr_assert_eq(expert_cache_decide(c, 0, ids, T * K, &pl), FERRY_OK);
        const int hn = expert_plan_pairs(&pl, ids, wts, T * K, K, slot, htok, hid, hw);
        int q = 0;
        for (int p = 0; p < T * K; p++) {
            const int e = ids[p];
            if (pl.where[e] == EXPERT_HOST) {
                cr_assert_eq(slot[p], -1);
                cr_assert_lt(q, hn);
                cr_assert_eq(htok[q], p / K);
                cr_assert_eq(hid[q], e);
                cr_assert_eq(hw[q], wts[p]);
                q++;
            } else {
                cr_assert(pl.where[e] == EXPERT_HIT || pl.where[e] == EXPERT_FETCH);
                cr_assert_eq(slot[p], pl.slot[e]);
                cr_assert_eq(expert_cache_slot_expert(c, 0, slot[p]), e, "slot %d holds the expert", slot[p]);
            }
        }
        cr_assert_eq(q, hn);
        hosted += hn;
        fetched += pl.n_fetch;
    }
    cr_expect_gt(hosted, 0, "the trace never put a pair on the host");
    cr_expect_gt(fetched, 0, "the trace never fetched");
    expert_cache_free(c);
}

/* Slots of every layer: as many as fit the bytes, the same count in each host layer, none elsewhere. */
static uint64_t slot_bytes(const void *ctx, int l, int s)
{
    const uint64_t *each = ctx;
    return s ? ((uint64_t)s * each[l] + 255) / 256 * 256 + 256 : 0;
}

Test(expert_cache, split_spreads_slots_over_host_layers)
{
    const uint64_t each[5] = {1000, 1000, 3000, 1000, 1000};
    const uint8_t host[5] = {0, 1, 1, 0, 1};
    int slots[5];
    /* s slots cost (1000 s + 3000 s + 1000 s rounded up) + 3 * 256 */
    for (uint64_t b = 0; b < 200000; b += 777) {
        const int n = expert_cache_split(b, 5, 32, host, slot_bytes, each, slots);
        uint64_t need = 0, more = 0;
        for (int l = 0; l < 5; l++) need += host[l] ? slot_bytes(each, l, n) : 0;
        for (int l = 0; l < 5; l++) more += host[l] ? slot_bytes(each, l, n + 1) : 0;
        cr_assert_leq(need, b);
        if (n < 32) cr_assert_gt(more, b, "bytes %llu: %d slots, %d fit", (unsigned long long)b, n, n + 1);
        for (int l = 0; l < 5; l++) cr_assert_eq(slots[l], host[l] ? n : 0);
    }
    cr_expect_eq(expert_cache_split(UINT64_MAX / 4, 5, 32, host, slot_bytes, each, slots), 32);
}

Test(expert_cache, format_names_the_hit_rate)
{
    struct expert_cache *c = make(1, 8, 4, EXPERT_CACHE_DECAY, FAST_LINK, 0);
    expert_cache_set_slot_bytes(c, 12u << 20);
    struct expert_plan pl;
    const int32_t ids[2] = {0, 6};
    cr_assert_eq(expert_cache_decide(c, 0, ids, 2, &pl), FERRY_OK);
    struct expert_cache_stats st;
    expert_cache_stats(c, &st);
    char buf[512];
    expert_cache_format(&st, buf, sizeof buf);
    cr_expect(strstr(buf, "4 slots over 1 layers (12.0 MiB)") != NULL, "%s", buf);
    cr_expect(strstr(buf, "50.0% of 2 chosen experts hit, 1 fetched (3.00 MiB a layer step)") != NULL, "%s",
              buf);
    struct expert_cache_stats none = {0};
    expert_cache_format(&none, buf, sizeof buf);
    cr_expect_str_eq(buf, "expert cache: none");
    expert_cache_free(c);
}

/* An H100 host with a Qwen3-30B-A3B-shaped Q4_K_M file (measured at start-up on 2026-12-07): one 2.65 MB
 * expert on the host 79.7 µs at 1 row, the layer step's 8 experts in one call 0.40 ms, a host round trip
 * 14.5 µs, the link 55.4 GB/s, 6 µs of launches a fetch; the device reads at 3.35 TB/s. */
#define H100_EXPERT 2650000u
#define H100_ONE    79.7e-6
#define H100_SET    400e-6
#define H100_SYNC   14.5e-6
#define H100_H2D    55.4e9
#define H100_FETCH  6e-6

static struct expert_cache *make_h100(int n_expert, int slots, double h2d, double busy)
{
    slots_of[0] = slots, bytes_of[0] = H100_EXPERT;
    struct step_cost k = {
        .h2d = h2d, .hbm = 3.35e12, .sync_s = H100_SYNC, .n_cpu = 1, .cpu_ref_bytes = H100_EXPERT};
    k.cpu_m[0] = 1, k.cpu_s[0] = H100_ONE;
    const struct expert_cache_params p = {.n_layers = 1,
                                          .n_expert = n_expert,
                                          .slots = slots_of,
                                          .expert_bytes = bytes_of,
                                          .decay = EXPERT_CACHE_DECAY,
                                          .cost = k,
                                          .fetch_s = H100_FETCH,
                                          .host_set_s = H100_SET,
                                          .host_set_n = 8,
                                          .host_busy = busy};
    struct expert_cache *c = NULL;
    cr_assert_eq(expert_cache_init(&c, &p), FERRY_OK);
    return c;
}

/* The fixed part of a host call: one expert's time less the per-expert share of a set's. */
Test(expert_cache, call_split_from_one_and_set)
{
    const double share = (H100_SET - H100_ONE) / 7;
    cr_expect_float_eq(expert_cache_call_s(H100_ONE, H100_SET, 8), H100_ONE - share, 1e-12);
    cr_expect_eq(expert_cache_call_s(H100_ONE, H100_SET, 1), 0, "one expert alone tells no share");
    cr_expect_eq(expert_cache_call_s(H100_ONE, 8 * H100_ONE + 1e-6, 8), 0, "a set dearer than its singles");
    cr_expect_float_eq(expert_cache_call_s(H100_ONE, H100_ONE / 2, 8), H100_ONE, 1e-15, "at most one_s");
    cr_expect_eq(expert_cache_call_s(NAN, H100_SET, 8), 0);
    cr_expect_eq(expert_cache_call_s(H100_ONE, INFINITY, 8), 0);
    cr_expect_eq(expert_cache_call_s(H100_ONE, -1, 8), 0);
}

/* Evenly spread routing (top-8 of 128, one token a step) on the H100's numbers with 2 slots: nothing is worth
 * keeping, so no fetch is amortised (each costs its full link time, which the prediction waits for), the
 * host's side of a step is its one call (0.40 ms for 8 experts, not 8 x 79.7 µs), and no step is predicted
 * slower than all its experts on the host. With the host's measured slow-down while copies run past
 * (the set of 8) / (the set of 6) = 0.40 / 0.309 ms, fetching two loses and the step is all-host. */
Test(expert_cache, h100_even_routing)
{
    const double share = (H100_SET - H100_ONE) / 7, call = H100_ONE - share,
                 link_one = H100_FETCH + H100_EXPERT / H100_H2D;
    const double busy_edge = H100_SET / (call + 6 * share);
    const double busies[3] = {1.0, busy_edge * 0.97, busy_edge * 1.03};
    for (int b = 0; b < 3; b++) {
        struct expert_cache *c = make_h100(128, 2, H100_H2D, busies[b]);
        rng = 77;
        int32_t ids[8];
        double sum_pred = 0, sum_host = 0;
        long full8 = 0, fetched8 = 0;
        for (int s = 0; s < 3000; s++) {
            pick(ids, 8, 128, 0.0);
            struct expert_plan pl;
            cr_assert_eq(expert_cache_decide(c, 0, ids, 8, &pl), FERRY_OK);
            const int miss = pl.n_chosen - pl.n_hit;
            const double all_host = H100_SYNC + call + miss * share;
            cr_assert_leq(pl.predicted_s, all_host * (1 + 1e-12), "step %d: %.1f µs, all-host %.1f µs", s,
                          pl.predicted_s * 1e6, all_host * 1e6);
            cr_assert_float_eq(pl.link_s, pl.n_fetch * link_one, 1e-12, "step %d: a fetch is not amortised",
                               s);
            if (pl.n_host)
                cr_assert_float_eq(pl.host_s,
                                   H100_SYNC + (call + pl.n_host * share) * (pl.n_fetch ? busies[b] : 1),
                                   1e-12, "step %d", s);
            if (miss == 8) full8++, fetched8 += pl.n_fetch;
            sum_pred += pl.predicted_s, sum_host += all_host;
        }
        struct expert_cache_stats st;
        expert_cache_stats(c, &st);
        fprintf(stderr,
                "even routing, host slow-down %.3f: %.2f fetches a step, hit rate %.3f, predicted %.1f µs a "
                "step against %.1f all-host\n",
                busies[b], (double)st.fetches / st.steps, (double)st.hits / st.chosen, sum_pred / 3000 * 1e6,
                sum_host / 3000 * 1e6);
        cr_expect_lt((double)st.hits / st.chosen, 0.05, "2 of 128 evenly chosen experts rarely hit");
        cr_expect_gt(full8, 2000);
        if (b < 2) /* the copies overlap the host's call: taking experts off the host's side pays */
            cr_expect_gt(fetched8, full8 / 2, "%ld fetches over %ld steps of 8 misses", fetched8, full8);
        else
            cr_expect_eq(st.fetches, 0, "the host slowed past the edge: no fetch pays");
        expert_cache_free(c);
    }
}

/* Skewed routing (a quarter of the experts take 90% of the picks, as tests/gpu/skew_router.py makes them)
 * on the H100's numbers with 40 slots: the hot quarter moves into the slots and most chosen experts hit. */
Test(expert_cache, h100_skewed_routing_keeps_the_hot_quarter)
{
    struct expert_cache *c = make_h100(128, 40, H100_H2D, 1.3);
    rng = 91;
    int32_t ids[8];
    struct expert_plan pl;
    for (int s = 0; s < 2000; s++) {
        pick(ids, 8, 128, 0.9);
        cr_assert_eq(expert_cache_decide(c, 0, ids, 8, &pl), FERRY_OK);
    }
    struct expert_cache_stats a, b;
    expert_cache_stats(c, &a);
    for (int s = 0; s < 2000; s++) {
        pick(ids, 8, 128, 0.9);
        cr_assert_eq(expert_cache_decide(c, 0, ids, 8, &pl), FERRY_OK);
    }
    expert_cache_stats(c, &b);
    const double hit = (double)(b.hits - a.hits) / (double)(b.chosen - a.chosen);
    int hot = 0;
    for (int s = 0; s < 40; s++) hot += expert_cache_slot_expert(c, 0, s) % 4 == 1;
    fprintf(stderr, "skewed routing: hit rate %.3f over the last 2000 steps, %d of 32 hot experts in slots\n",
            hit, hot);
    cr_expect_geq(hit, 0.8, "hit rate %.3f", hit);
    cr_expect_geq(hot, 30, "%d hot experts in the slots", hot);
    expert_cache_free(c);
}

/* A fast link beside a slow host: evenly spread misses are fetched whenever a slot admits them (an incoming
 * expert's score at least its victim's); what the host gets is only what no slot admits, as with a link of no
 * cost. */
Test(expert_cache, fast_link_slow_host_fetches)
{
    struct expert_cache *c = make_h100(128, 8, 1e12, 1.0), *free_link = make_h100(128, 8, 1e18, 1.0);
    rng = 5;
    int32_t ids[8];
    for (int s = 0; s < 500; s++) {
        pick(ids, 8, 128, 0.0);
        struct expert_plan pl, pf;
        cr_assert_eq(expert_cache_decide(c, 0, ids, 8, &pl), FERRY_OK);
        cr_assert_eq(expert_cache_decide(free_link, 0, ids, 8, &pf), FERRY_OK);
        cr_assert_eq(pl.n_fetch, pf.n_fetch, "step %d: the slots admitted %d, %d fetched", s, pf.n_fetch,
                     pl.n_fetch);
    }
    struct expert_cache_stats st;
    expert_cache_stats(c, &st);
    cr_expect_gt(st.fetches, 500, "%llu fetches", (unsigned long long)st.fetches);
    expert_cache_free(c);
    expert_cache_free(free_link);
}

/* A miss is amortised only on evidence of reuse: at a link where its full price loses to the host (80 µs
 * against 30 + 20), expert 5 goes to the host on its first two steps (scores before them 0 and 0.9) and is
 * fetched on the third (1.71 before it: 80 µs over 1 + 2.71, plus its product, beats the host). */
Test(expert_cache, reuse_evidence_earns_the_discount)
{
    const double bytes = 3 * 1024 * 1024, h2d = bytes / 75e-6; /* 75 µs + 5 µs of launches */
    struct expert_cache *c = make(1, 8, 1, EXPERT_CACHE_DECAY, h2d, 0);
    const int32_t five[1] = {5};
    struct expert_plan pl;
    for (int s = 0; s < 2; s++) {
        cr_assert_eq(expert_cache_decide(c, 0, five, 1, &pl), FERRY_OK);
        cr_expect_eq(pl.where[5], EXPERT_HOST, "step %d", s);
        cr_expect_float_eq(pl.predicted_s, 50e-6, 1e-12);
    }
    cr_assert_eq(expert_cache_decide(c, 0, five, 1, &pl), FERRY_OK);
    cr_expect_eq(pl.where[5], EXPERT_FETCH);
    cr_expect_float_eq(pl.link_s, 80e-6, 1e-12, "the step still waits for the whole copy");
    cr_expect_float_eq(pl.predicted_s, 80e-6 + bytes / 3e12, 1e-12);
    expert_cache_free(c);
}
