/* serve — `ferry serve`: the server's life on the libuv loop: options, the socket, the background model
 * load, the signals, the drain and the shutdown.
 *
 * Threads: the main thread runs one libuv loop that owns every socket (server/http.c), the signals (SIGTERM/
 * SIGINT: stop accepting, drain within --shutdown-timeout, exit 0) and the background model load (the socket
 * is bound first; /health says "loading"). What the server does with each request (routes, auth, completions,
 * the access log) is server/routes.c; the state both share is server/serve_impl.h.
 */
#include "server/serve.h"

#include <arpa/inet.h>
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include <uv.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "runtime/chat_template.h"
#include "runtime/engine.h"
#include "runtime/tokenizer.h"
#include "runtime/tool_call.h"
#include "server/api.h"
#include "server/build_id.h"
#include "server/cli.h"
#include "server/gpu_arch.h"
#include "server/http.h"
#include "server/metrics.h"
#include "server/options.h"
#include "runtime/draft_model.h"
#include "runtime/mtp.h"
#include "server/scheduler.h"
#include "server/serve_impl.h"
#include "weights/arch/arch.h"
#include "weights/gguf.h"
#include "weights/model_file.h"

/* ---- lifecycle ---- */

/* Load progress as log lines (a server's stderr is a journal or a file as often as a terminal): one at each
 * quarter. user: the last quarter logged, -1 before any. */
static void on_load_progress(uint64_t done, uint64_t total, void *user)
{
    int *last = user;
    if (!total) return;
    int quarter = (int)((done < total ? done : total) * 4 / total);
    if (quarter <= *last) return;
    *last = quarter;
    FLOG_INFO("loading model: %d%% (%llu / %llu MiB)", quarter * 25, (unsigned long long)(done >> 20),
              (unsigned long long)(total >> 20));
}

