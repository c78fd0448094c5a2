/* sched_policy — admission and step composition, pure: numbers in, decisions out (see sched_policy.h).
 *
 * The defaults reproduce the scheduler as it was before this module: a step holds every decode row, then
 * prefill chunks up to max_batch_tokens; the queue's head is admitted when a slot is free and its KV
 * reservation fits beside the running ones and the idle prompt caches, which are dropped least recently
 * used first to make room.
 */
#include "server/sched_policy.h"

#include "kernels/core/status.h"

int sched_policy_blocks(const struct sched_policy_params *p, int positions)
{
    const int b = p->kv_block > 0 ? p->kv_block : 1;
    return positions > 0 ? (int)(((long long)positions + b - 1) / b) : 0;
}

int sched_policy_kv_need(const struct sched_policy_params *p, int n_prompt, int max_tokens)
{
    long long pos = (long long)n_prompt + (max_tokens > 0 ? max_tokens : 0);
    if (pos > p->ctx) pos = p->ctx;
    return sched_policy_blocks(p, (int)pos);
}

int sched_policy_accepts(const struct sched_policy_params *p, int n_queued, int n_running, int n_seqs)
{
    const int free_slots = p->n_slots - n_running;
    if (n_queued + n_seqs <= p->max_queue + (free_slots > 0 ? free_slots : 0)) return 0;
    /* A request with more sequences than the queue holds (n up to 128, 2,048 embedding inputs: the API bounds
     * them) waits alone: it is taken when nothing else waits. */
    return n_queued == 0 ? 0 : FERRY_ERR_BUSY;
}

int sched_policy_fits_pool(const struct sched_policy_params *p, int n_prompt, int max_tokens, int *need)
{
    const int k = sched_policy_kv_need(p, n_prompt, max_tokens);
    if (need) *need = k;
    return k > p->kv_blocks ? FERRY_ERR_DEVICE_MEM : 0;
}

enum sched_admit sched_policy_admit(const struct sched_policy_params *p, int n_running, int kv_reserved,
                                    int need, const int *idle_blocks, int n_idle, int *n_evict)
{
    *n_evict = 0;
    if (n_running >= p->n_slots) return SCHED_ADMIT_WAIT;
    long long idle = 0;
    for (int i = 0; i < n_idle; i++) idle += idle_blocks[i];
    const int fast =
        p->kv_fast_blocks > 0 && p->kv_fast_blocks < p->kv_blocks ? p->kv_fast_blocks : p->kv_blocks;
    for (int k = 0;; k++) {
        if ((long long)kv_reserved + need + idle <= p->kv_blocks) {
            /* and past that, the caches that keep the head off the device's blocks */
            while (k < n_idle && idle > 0 && (long long)kv_reserved + need + idle > fast)
                idle -= idle_blocks[k++];
            *n_evict = k;
            return SCHED_ADMIT_NOW;
        }
        if (k == n_idle) break;
        idle -= idle_blocks[k];
    }
    /* The head will need that room as soon as running sequences finish: the caches go now, as they always
     * did (a cache kept here would only be dropped at the head's admission). */
    *n_evict = n_idle;
    return SCHED_ADMIT_WAIT;
}

int sched_policy_plan_prefill(int budget, const struct sched_step_seq *seqs, int n, int *chunk)
{
    int used = 0;
    for (int i = 0; i < n; i++) {
        chunk[i] = 0;
        const struct sched_step_seq *q = &seqs[i];
        if (used >= budget || q->no_prefill || q->n_fed >= q->n_prompt) continue;
        int k = q->n_prompt - q->n_fed;
        if (k > budget - used) k = budget - used;
        chunk[i] = k;
        used += k;
    }
    return used;
}

int sched_policy_plan_step(const struct sched_policy_params *p, const struct sched_step_seq *seqs, int n,
                           int *chunk, struct sched_step_plan *plan)
{
    plan->n_decode = plan->n_prefill = plan->n_lp_rows = 0;
    for (int i = 0; i < n; i++) {
        chunk[i] = 0;
        if (seqs[i].n_fed >= seqs[i].n_prompt) plan->n_decode++;
    }
    int budget = p->max_batch_tokens - plan->n_decode;
    if (p->prefill_budget > 0 && p->prefill_budget < budget) budget = p->prefill_budget;
    for (int i = 0; i < n && plan->n_prefill < budget; i++) {
        const struct sched_step_seq *q = &seqs[i];
        if (q->no_prefill || q->n_fed >= q->n_prompt) continue;
        int k = q->n_prompt - q->n_fed;
        if (k > budget - plan->n_prefill) k = budget - plan->n_prefill;
        const int tail = q->n_prompt - p->ckpt_tail; /* a checkpoint there: the chunk ends at it */
        if (p->ckpt_tail > 0 && q->n_fed < tail && q->n_fed + k > tail) k = tail - q->n_fed;
        if (q->prompt_lp) {
            /* every prompt row but the last wants logits, and a step holds only so many of them */
            if (k > p->prompt_lp_rows - plan->n_lp_rows) k = p->prompt_lp_rows - plan->n_lp_rows;
            if (k <= 0) continue;
            plan->n_lp_rows += q->n_fed + k == q->n_prompt ? k - 1 : k;
        }
        chunk[i] = k;
        plan->n_prefill += k;
    }
    return plan->n_decode + plan->n_prefill;
}

int sched_policy_spec_len(int n_max, int n_dec, int rows_left)
{
    if (n_max <= 0 || n_dec <= 0 || n_dec > SCHED_SPEC_MAX_SEQS || rows_left <= 0) return 0;
    if (rows_left > SCHED_SPEC_ROWS) rows_left = SCHED_SPEC_ROWS;
    const int k = rows_left / n_dec;
    return k < n_max ? k : n_max;
}

