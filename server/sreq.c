/* sreq — a request's memory: sreq_new() makes it with its condition variable ready and refs = 1, and
 * sreq_free() releases everything the API layer and the scheduler hung on it (prompts, stops, grammar,
 * each choice's output state and published text). Who calls sreq_free is the reference count's business
 * (scheduler.c: whichever of the HTTP side and the scheduler lets go last).
 */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "server/sreq.h"

struct sreq *sreq_new(void)
{
    struct sreq *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->client_id = -1; /* (sched_submit gives it one) */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    r->refs = 1;
    r->logprobs = -1;
    r->n = 1;
    r->spec_n_max = r->spec_n_min = -1;
    r->spec_p_min = -1;
    return r;
}

void sreq_free(struct sreq *r)
{
    if (!r) return;
    for (int i = 0; r->choices && i < r->n_choices; i++) {
        seq_output_free(&r->choices[i].out);
        free(r->choices[i].call_ids);
        free(r->choices[i].embd);
        free(r->choices[i].text);
        free(r->choices[i].lps);
        free(r->choices[i].prompt_lps);
        free(r->choices[i].hist);
        free(r->choices[i].spec_lps);
        free(r->choices[i].gen);
        free(r->choices[i].feed_buf);
    }
    free(r->choices);
    for (int i = 0; i < r->n_prompts; i++) {
        if (r->prompts) free(r->prompts[i]);
        if (r->prompt_texts) free(r->prompt_texts[i]);
    }
    free(r->prompts);
    free(r->prompt_texts);
    free(r->n_prompt_toks);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->stops);
    free(r->bias);
    grammar_free(r->grammar);
    free(r->echo_json);
    pthread_cond_destroy(&r->cv);
    free(r);
}