static void loader_main(void *arg)
{
    struct server *S = arg;
    char err[256] = "";
    int last_quarter = -1;
    int rc = model_file_open(S->opt.model, &S->mf, on_load_progress, &last_quarter, err);
    if (rc) {
        snprintf(S->load_err, sizeof S->load_err, "cannot open model %s: %.180s (%s)", S->opt.model, err,
                 ferry_status_str(rc));
        goto done;
    }
    rc = tokenizer_init(&S->tok, S->mf, err);
    if (rc) {
        snprintf(S->load_err, sizeof S->load_err, "cannot load the tokenizer: %.200s (%s)", err,
                 ferry_status_str(rc));
        goto done;
    }
    struct engine_params ep = engine_default_params();
    ep.n_threads = S->opt.threads;
    ep.ctx_size = S->opt.ctx_size;
    ep.n_seqs = S->opt.parallel;
    ep.max_batch_tokens =
        S->opt.max_batch_tokens < S->opt.parallel ? S->opt.parallel : S->opt.max_batch_tokens;
    ep.deterministic = S->opt.deterministic;
    ep.quant = (enum engine_quant)engine_quant_parse(S->opt.quant); /* options.c allows only known names */
    ep.kv_tokens = S->opt.kv_tokens;
    ep.backend = !strcmp(S->opt.backend, "cpu")    ? ENGINE_BACKEND_CPU
                 : !strcmp(S->opt.backend, "cuda") ? ENGINE_BACKEND_CUDA
                                                   : ENGINE_BACKEND_AUTO;
    ep.gpu_memory = S->opt.gpu_memory;
    ep.reserve_vram = S->opt.reserve_vram;
    ep.gpu_layers = S->opt.gpu_layers;
    ep.cpu_moe = S->opt.cpu_moe;
    ep.expert_cache = S->opt.expert_cache;
    ep.ring_layers = S->opt.ring_layers;
    ep.placement = !strcmp(S->opt.placement, "stream") ? ENGINE_PLACEMENT_STREAM
                   : !strcmp(S->opt.placement, "cpu")  ? ENGINE_PLACEMENT_CPU
                                                       : ENGINE_PLACEMENT_AUTO;
    ep.cpu_threads = S->opt.cpu_threads;
    /* options.c allows only auto|f32|int8 */
    ep.cpu_int8 = !strcmp(S->opt.cpu_arith, "int8") ? 1 : !strcmp(S->opt.cpu_arith, "f32") ? 0 : -1;
    ep.kv_type = engine_kv_type_parse(S->opt.kv_type); /* options.c allows only f16|f32|q8_0 */
    ep.swa_full = S->opt.swa_full;
    ep.ctx_checkpoints = S->opt.ctx_checkpoints;
    ep.ckpt_step = S->opt.checkpoint_min_step;
    if (S->opt.model_draft) {
        /* The draft model first, on a GPU with a budget of its bytes and room for its KV and activations,
         * taken out of the model's. */
        if ((rc = model_file_open(S->opt.model_draft, &S->mf_draft, NULL, NULL, err))) {
            snprintf(S->load_err, sizeof S->load_err, "cannot open the draft model %s: %.180s (%s)",
                     S->opt.model_draft, err, ferry_status_str(rc));
            goto done;
        }
        struct engine_params dp = ep;
        dp.gpu_memory = (int64_t)S->mf_draft->file_bytes + ((int64_t)512 << 20);
        dp.gpu_layers = -1;
        dp.kv_tokens = 0;
        if (ep.gpu_memory > 0) {
            if (ep.gpu_memory <= dp.gpu_memory) {
                rc = FERRY_ERR_DEVICE_MEM;
                snprintf(S->load_err, sizeof S->load_err,
                         "--gpu-memory %.2f GiB cannot hold the draft model (%.2f GiB with its KV and "
                         "activations) and the model",
                         ep.gpu_memory / 1073741824.0, dp.gpu_memory / 1073741824.0);
                goto done;
            }
            ep.gpu_memory -= dp.gpu_memory;
        }
        if ((rc = draft_model_init(&S->dm, S->mf_draft, &dp, S->mf->hp.n_vocab, err))) {
            snprintf(S->load_err, sizeof S->load_err, "cannot start the draft model: %.200s (%s)", err,
                     ferry_status_str(rc));
            goto done;
        }
        FLOG_INFO("draft model: %s (%s)", S->opt.model_draft, engine_placement(draft_model_engine(S->dm)));
    }
    rc = engine_init(&S->eng, S->mf, &ep, err);
    if (rc) {
        snprintf(S->load_err, sizeof S->load_err, "cannot start the engine: %.200s (%s)", err,
                 ferry_status_str(rc));
        goto done;
    }
    if (strcmp(S->opt.spec_type, "none") && S->mf->hp.full_attn_interval > 0 && S->opt.ctx_checkpoints <= 0) {
        /* A recurrent state goes back past rejected drafts only to a checkpoint saved where the step began.
         */
        snprintf(S->load_err, sizeof S->load_err,
                 "speculative decoding (--spec-type %s) on a model with linear-attention layers needs "
                 "--ctx-checkpoints 1 or more",
                 S->opt.spec_type);
        rc = FERRY_ERR_UNSUPPORTED;
        goto done;
    }
    if (!strcmp(S->opt.spec_type, "mtp")) {
        struct engine_stats es;
        engine_get_stats(S->eng, &es);
        struct mtp_params mp = mtp_default_params();
        mp.n_seqs = engine_n_seqs(S->eng);
        mp.ctx_size = engine_ctx_size(S->eng);
        mp.max_tokens = ep.max_batch_tokens < 512 ? ep.max_batch_tokens : 512;
        mp.n_threads = S->opt.threads;
        mp.kv_type = ep.kv_type;
        if (strcmp(es.backend, "cpu") != 0) {
            rc = FERRY_ERR_UNSUPPORTED;
            snprintf(S->load_err, sizeof S->load_err,
                     "--spec-type mtp runs on the CPU backend only (give --backend cpu)");
            goto done;
        }
        if ((rc = mtp_init(&S->mtp, S->mf, &mp, err))) {
            snprintf(S->load_err, sizeof S->load_err, "--spec-type mtp: %.200s (%s)", err,
                     ferry_status_str(rc));
            goto done;
        }
    }
    const char *tmpl = NULL, *fallback = "chatml";
    if (S->chat_template_text)
        tmpl = S->chat_template_text;
    else if (S->opt.chat_template)
        tmpl = chat_template_builtin(S->opt.chat_template);
    else if (S->mf->chat_template)
        tmpl = S->mf->chat_template;
    else { /* the family's default (weights/arch/) */
        const struct arch_family *fam = arch_of(&S->mf->hp);
        fallback = fam && fam->chat_template ? fam->chat_template : "chatml";
        tmpl = chat_template_builtin(fallback);
        FLOG_WARN("the model has no chat template: /v1/chat/completions uses the builtin '%s'", fallback);
    }
    if (!tmpl) {
        rc = FERRY_ERR_NOT_FOUND;
        snprintf(S->load_err, sizeof S->load_err, "no chat template available (--chat-template %s)",
                 S->opt.chat_template ? S->opt.chat_template : fallback);
        goto done;
    }
    char terr[256];
    if ((rc = chat_template_check(tmpl, terr))) { /* refused now, not with a 400 on every chat */
        snprintf(
            S->load_err, sizeof S->load_err,
            "the chat template does not compile: %.160s (use --chat-template NAME or --chat-template-file)",
            terr);
        goto done;
    }
    struct api_ctx *a = &S->api;
    a->tok = S->tok;
    a->model_name = S->model_name;
    a->model_aliases = S->names.list;
    a->any_model = S->opt.any_model;
    a->chat_tmpl = tmpl;
    int32_t bos = tokenizer_bos(S->tok), eos = tokenizer_eos(S->tok);
    a->bos_str = bos >= 0 ? tokenizer_token_str(S->tok, bos) : "";
    a->eos_str = eos >= 0 ? tokenizer_token_str(S->tok, eos) : "";
    a->ctx_size = engine_ctx_size(S->eng);
    int nv = engine_hparams(S->eng)->n_vocab, tv = tokenizer_n_vocab(S->tok);
    a->n_vocab = nv < tv ? nv : tv;
    a->default_seed = S->opt.seed;
    a->timeout = S->opt.timeout;
    a->tool_format = tool_format_of(tmpl);
    a->reasoning = strcmp(S->opt.reasoning_format, "none") != 0;
    a->fingerprint = "fp_" FERRY_BUILD_ID;
    a->embd_dim = engine_hparams(S->eng)->dim;
    a->pooling = !strcmp(S->opt.pooling, "last");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int st = S->opt.threads > 0 ? S->opt.threads : cores > 0 ? (int)cores : 1;
    struct sched_params sp = {
        .max_queue = S->opt.max_queue,
        .max_batch_tokens = ep.max_batch_tokens,
        .sample_threads = st > 8 ? 8 : st,
        .prompt_cache = S->opt.prompt_cache,
        .prefill_budget = S->opt.prefill_budget,
        .gpu_sampling = S->opt.gpu_sampling,
        .overlap = S->opt.overlap,
        .spec_n_max = S->dm || S->mtp || !strcmp(S->opt.spec_type, "ngram") ? S->opt.spec_draft_n_max : 0,
        .spec_n_min = S->opt.spec_draft_n_min,
        .spec_adapt = S->opt.spec_draft_adapt,
        .spec_p_min = (float)S->opt.spec_draft_p_min,
        .draft = S->dm,
        .mtp = S->mtp,
        .fair_share = S->opt.fair_share,
        .queue_timeout = S->opt.queue_timeout,
        /* llama.cpp's 4: a chat template's generation prompt, thinking tags included */
        .ckpt_tail =
            S->mf->hp.full_attn_interval > 0 && S->opt.ctx_checkpoints > 0 && S->opt.prompt_cache ? 4 : 0};
    rc = sched_init(&S->sched, S->eng, S->tok, &S->metrics, &sp);
    if (!rc) rc = sched_start(S->sched);
    if (!rc) a->kv_positions = sched_kv_positions(S->sched); /* a request that can never fit gets a 400 */
    if (rc) snprintf(S->load_err, sizeof S->load_err, "cannot start the scheduler: %s", ferry_status_str(rc));
done:
    S->load_rc = rc;
    pthread_mutex_lock(&S->load_mu);
    if (!S->abandoned) uv_async_send(&S->loaded);
    pthread_mutex_unlock(&S->load_mu);
}