void sched_spec_cost_note(struct sched_spec_cost *c, int rows, double seconds)
{
    if (rows < 1 || rows > SCHED_SPEC_COST_ROWS || !(seconds > 0)) return;
    c->t[rows] = c->t[rows] > 0 ? 0.7 * c->t[rows] + 0.3 * seconds : seconds;
}

void sched_spec_cost_draft_note(struct sched_spec_cost *c, int k, double seconds)
{
    if (k < 1 || !(seconds >= 0)) return;
    c->draft = c->draft > 0 ? 0.7 * c->draft + 0.3 * seconds / k : seconds / k;
}

struct sched_spec_accept sched_spec_accept_new(enum sched_spec_kind kind)
{
    struct sched_spec_accept a = {.alpha0 = 0.6, .n0 = 2};
    if (kind == SCHED_SPEC_MODEL || kind == SCHED_SPEC_MTP) a.alpha0 = 0.75, a.n0 = 3;
    return a;
}

void sched_spec_accept_note(struct sched_spec_accept *a, int drafted, int accepted)
{
    if (drafted <= 0) {
        if (a->wait > 0) a->wait--;
        a->succ *= SCHED_SPEC_FADE;
        a->tried *= SCHED_SPEC_FADE;
        return;
    }
    if (accepted < 0) accepted = 0;
    if (accepted > drafted) accepted = drafted;
    a->succ = SCHED_SPEC_DECAY * a->succ + accepted;
    a->tried = SCHED_SPEC_DECAY * a->tried + accepted + (accepted < drafted);
    const int tries = accepted + (accepted < drafted);
    a->seen = a->seen + tries < SCHED_SPEC_TRIES_MIN ? a->seen + tries : SCHED_SPEC_TRIES_MIN;
    if (accepted > 0) {
        a->miss = a->wait = 0;
        return;
    }
    if (++a->miss < SCHED_SPEC_GRACE) return;
    const int n = a->miss - SCHED_SPEC_GRACE; /* 1, 2, 4, ... up to SCHED_SPEC_WAIT_MAX */
    a->wait = n >= 8 || (1 << n) > SCHED_SPEC_WAIT_MAX ? SCHED_SPEC_WAIT_MAX : 1 << n;
}

double sched_spec_accept_rate(const struct sched_spec_accept *a)
{
    const double rate = (a->succ + a->alpha0 * a->n0) / (a->tried + a->n0);
    return a->seen < SCHED_SPEC_TRIES_MIN && rate < a->alpha0 ? a->alpha0 : rate;
}

int sched_spec_accept_may_draft(const struct sched_spec_accept *a)
{
    return a->wait == 0;
}

/* cost(rows): the measured time, else the nearest measured below; 0 when none is. */
static double spec_cost_at(const struct sched_spec_cost *c, int rows)
{
    for (int r = rows; r >= 1; r--)
        if (c->t[r] > 0) return c->t[r];
    return 0;
}

int sched_policy_spec_pick(const struct sched_spec_cost *c, int base, const double *alpha, int n, int k_max)
{
    if (k_max <= 0 || n <= 0) return 0;
    if (base < 1) base = 1;
    if (base + n * k_max > SCHED_SPEC_COST_ROWS || spec_cost_at(c, base) <= 0) return k_max;
    int best = 0;
    double best_rate = 0;
    for (int k = 0; k <= k_max; k++) {
        double tokens = 0;
        for (int i = 0; i < n; i++) {
            double a = alpha[i] < 0 ? 0 : alpha[i] > 1 ? 1 : alpha[i], p = 1;
            for (int j = 0; j <= k; j++, p *= a) tokens += p;
        }
        const double rate = tokens / (spec_cost_at(c, base + n * k) + k * (c->draft > 0 ? c->draft : 0));
        if (rate > best_rate * (1 + 1e-9)) best = k, best_rate = rate;
    }
    return best;
}

/* ---- sharing between clients ---- */

int sched_policy_fair_share(int n_slots, int n_clients)
{
    const int share = n_clients > 0 ? n_slots / n_clients : n_slots;
    return share > 0 ? share : 1;
}

int sched_policy_fair_pick(const int *q_client, const unsigned char *q_ready, int nq, const int *running_of,
                           int share)
{
    int first = -1;
    for (int i = 0; i < nq; i++) {
        if (!q_ready[i]) continue;
        if (first < 0) first = i;
        if (running_of[q_client[i]] < share) return i;
    }
    return first;
}

int sched_policy_fair_victim(const struct sched_fair_seq *run, int n, const int *running_of, int share, int w)
{
    int best = -1;
    for (int i = 0; i < n; i++) /* a paused stream: nobody reads it */
        if (run[i].how == SCHED_YIELD_PAUSED && (best < 0 || run[i].cost < run[best].cost)) best = i;
    if (best >= 0 || running_of[w] >= share) return best;
    for (int i = 0; i < n; i++) {
        const struct sched_fair_seq *q = &run[i];
        if (q->how != SCHED_YIELD_SHARE || q->client == w || running_of[q->client] <= share) continue;
        if (best < 0 || running_of[q->client] > running_of[run[best].client] ||
            (running_of[q->client] == running_of[run[best].client] && q->cost < run[best].cost))
            best = i;
    }
    return best;
}

int sched_policy_embed_budget(const struct sched_policy_params *p, int others_running, int others_waiting,
                              int others_starting)
{
    if (others_starting) return 0; /* first tokens first */
    /* alone a quarter (a request arriving meanwhile waits for one such step), beside others an eighth */
    const int b = p->max_batch_tokens / (others_running || others_waiting ? 8 : 4);
    return b > 0 ? b : 1;
}