/* Every TRIM_PERIOD_MS: freed heap memory goes back to the system. Connections come and go in bursts (a flood
 * fills every per-connection pool, 32 KiB each, then leaves), and glibc keeps what was freed inside its heaps
 * unless asked; malloc_trim returns whole free pages of every arena (memory in use stays). The resident size
 * then follows what is in use instead of the highest point so far. */
#define TRIM_PERIOD_MS 10000
static void on_trim_tick(uv_timer_t *t)
{
    (void)t;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

/* Closes the loop's handles so uv_run returns: every connection first (their requests end and no longer take
 * wake-ups), then the rest; the loaded handle stays open until the loader has sent. */
static void close_all(struct server *S)
{
    S->closing = 1;
    http_server_close(S->http);
    uv_handle_t *hs[] = {(uv_handle_t *)&S->sig_term,    (uv_handle_t *)&S->sig_int,
                         (uv_handle_t *)&S->drain_timer, (uv_handle_t *)&S->ping_timer,
                         (uv_handle_t *)&S->trim_timer,  (uv_handle_t *)&S->wake};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        if (!uv_is_closing(hs[i])) uv_close(hs[i], NULL);
    if (S->loader_started && !S->loader_done) {
        /* a load cannot be interrupted (a slow disk, a huge file): leave it behind, the process exits */
        pthread_mutex_lock(&S->load_mu);
        S->abandoned = 1;
        pthread_mutex_unlock(&S->load_mu);
    }
    if (!uv_is_closing((uv_handle_t *)&S->loaded)) uv_close((uv_handle_t *)&S->loaded, NULL);
}

static void on_loaded(uv_async_t *a)
{
    struct server *S = a->data;
    S->loader_done = 1;
    if (S->load_rc) {
        FLOG_ERROR("%s", S->load_err);
        __atomic_store_n(&S->state, STATE_FAILED, __ATOMIC_RELEASE);
        S->exit_code = 1;
        close_all(S);
        return;
    }
    pthread_mutex_lock(&S->metrics.mu);
    S->metrics.loading = 0;
    pthread_mutex_unlock(&S->metrics.mu);
    __atomic_store_n(&S->was_ready, 1, __ATOMIC_RELEASE);
    int expected = STATE_LOADING;
    __atomic_compare_exchange_n(&S->state, &expected, STATE_READY, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    if (S->closing) {
        close_all(S);
        return;
    }
    FLOG_INFO("model ready: %s (ctx %d, %d slots, max batch %d tokens, vocab %d)", S->model_name,
              S->api.ctx_size, S->opt.parallel, S->opt.max_batch_tokens, S->api.n_vocab);
    FLOG_INFO("open %s for the chat page; the API is at %sv1/", S->page_url, S->page_url);
}

static void on_drain_tick(uv_timer_t *t)
{
    struct server *S = t->data;
    double waited = sched_now() - S->drain_start;
    if (S->active_gen == 0) {
        FLOG_INFO("drained in %.2fs", waited);
        close_all(S);
        return;
    }
    /* the deadlines run from the first signal, or from a second one that cut the wait short; the log
     * reports the time since the first */
    const double over = S->drain_force > 0 ? sched_now() - S->drain_force + S->opt.shutdown_timeout : waited;
    if (!S->drain_cut && over >= S->opt.shutdown_timeout) {
        if (S->drain_force == 0)
            FLOG_WARN("shutdown timeout (%ds): cutting %d in-flight request(s)", S->opt.shutdown_timeout,
                      S->active_gen);
        if (S->loader_done && S->sched) sched_cancel_all(S->sched, FERRY_ERR_CANCELLED);
        S->drain_cut = 1;
    }
    /* requests cut but not ended (a client that reads nothing) get 5 s to go, 1 s after a second signal */
    if (over >= S->opt.shutdown_timeout + (S->drain_force > 0 ? 1.0 : 5.0)) {
        FLOG_WARN("giving up on %d request(s) %.2fs after the first signal", S->active_gen, waited);
        close_all(S);
    }
}

static void on_signal(uv_signal_t *sig, int signum)
{
    struct server *S = sig->data;
    if (serve_load_state(S) == STATE_DRAINING) {
        FLOG_WARN("second signal: cutting in-flight requests now");
        if (S->drain_force == 0) S->drain_force = sched_now();
        return;
    }
    FLOG_INFO("%s: draining (up to %ds), no new connections", signum == SIGTERM ? "SIGTERM" : "SIGINT",
              S->opt.shutdown_timeout);
    __atomic_store_n(&S->state, STATE_DRAINING, __ATOMIC_RELEASE);
    S->drain_start = sched_now();
    http_server_drain(S->http);
    uv_timer_start(&S->drain_timer, on_drain_tick, 0, 50);
}

/* Thousands of connections need thousands of descriptors: take the hard limit, and keep the connection cap
 * inside it (with room for the model, the log and the loop's own descriptors). */
static void fit_fd_limit(struct server *S)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl)) return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t want = rl.rlim_max;
        if (want > (1 << 20)) want = 1 << 20;
        if (want > rl.rlim_cur) {
            struct rlimit n = {want, rl.rlim_max};
            if (setrlimit(RLIMIT_NOFILE, &n) == 0) rl.rlim_cur = want;
        }
    }
    long room = (long)rl.rlim_cur - 64 - HTTP_LINGER_MAX;
    if (room < 16) room = 16;
    if (S->opt.max_connections > room) {
        FLOG_WARN("--max-connections %d does not fit the open-file limit (%ld): using %ld",
                  S->opt.max_connections, (long)rl.rlim_cur, room);
        S->opt.max_connections = (int)room;
    }
}

static int is_loopback_host(const char *host)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (!strcasecmp(host, "localhost")) return 1;
    if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
    return 0;
}

/* What can be known about the model file before the socket is bound, so that a wrong path or a file that is
 * not a model fails at once instead of after the port is taken: the path exists, a directory holds a
 * config.json, a file parses as GGUF (its header, metadata and tensor table; the weights are read by the
 * background load; a pipe or device is left to it). Fills general_name (the GGUF's general.name, or "") and
 * returns 0, or fills err. */
static int model_precheck(const char *path, char general_name[MODEL_NAME_LEN], char err[256])
{
    general_name[0] = 0;
    struct stat st;
    if (stat(path, &st)) {
        snprintf(err, 256, "cannot open model %.200s: %s", path, strerror(errno));
        return FERRY_ERR_NOT_FOUND;
    }
    if (S_ISDIR(st.st_mode)) {
        char cfg[4096];
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        if (access(cfg, R_OK)) {
            snprintf(err, 256,
                     "model %.100s is a directory without a readable config.json (a Hugging Face "
                     "model directory or a GGUF file is needed)",
                     path);
            return FERRY_ERR_NOT_FOUND;
        }
        return 0;
    }
    if (!S_ISREG(st.st_mode)) return 0; /* a pipe or a device: opening it may block; the load reports it */
    struct gguf *g = NULL;
    char gerr[256] = "";
    int rc = gguf_open(path, &g, gerr);
    if (rc) {
        snprintf(err, 256, "cannot load model %.100s: %.120s (%s)", path, gerr, ferry_status_str(rc));
        return rc;
    }
    struct gguf_str name;
    if (gguf_get_str(g, "general.name", &name) == FERRY_OK) {
        size_t n = name.len < MODEL_NAME_LEN - 1 ? name.len : MODEL_NAME_LEN - 1;
        memcpy(general_name, name.ptr, n);
        general_name[n] = 0;
    }
    gguf_close(g);
    return 0;
}

/* The address a browser on this machine can open for host:port (a wildcard host means any local address). */
static void page_url(const char *host, int port, char *out, size_t size)
{
    if (!strcmp(host, "0.0.0.0") || !*host)
        snprintf(out, size, "http://127.0.0.1:%d/", port);
    else if (!strcmp(host, "::"))
        snprintf(out, size, "http://[::1]:%d/", port);
    else if (strchr(host, ':'))
        snprintf(out, size, "http://[%s]:%d/", host, port);
    else
        snprintf(out, size, "http://%s:%d/", host, port);
}

/* --chat-template-file: the whole file, NUL-terminated (at most 1 MiB), or NULL. */
static char *read_template_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = malloc((1 << 20) + 1);
    size_t n = buf ? fread(buf, 1, (size_t)1 << 20, f) : 0;
    int more = buf && fgetc(f) != EOF;
    fclose(f);
    if (!buf || more || n == 0) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

int serve_main(int argc, char **argv)
{
    struct server *S = calloc(1, sizeof *S);
    if (!S) {
        fprintf(stderr, "ferry serve: out of memory\n");
        return 1;
    }
    char err[256] = "";
    int ret = 1;
    S->opt = serve_options_default();
    if (serve_options_parse(&S->opt, argc, argv, err)) {
        fprintf(stderr, "ferry serve: %s\n", err);
        goto out_free;
    }
    if (S->opt.help) {
        serve_options_help(stdout);
        ret = 0;
        goto out_free;
    }
    if (opt_gpus_single(&S->opt.gpus, err)) {
        fprintf(stderr, "ferry serve: %s\n", err);
        goto out_free;
    }
    cli_log_init((enum log_level)cli_log_level_parse(S->opt.log_level));
    if (S->opt.hf_repo) {
        if (S->opt.model && !getenv("FERRY_MODEL")) {
            fprintf(stderr, "ferry serve: give --model or --hf-repo, not both\n");
            goto out_free;
        }
        if (cli_pull_model(S->opt.hf_repo, S->pulled_model, sizeof S->pulled_model)) goto out_free;
        S->opt.model = S->pulled_model;
    }
    if (!S->opt.model) {
        fprintf(stderr, "ferry serve: --model PATH (or FERRY_MODEL, or --hf-repo) is required; see --help\n");
        goto out_free;
    }
    if (serve_options_load_key_file(&S->opt, err)) {
        fprintf(stderr, "ferry serve: %s\n", err);
        goto out_free;
    }
    if (S->opt.chat_template_file &&
        !(S->chat_template_text = read_template_file(S->opt.chat_template_file))) {
        fprintf(stderr,
                "ferry serve: cannot read --chat-template-file %s (missing, unreadable or over 1 MiB)\n",
                S->opt.chat_template_file);
        goto out_free;
    }
    if (S->opt.chat_template && !chat_template_builtin(S->opt.chat_template)) {
        fprintf(stderr, "ferry serve: --chat-template %s is not a builtin template\n", S->opt.chat_template);
        goto out_free;
    }
    char general_name[MODEL_NAME_LEN];
    if (model_precheck(S->opt.model, general_name, err)) {
        fprintf(stderr, "ferry serve: %s\n", err);
        goto out_free;
    }
    model_names_build(&S->names, S->opt.model, general_name, S->opt.served_model_name);
    if (!strcmp(S->opt.spec_type, "draft") && !S->opt.model_draft) {
        fprintf(stderr, "ferry serve: --spec-type draft needs --model-draft PATH\n");
        goto out_free;
    }
    if (S->opt.model_draft && strcmp(S->opt.spec_type, "none") && strcmp(S->opt.spec_type, "draft")) {
        fprintf(stderr, "ferry serve: --model-draft goes with --spec-type draft, not %s\n", S->opt.spec_type);
        goto out_free;
    }
    char draft_name[MODEL_NAME_LEN];
    if (S->opt.model_draft && model_precheck(S->opt.model_draft, draft_name, err)) {
        fprintf(stderr, "ferry serve: --model-draft: %s\n", err);
        goto out_free;
    }
    char arch_err[512];
    if (gpu_arch_check(S->opt.backend, arch_err)) {
        fprintf(stderr, "ferry serve: %s\n", arch_err);
        goto out_free;
    }
    snprintf(S->model_name, sizeof S->model_name, "%s", S->names.n ? S->names.name[0] : "model");
    signal(SIGPIPE, SIG_IGN);
    S->t_start = sched_now();
    json_set_alloc_funcs(api_json_alloc, free);
    fit_fd_limit(S);
    pthread_mutex_init(&S->load_mu, NULL);
    pthread_mutex_init(&S->wake_mu, NULL);
    metrics_init(&S->metrics);
    S->state = STATE_LOADING;

    if (uv_loop_init(&S->loop)) {
        FLOG_ERROR("cannot start the event loop");
        goto out_mutex;
    }
    struct http_params hp = {
        .host = S->opt.host,
        .port = S->opt.port,
        .max_connections = S->opt.max_connections,
        .max_per_ip = S->opt.max_connections_per_ip,
        .idle_timeout = S->opt.conn_timeout,
        .header_timeout = S->opt.header_timeout,
        .body_timeout = S->opt.body_timeout,
        .body_limit = S->opt.body_limit,
    };
    struct http_handlers hh = {routes_on_head, routes_on_request, routes_on_end, routes_on_drain, S};
    if (http_server_init(&S->http, &S->loop, &hp, &hh, err)) {
        FLOG_ERROR("%s", err);
        uv_run(&S->loop, UV_RUN_DEFAULT);
        uv_loop_close(&S->loop);
        goto out_mutex;
    }
    page_url(S->opt.host, http_server_port(S->http), S->page_url, sizeof S->page_url);
    FLOG_INFO("listening on http://%s:%d (model %s loading in the background)", S->opt.host,
              http_server_port(S->http), S->model_name);
    if (S->names.n > 1) {
        char also[4 * MODEL_NAME_LEN] = "";
        for (int i = 1; i < S->names.n; i++)
            snprintf(also + strlen(also), sizeof also - strlen(also), "%s'%s'", i > 1 ? ", " : "",
                     S->names.name[i]);
        FLOG_INFO("requests may name the model '%s' or %s", S->model_name, also);
    }
    if (S->opt.n_api_keys == 0 && !is_loopback_host(S->opt.host))
        FLOG_WARN(
            "serving on %s without an API key: anyone who can reach this address can use the model "
            "(set --api-key or --api-key-file; browsers are held off by the Host and Content-Type checks)",
            S->opt.host);

    uv_async_init(&S->loop, &S->loaded, on_loaded);
    S->loaded.data = S;
    uv_async_init(&S->loop, &S->wake, routes_on_wake);
    S->wake.data = S;
    uv_signal_init(&S->loop, &S->sig_term);
    uv_signal_init(&S->loop, &S->sig_int);
    S->sig_term.data = S->sig_int.data = S;
    uv_signal_start(&S->sig_term, on_signal, SIGTERM);
    uv_signal_start(&S->sig_int, on_signal, SIGINT);
    uv_timer_init(&S->loop, &S->drain_timer);
    S->drain_timer.data = S;
    uv_timer_init(&S->loop, &S->ping_timer);
    S->ping_timer.data = S;
    uv_timer_start(&S->ping_timer, routes_on_ping, 1000, 1000);
    uv_timer_init(&S->loop, &S->trim_timer);
    uv_timer_start(&S->trim_timer, on_trim_tick, TRIM_PERIOD_MS, TRIM_PERIOD_MS);
    if (uv_thread_create(&S->loader, loader_main, S)) {
        FLOG_ERROR("cannot start the loader thread");
        S->exit_code = 1;
        close_all(S);
    } else {
        S->loader_started = 1;
    }
    uv_run(&S->loop, UV_RUN_DEFAULT);
    uv_loop_close(&S->loop);

    /* in dependency order, reversed: no connections are left; then the engine thread, then what it used */
    http_server_free(S->http);
    if (S->abandoned) {
        FLOG_WARN("shut down while the model was loading; not waiting for the load");
        ret = S->exit_code;
        FLOG_INFO("ferry serve: exit %d", ret);
        return ret; /* S stays allocated: the loader thread still uses it until the process exits */
    }
    if (S->loader_started) uv_thread_join(&S->loader);
    sched_free(S->sched);
    routes_wake_drain(S); /* no wake-up comes any more */
    engine_free(S->eng);
    draft_model_free(S->dm);
    mtp_free(S->mtp);
    tokenizer_free(S->tok);
    model_file_close(S->mf);
    model_file_close(S->mf_draft);
    ret = S->exit_code;
    FLOG_INFO("ferry serve: exit %d", ret);
out_mutex:
    metrics_free(&S->metrics);
    pthread_mutex_destroy(&S->wake_mu);
    pthread_mutex_destroy(&S->load_mu);
out_free:
    free(S->chat_template_text);
    serve_options_free(&S->opt);
    free(S);
    return ret;
}
