/* cli_bench — `ferry bench`: prefill and decode throughput of the engine, next to the ceilings it measures.
 *
 *   ferry bench (--model PATH | --synthetic llama-2-7b|llama-3-8b|llama-2-13b|llama-2-70b|qwen3-8b|
 *                gemma-3-12b|phi-4|qwen3-30b-a3b|gpt-oss-20b|gpt-oss-120b) [--gpu-memory SIZE]
 *               [--gpu-layers N] [--batches 1,4,16,64] [--prefill 512] [--decode-steps 32] [--context 450]
 *               [--long-context 8192] [--spec-oracle K [--spec-accept P]] [--cpu] [--json]
 * Each figure is a median over repeated timed steps after a warm-up step. Decode at batch B: B sequences with
 * a prompt of --context tokens each (default 32), then steps of one token per sequence; tokens/s = B / step
 * time. Weight bandwidth = weight bytes read per step / step time (the ceiling is the measured
 * device-to-device copy rate); with streamed layers the achieved link rate is bytes streamed / copy time
 * (ceiling: the measured pinned copy). Next to each measured step: where the step plan ran its host layers
 * (CPU / streamed), the time the host's cores spent in them, and the plan's predicted step time
 * (runtime/step_plan.h).
 * --spec-oracle K: one sequence decoded by speculation (runtime/spec.h) with a drafter that proposes K tokens
 * a step, each accepted with probability P until the first rejection (1: the target's own next tokens, the
 * mechanism's ceiling). A step's cost does not depend on the token values, so the acceptance is drawn, not
 * checked; the rejected rows' positions are cut from the KV cache as in serving. Reported beside one-row
 * steps of the same sequence.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/core/status.h"
#include "kernels/cpu/matmul.h"
#include "runtime/engine.h"
#include "runtime/spec.h"
#include "runtime/synthetic.h"
#include "server/cli.h"
#include "server/options.h"

#define MAX_BATCHES 8

static void bench_usage(FILE *f)
{
    fprintf(
        f,
        "usage: ferry bench (--model PATH | --synthetic NAME) [options]\n\n"
        "  --model PATH          GGUF file or Hugging Face directory\n"
        "  --synthetic NAME      random weights of a real shape, no file: llama-2-7b, llama-3-8b,\n"
        "                        llama-2-13b, llama-2-70b, qwen3-8b, gemma-3-12b, phi-4 (in --dtype);\n"
        "                        expert models in the types of their usual GGUF, random blocks written\n"
        "                        directly: qwen3-30b-a3b (Q4_K_M, 18.6 GB), gpt-oss-20b (MXFP4 experts,\n"
        "                        Q8_0 else; 12.1 GB), gpt-oss-120b (63.4 GB). Host memory: those bytes,\n"
        "                        plus on a GPU the pinned copy of what is placed in host memory\n"
        "  --dtype f16|bf16|f32  synthetic weight type (default f16; expert models: the tensors their mix\n"
        "                        keeps unquantized)\n"
        "  --gpu-memory SIZE     device budget, e.g. 4GiB (default: free VRAM minus --reserve-vram)\n"
        "  --gpus N              the CUDA device (default 0, the first; several: not implemented yet,\n"
        "                        `ferry inspect --gpus 0,1 --gpu-memory 20GiB,12GiB` shows their plan)\n"
        "  --reserve-vram SIZE   (default 1GiB)\n"
        "  --gpu-layers N        resident layers (default: as many as fit)\n"
        "  --ring-layers K       streaming ring size in layers (default: planner's choice)\n"
        "  --cpu-moe N           expert models: the experts of the first N layers in host memory, computed\n"
        "                        by the CPU (default: as few as the budget needs)\n"
        "  --expert-cache SIZE   expert models: device memory for a cache of the host layers' most used\n"
        "                        experts (default auto: what the budget leaves; 0: none)\n"
        "  --quant int8|int4     quantize the weights at load (llama.cpp's Q8_0 / Q4_K_M mix)\n"
        "  --placement MODE      host layers (those that do not fit): auto (per step size, the faster of\n"
        "                        streaming and computing on the CPU), stream, cpu (default auto)\n"
        "  --cpu-threads N       host threads computing host layers (default: --threads)\n"
        "  --cpu-arith auto|f32|int8  CPU products with block-type weights: x in f32 or in int8 blocks\n"
        "                        (llama.cpp's arithmetic, faster); auto (default): int8 for a GPU engine's\n"
        "                        host layers; on the CPU backend int8 for K-quant and Q8_0 files, else f32;\n"
        "                        F16/BF16 products of 32+ rows on AMX tiles (bf16) with int8, and with\n"
        "                        auto in a GPU engine's host layers\n"
        "  --kv-type f16|f32|q8_0 the KV cache (default f16; f32 on the CPU backend only)\n"
        "  --swa-full            sliding-window layers keep every position in the KV cache (by default\n"
        "                        they keep only their window, on the CPU and on the GPU)\n"

        "  --cpu                 run on the CPU backend even when a GPU is present\n"
        "  --cpu-isa NAME        cap the instruction set of the CPU products (portable, avx2, avx-vnni,\n"
        "                        avx512-vnni; default: the best the CPU has), to measure another host's "
        "path\n"
        "  --threads N           CPU threads (default: all cores)\n"
        "  --batches LIST        decode batch sizes (default 1,4,16,64)\n"
        "  --prefill N           prompt length of the prefill test (default 512; 0 = skip)\n"
        "  --decode-steps N      timed decode steps per batch size (default 16)\n"
        "  --context N           the decode batches' context: each sequence's prompt (default 32). Given,\n"
        "                        the KV pool is sized as ferry serve sizes it (to the budget, with its\n"
        "                        extension in host memory when layers stream) for the largest batch\n"
        "  --long-context N      also decode one sequence at context N (default 0 = skip)\n"
        "  --spec-oracle K       also decode one sequence by speculation, K drafted tokens a step (1..32)\n"
        "  --spec-accept P       each draft accepted with probability P until the first rejection\n"
        "                        (default 1: every draft, the ceiling)\n"
        "  --json                print the results as JSON\n");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

struct bench_ctx {
    struct engine *e;
    int n_vocab;
    int32_t *tok, *pos, *seq;
    uint8_t *want;
    float *logits;
    int max_tokens;
};

/* Prefills `len` tokens into slot s, in chunks of the engine's batch size. */
static int prefill_slot(struct bench_ctx *c, int s, int len)
{
    for (int start = 0; start < len; start += c->max_tokens) {
        int n = len - start < c->max_tokens ? len - start : c->max_tokens;
        for (int i = 0; i < n; i++) {
            c->tok[i] = (int32_t)((start + i) * 7 + s * 13 + 1) % c->n_vocab;
            c->pos[i] = start + i;
            c->seq[i] = s;
            c->want[i] = start + i == len - 1;
        }
        struct batch b = {
            .n_tokens = n, .tokens = c->tok, .pos = c->pos, .seq = c->seq, .want_logits = c->want};
        int rc = engine_step(c->e, &b, c->logits);
        if (rc) return rc;
    }
    return FERRY_OK;
}

/* One decode step for slots 0..B-1 at position p. */
static int decode_step(struct bench_ctx *c, int B, int p)
{
    for (int s = 0; s < B; s++) {
        c->tok[s] = (int32_t)(p * 31 + s) % c->n_vocab;
        c->pos[s] = p;
        c->seq[s] = s;
        c->want[s] = 1;
    }
    struct batch b = {.n_tokens = B, .tokens = c->tok, .pos = c->pos, .seq = c->seq, .want_logits = c->want};
    return engine_step(c->e, &b, c->logits);
}

struct spec_result {
    int k;
    double accept;
    double plain_step_s, spec_step_s; /* medians: one row; K+1 rows */
    double plain_tok_s, spec_tok_s;   /* tokens emitted / wall time */
    double tokens_per_step;
};

/* Decodes slot 0 from position ctx0: `steps` one-row steps, then `steps` verification steps of k drafts, each
 * accepted with probability accept until the first rejection; the rejected positions are cut back. */
static int bench_spec(struct bench_ctx *c, int ctx0, int steps, int k, double accept, double *times,
                      struct spec_result *r)
{
    int rc = prefill_slot(c, 0, ctx0);
    int p = ctx0, emitted = 0;
    double total = 0;
    int32_t draft[SPEC_MAX_DRAFT];
    for (int i = 0; i <= steps && !rc; i++) { /* step 0 warms up */
        double t0 = now_s();
        rc = spec_step(c->e, 0, (int32_t)(p * 31) % c->n_vocab, p, NULL, 0, c->logits);
        if (i) times[i - 1] = now_s() - t0, total += times[i - 1];
        p++;
    }
    if (rc) return rc;
    qsort(times, (size_t)steps, sizeof *times, cmp_double);
    r->plain_step_s = times[steps / 2];
    r->plain_tok_s = steps / total;
    unsigned rng = 0x9e3779b9u;
    total = 0;
    for (int i = 0; i <= steps && !rc; i++) {
        for (int j = 0; j < k; j++) draft[j] = (int32_t)((p + 1 + j) * 31) % c->n_vocab;
        double t0 = now_s();
        rc = spec_step(c->e, 0, (int32_t)(p * 31) % c->n_vocab, p, draft, k, c->logits);
        int a = 0;
        while (a < k) {
            rng = rng * 1664525u + 1013904223u;
            if ((rng >> 8) * (1.0 / 16777216.0) >= accept) break;
            a++;
        }
        if (!rc && a < k) rc = engine_seq_keep(c->e, 0, p + 1 + a) == p + 1 + a ? 0 : FERRY_ERR_INVALID;
        if (i) times[i - 1] = now_s() - t0, total += times[i - 1], emitted += a + 1;
        p += a + 1;
    }
    engine_seq_free(c->e, 0);
    if (rc) return rc;
    qsort(times, (size_t)steps, sizeof *times, cmp_double);
    r->k = k;
    r->accept = accept;
    r->spec_step_s = times[steps / 2];
    r->spec_tok_s = emitted / total;
    r->tokens_per_step = (double)emitted / steps;
    return 0;
}

struct decode_result {
    int batch;
    int n_cpu, n_stream, n_park; /* the step plan of this batch size: host layers on the CPU, streamed (of
                                  * them parked) */
    double predicted_s;          /* the plan's prediction (0: none) */
    double host_ms;              /* per step: time the host's cores spent in host layers */
    double step_s;               /* median */
    double tok_s;
    double weight_gbs; /* weight bytes / step time */
    double link_gbs;   /* streamed bytes / copy time (0 when nothing streams) */
    double stall_ms;   /* per step */
    /* The expert cache over the timed steps (zero without one): the share of chosen experts that hit, and
     * per step the bytes fetched and the experts the host's cores computed. */
    double ec_hit, ec_fetch_mib, ec_host;
};

int cli_bench_main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},
        {"synthetic", required_argument, 0, 's'},
        {"dtype", required_argument, 0, 'd'},
        {"gpu-memory", required_argument, 0, 'g'},
        {"gpus", required_argument, 0, 'G'},
        {"reserve-vram", required_argument, 0, 'r'},
        {"gpu-layers", required_argument, 0, 'l'},
        {"ring-layers", required_argument, 0, 'k'},
        {"cpu-moe", required_argument, 0, 'E'},
        {"expert-cache", required_argument, 0, 'X'},
        {"cpu", no_argument, 0, 'c'},
        {"threads", required_argument, 0, 't'},
        {"batches", required_argument, 0, 'b'},
        {"prefill", required_argument, 0, 'p'},
        {"decode-steps", required_argument, 0, 'n'},
        {"long-context", required_argument, 0, 'L'},
        {"context", required_argument, 0, 'C'},
        {"json", no_argument, 0, 'j'},
        {"log-level", required_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {"quant", required_argument, 0, 'q'},
        {"placement", required_argument, 0, 'P'},
        {"cpu-threads", required_argument, 0, 'T'},
        {"cpu-arith", required_argument, 0, 'A'},
        {"kv-type", required_argument, 0, 'K'},
        {"swa-full", no_argument, 0, 'W'},
        {"cpu-isa", required_argument, 0, 'S'},
        {"spec-oracle", required_argument, 0, 'O'},
        {"spec-accept", required_argument, 0, 'a'},
        {0, 0, 0, 0},
    };
    const char *model = NULL, *synthetic = NULL;
    enum dtype wt = DTYPE_F16;
    struct engine_params ep = engine_default_params();
    int batches[MAX_BATCHES] = {1, 4, 16, 64}, n_batches = 4, prefill = 512, steps = 16, long_ctx = 0,
        as_json = 0, prompt = 32, serve_pool = 0, spec_k = 0;
    double spec_accept = 1.0;
    int log_level = LOG_LEVEL_INFO, c;
    struct opt_gpus gpus = opt_gpus_default();
    char gerr[256] = "";
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 's':
            synthetic = optarg;
            break;
        case 'd':
            /* f32 | f16 | bf16: a plain type of the table */
            if (dtype_from_name(optarg) < 0 ||
                dtype_get_traits((uint32_t)dtype_from_name(optarg))->is_quantized)
                goto bad;
            wt = (enum dtype)dtype_from_name(optarg);
            break;
        case 'g':
            if (opt_gpus_parse_memory(&gpus, optarg, gerr)) goto bad_gpus;
            ep.gpu_memory = gpus.memory[0];
            break;
        case 'G':
            if (opt_gpus_parse(&gpus, optarg, gerr)) goto bad_gpus;
            break;
        case 'r':
            if (opt_parse_size(optarg, &ep.reserve_vram)) goto bad;
            break;
        case 'l':
            ep.gpu_layers = atoi(optarg);
            break;
        case 'k':
            ep.ring_layers = atoi(optarg);
            break;
        case 'E':
            ep.cpu_moe = atoi(optarg);
            break;
        case 'X':
            if (opt_parse_size_auto(optarg, &ep.expert_cache)) goto bad;
            break;
        case 'c':
            ep.backend = ENGINE_BACKEND_CPU;
            break;
        case 'q': {
            const int q = engine_quant_parse(optarg);
            if (q < 0) goto bad;
            ep.quant = (enum engine_quant)q;
            break;
        }
        case 't':
            ep.n_threads = atoi(optarg);
            break;
        case 'A':
            if (strcmp(optarg, "auto") && strcmp(optarg, "f32") && strcmp(optarg, "int8")) goto bad;
            ep.cpu_int8 = !strcmp(optarg, "int8") ? 1 : !strcmp(optarg, "f32") ? 0 : -1;
            break;
        case 'K':
            if ((ep.kv_type = engine_kv_type_parse(optarg)) < 0) goto bad;
            break;
        case 'W':
            ep.swa_full = 1;
            break;
        case 'S': {
            const int isa = kern_cpu_isa_parse(optarg);
            if (isa < 0) goto bad;
            kern_cpu_isa_limit((enum kern_cpu_isa)isa);
            break;
        }
        case 'P':
            if (!strcmp(optarg, "auto"))
                ep.placement = ENGINE_PLACEMENT_AUTO;
            else if (!strcmp(optarg, "stream"))
                ep.placement = ENGINE_PLACEMENT_STREAM;
            else if (!strcmp(optarg, "cpu"))
                ep.placement = ENGINE_PLACEMENT_CPU;
            else
                goto bad;
            break;
        case 'T':
            if ((ep.cpu_threads = atoi(optarg)) <= 0) goto bad;
            break;
        case 'b': {
            n_batches = 0;
            for (char *tok = strtok(optarg, ","); tok && n_batches < MAX_BATCHES; tok = strtok(NULL, ","))
                if ((batches[n_batches++] = atoi(tok)) <= 0) goto bad;
            if (!n_batches) goto bad;
            break;
        }
        case 'p':
            prefill = atoi(optarg);
            break;
        case 'n':
            steps = atoi(optarg);
            break;
        case 'L':
            long_ctx = atoi(optarg);
            break;
        case 'C':
            if ((prompt = atoi(optarg)) <= 0) goto bad;
            serve_pool = 1;
            break;
        case 'j':
            as_json = 1;
            break;
        case 'O':
            if ((spec_k = atoi(optarg)) < 1 || spec_k > SPEC_MAX_DRAFT) goto bad;
            break;
        case 'a': {
            char *end;
            spec_accept = strtod(optarg, &end);
            if (*end || !(spec_accept >= 0 && spec_accept <= 1)) goto bad;
            break;
        }
        case 'v':
            if ((log_level = cli_log_level_parse(optarg)) < 0) goto bad;
            break;
        case 'h':
            bench_usage(stdout);
            return 0;
        default:
            goto bad;
        }
    }
    if (!model == !synthetic || prefill < 0 || steps <= 0 || long_ctx < 0) goto bad;
    if (opt_gpus_check(&gpus, gerr) || opt_gpus_single(&gpus, gerr)) goto bad_gpus;
    cli_log_init(log_level);

    int max_b = 1;
    for (int i = 0; i < n_batches; i++)
        if (batches[i] > max_b) max_b = batches[i];
    ep.n_seqs = max_b;
    ep.max_batch_tokens = prefill > max_b ? (prefill > 512 ? 512 : prefill) : max_b;
    if (ep.max_batch_tokens < max_b) ep.max_batch_tokens = max_b;
    if (serve_pool) ep.max_batch_tokens = 512; /* ferry serve's default: the prompts go in 512-token chunks */
    ep.ctx_size = long_ctx + prompt + steps + 8 > prefill + 8 ? long_ctx + prompt + steps + 8 : prefill + 8;
    if (ep.ctx_size < prompt + steps + 8) ep.ctx_size = prompt + steps + 8;
    /* --spec-oracle: one sequence grows by up to k + 1 positions a step, after as many one-row steps */
    const int spec_len = spec_k ? prompt + (steps + 1) * (spec_k + 2) + 8 : 0;
    if (ep.ctx_size < spec_len) ep.ctx_size = spec_len;
    if (ep.max_batch_tokens < spec_k + 1) ep.max_batch_tokens = spec_k + 1;
        /* The pool holds the largest test, each sequence in whole blocks: a decode batch of max_b sequences,
         * one prefill, one long-context sequence (llama-batched-bench's -c is sized the same way, with no
         * slack). */
#define BLOCKS(n) (((n) + ENGINE_KV_BLOCK - 1) / ENGINE_KV_BLOCK * ENGINE_KV_BLOCK)
    int need = max_b * BLOCKS(prompt + steps + 2);
    if (BLOCKS(prefill + 16) > need) need = BLOCKS(prefill + 16);
    if (BLOCKS(long_ctx + steps + 16) > need) need = BLOCKS(long_ctx + steps + 16);
    if (BLOCKS(spec_len + 16) > need) need = BLOCKS(spec_len + 16);
#undef BLOCKS
    /* --context: the pool ferry serve would size for max_b sequences of ctx_size (0 = sized by the engine).
     */
    ep.kv_tokens = serve_pool ? 0 : need;

    struct model_file *mf = NULL;
    struct engine *e = NULL;
    char err[256] = "";
    int rc;
    const char *name = model;
    double t_load = now_s();
    if (synthetic) {
        const struct synthetic_shape *sh = synthetic_shape_find(synthetic);
        if (!sh) {
            fprintf(stderr, "ferry bench: unknown synthetic model '%s' (%s)\n", synthetic,
                    synthetic_shape_names());
            return 2;
        }
        struct llm_hparams hp;
        int ftype;
        synthetic_hparams(sh, &hp, &ftype);
        name = synthetic;
        rc = engine_init_synthetic_mix(&e, &hp, wt, ftype, &ep, err);
    } else {
        if (cli_open_model(model, &mf)) return 1;
        rc = engine_init(&e, mf, &ep, err);
    }
    if (rc) {
        fprintf(stderr, "ferry bench: %s (%s)\n", err, ferry_status_str(rc));
        model_file_close(mf);
        return 1;
    }
    t_load = now_s() - t_load;

    struct bench_ctx bc = {.e = e, .n_vocab = engine_hparams(e)->n_vocab, .max_tokens = ep.max_batch_tokens};
    int rows = ep.max_batch_tokens;
    bc.tok = malloc((size_t)rows * 3 * sizeof(int32_t));
    bc.pos = bc.tok + rows;
    bc.seq = bc.tok + 2 * rows;
    bc.want = malloc((size_t)rows);
    bc.logits = malloc((size_t)rows * bc.n_vocab * sizeof(float));
    double *times = malloc(((size_t)steps + 4) * sizeof(double));
    if (!bc.tok || !bc.want || !bc.logits || !times) {
        fprintf(stderr, "ferry bench: out of memory\n");
        return 1;
    }
    struct engine_stats st0, st1;
    engine_get_stats(e, &st0);
    const double h2d = st0.h2d_bytes_per_s, d2d = st0.hbm_bytes_per_s;
    const double wbytes = (double)engine_weight_bytes(e);

    /* Prefill: one sequence, `prefill` tokens, timed twice after a warm-up; report the better. */
    double prefill_tok_s = 0;
    if (prefill > 0) {
        double best = 1e30;
        for (int r = 0; r < 3 && !rc; r++) {
            engine_seq_free(e, 0);
            double t0 = now_s();
            rc = prefill_slot(&bc, 0, prefill);
            double t = now_s() - t0;
            if (r > 0 && t < best) best = t;
        }
        engine_seq_free(e, 0);
        if (rc) goto step_failed;
        prefill_tok_s = prefill / best;
    }
    struct engine_step_info prefill_info = {0};
    if (prefill > 0)
        engine_step_info(e, prefill < ep.max_batch_tokens ? prefill : ep.max_batch_tokens, &prefill_info);

    struct decode_result res[MAX_BATCHES + 1];
    int n_res = 0;
    for (int bi = 0; bi <= n_batches; bi++) {
        int B = bi < n_batches ? batches[bi] : 1;
        int ctx0 = prompt;
        if (bi == n_batches) {
            if (!long_ctx) break;
            ctx0 = long_ctx;
        }
        for (int s = 0; s < B && !rc; s++) rc = prefill_slot(&bc, s, ctx0);
        if (!rc) rc = decode_step(&bc, B, ctx0); /* warm-up */
        engine_get_stats(e, &st0);
        for (int i = 0; i < steps && !rc; i++) {
            double t0 = now_s();
            rc = decode_step(&bc, B, ctx0 + 1 + i);
            times[i] = now_s() - t0;
        }
        engine_get_stats(e, &st1);
        for (int s = 0; s < B; s++) engine_seq_free(e, s);
        if (rc) goto step_failed;
        qsort(times, (size_t)steps, sizeof *times, cmp_double);
        struct decode_result *r = &res[n_res++];
        r->batch = B;
        r->step_s = times[steps / 2];
        r->tok_s = B / r->step_s;
        r->weight_gbs = wbytes / r->step_s / 1e9;
        double copy = st1.copy_seconds - st0.copy_seconds;
        r->link_gbs = copy > 0 ? (double)(st1.bytes_streamed - st0.bytes_streamed) / copy / 1e9 : 0;
        r->stall_ms = (st1.stall_seconds - st0.stall_seconds) / steps * 1e3;
        r->host_ms = (st1.cpu_layer_seconds - st0.cpu_layer_seconds) / steps * 1e3;
        const struct expert_cache_stats *c0 = &st0.expert_cache, *c1 = &st1.expert_cache;
        r->ec_hit =
            c1->chosen > c0->chosen ? (double)(c1->hits - c0->hits) / (double)(c1->chosen - c0->chosen) : 0;
        r->ec_fetch_mib = (double)(c1->fetch_bytes - c0->fetch_bytes) / steps / 1048576.0;
        r->ec_host = (double)(c1->host - c0->host) / steps;
        struct engine_step_info info;
        engine_step_info(e, B, &info);
        r->n_cpu = info.n_cpu;
        r->n_stream = info.n_stream;
        r->n_park = info.n_park;
        r->predicted_s = info.predicted_s;
        if (bi == n_batches) r->batch = -long_ctx; /* marks the long-context row */
    }
    struct spec_result sr = {0};
    if (spec_k && (rc = bench_spec(&bc, prompt, steps, spec_k, spec_accept, times, &sr))) goto step_failed;
    engine_get_stats(e, &st1);

    if (as_json) {
        json_t *root = json_object(), *dec = json_array();
        json_object_set_new(root, "model", json_string(name));
        json_object_set_new(root, "backend", json_string(st1.backend));
        json_object_set_new(root, "placement", json_string(engine_placement(e)));
        json_object_set_new(root, "weight_bytes", json_integer((json_int_t)wbytes));
        json_object_set_new(root, "load_seconds", json_real(t_load));
        json_object_set_new(root, "ceiling_h2d_gbs", json_real(h2d / 1e9));
        json_object_set_new(root, "ceiling_hbm_gbs", json_real(d2d / 1e9));
        json_object_set_new(root, "prefill_tokens", json_integer(prefill));
        json_object_set_new(root, "prefill_tok_s", json_real(prefill_tok_s));
        json_object_set_new(root, "prefill_predicted_ms", json_real(prefill_info.predicted_s * 1e3));
        json_object_set_new(root, "prefill_cpu_layers", json_integer(prefill_info.n_cpu));
        json_object_set_new(root, "prefill_parked_layers", json_integer(prefill_info.n_park));
        json_object_set_new(root, "placement_mode",
                            json_string(ep.placement == ENGINE_PLACEMENT_STREAM ? "stream"
                                        : ep.placement == ENGINE_PLACEMENT_CPU  ? "cpu"
                                                                                : "auto"));
        json_object_set_new(root, "cpu_threads", json_integer(st1.cpu_threads));
        json_object_set_new(root, "vram_budget", json_integer((json_int_t)st1.vram_budget));
        json_object_set_new(root, "vram_planned", json_integer((json_int_t)st1.vram_planned));
        json_object_set_new(root, "vram_taken", json_integer((json_int_t)st1.vram_used));
        json_object_set_new(root, "host_pace", json_real(st1.host_pace));
        json_object_set_new(root, "plan_revisions", json_integer(st1.plan_revisions));
        json_object_set_new(root, "expert_cache_slots", json_integer(st1.expert_cache.slots));
        json_object_set_new(root, "expert_cache_bytes",
                            json_integer((json_int_t)st1.expert_cache.slot_bytes));
        for (int i = 0; i < n_res; i++) {
            json_t *d = json_object();
            json_object_set_new(d, "batch", json_integer(res[i].batch > 0 ? res[i].batch : 1));
            json_object_set_new(d, "context", json_integer(res[i].batch > 0 ? prompt : -res[i].batch));
            json_object_set_new(d, "step_ms", json_real(res[i].step_s * 1e3));
            json_object_set_new(d, "tok_s", json_real(res[i].tok_s));
            json_object_set_new(d, "weight_gbs", json_real(res[i].weight_gbs));
            json_object_set_new(d, "link_gbs", json_real(res[i].link_gbs));
            json_object_set_new(d, "stall_ms_per_step", json_real(res[i].stall_ms));
            json_object_set_new(d, "cpu_layers", json_integer(res[i].n_cpu));
            json_object_set_new(d, "streamed_layers", json_integer(res[i].n_stream));
            json_object_set_new(d, "parked_layers", json_integer(res[i].n_park));
            json_object_set_new(d, "host_ms_per_step", json_real(res[i].host_ms));
            json_object_set_new(d, "predicted_step_ms", json_real(res[i].predicted_s * 1e3));
            if (st1.expert_cache.slots) {
                json_object_set_new(d, "expert_cache_hit_rate", json_real(res[i].ec_hit));
                json_object_set_new(d, "expert_cache_fetched_mib_per_step", json_real(res[i].ec_fetch_mib));
                json_object_set_new(d, "host_experts_per_step", json_real(res[i].ec_host));
            }
            json_array_append_new(dec, d);
        }
        json_object_set_new(root, "decode", dec);
        if (spec_k) {
            json_t *sp = json_object();
            json_object_set_new(sp, "draft", json_integer(sr.k));
            json_object_set_new(sp, "accept", json_real(sr.accept));
            json_object_set_new(sp, "context", json_integer(prompt));
            json_object_set_new(sp, "plain_step_ms", json_real(sr.plain_step_s * 1e3));
            json_object_set_new(sp, "spec_step_ms", json_real(sr.spec_step_s * 1e3));
            json_object_set_new(sp, "tokens_per_step", json_real(sr.tokens_per_step));
            json_object_set_new(sp, "plain_tok_s", json_real(sr.plain_tok_s));
            json_object_set_new(sp, "spec_tok_s", json_real(sr.spec_tok_s));
            json_object_set_new(root, "speculative", sp);
        }
        char *s = json_dumps(root, JSON_INDENT(2));
        if (s) puts(s);
        free(s);
        json_decref(root);
    } else {
        printf("model     %s (%s backend, %.2f GiB of weights read per step, loaded in %.1f s)\n", name,
               st1.backend, wbytes / 1073741824.0, t_load);
        printf("%s", engine_placement(e));
        if (engine_placement(e)[strlen(engine_placement(e)) - 1] != '\n') putchar('\n');
        if (h2d > 0)
            printf(
                "ceilings  host->device %.1f GB/s (pinned), device memory %.0f GB/s (copy, read+write; the "
                "\"%% of copy\" column's denominator)\n",
                h2d / 1e9, d2d / 1e9);
        if (st1.vram_budget)
            printf("vram      budget %.2f GiB, planned %.2f GiB, taken from the device %.2f GiB\n",
                   st1.vram_budget / 1073741824.0, st1.vram_planned / 1073741824.0,
                   st1.vram_used / 1073741824.0);
        if (prefill) {
            printf("prefill   %d tokens: %.0f tokens/s", prefill, prefill_tok_s);
            if (prefill_info.predicted_s > 0)
                printf(" (%d host layers on the CPU, %d parked; predicted %.0f tokens/s)", prefill_info.n_cpu,
                       prefill_info.n_park,
                       (prefill < ep.max_batch_tokens ? prefill : ep.max_batch_tokens) /
                           prefill_info.predicted_s);
            putchar('\n');
        }
        printf("%-8s %-8s %10s %12s %12s %10s %10s %12s %9s %10s %12s\n", "batch", "context", "step ms",
               "tokens/s", "weights GB/s", "% of copy", "link GB/s", "stall ms/step", "cpu/strm", "host ms",
               "predicted ms");
        for (int i = 0; i < n_res; i++) {
            int B = res[i].batch > 0 ? res[i].batch : 1, ctx = res[i].batch > 0 ? prompt : -res[i].batch;
            char hbm[16] = "-", plan[16] = "-", pred[16] = "-";
            if (d2d > 0) snprintf(hbm, sizeof hbm, "%.0f%%", 100.0 * res[i].weight_gbs * 1e9 / d2d);
            if (st1.n_streamed)
                snprintf(plan, sizeof plan, res[i].n_park ? "%d/%d(%dp)" : "%d/%d", res[i].n_cpu,
                         res[i].n_stream, res[i].n_park);
            if (res[i].predicted_s > 0) snprintf(pred, sizeof pred, "%.2f", res[i].predicted_s * 1e3);
            printf("%-8d %-8d %10.2f %12.1f %12.1f %10s %10.1f %12.2f %9s %10.2f %12s\n", B, ctx,
                   res[i].step_s * 1e3, res[i].tok_s, res[i].weight_gbs, hbm, res[i].link_gbs,
                   res[i].stall_ms, plan, res[i].host_ms, pred);
        }
        if (st1.expert_cache.slots) {
            char line[512];
            expert_cache_format(&st1.expert_cache, line, sizeof line);
            printf("%s\n", line);
            for (int i = 0; i < n_res; i++)
                printf("  batch %-4d %5.1f%% of the chosen experts hit, %.2f MiB fetched and %.1f experts on "
                       "the "
                       "host per step\n",
                       res[i].batch > 0 ? res[i].batch : 1, 100.0 * res[i].ec_hit, res[i].ec_fetch_mib,
                       res[i].ec_host);
        }
        if (spec_k)
            printf("speculative  one sequence from context %d, %d drafts a step accepted with p=%.2f: %d-row "
                   "step %.2f ms against 1-row %.2f ms (%.2fx), %.2f tokens a step, %.1f tokens/s against "
                   "%.1f (%.2fx)\n",
                   prompt, sr.k, sr.accept, sr.k + 1, sr.spec_step_s * 1e3, sr.plain_step_s * 1e3,
                   sr.spec_step_s / sr.plain_step_s, sr.tokens_per_step, sr.spec_tok_s, sr.plain_tok_s,
                   sr.spec_tok_s / sr.plain_tok_s);
        if (st1.plan_revisions)
            printf(
                "the host ran at %.2fx its start-up timing: the step plan was made again %d time%s (the rows "
                "show the last plan)\n",
                st1.host_pace, st1.plan_revisions, st1.plan_revisions == 1 ? "" : "s");
    }
    free(bc.tok);
    free(bc.want);
    free(bc.logits);
    free(times);
    engine_free(e);
    model_file_close(mf);
    return 0;
step_failed:
    fprintf(stderr, "ferry bench: engine step failed: %s\n", ferry_status_str(rc));
    engine_free(e);
    model_file_close(mf);
    return 1;
bad:
    bench_usage(stderr);
    return 2;
bad_gpus:
    fprintf(stderr, "ferry bench: %s\n", gerr);
    return 2;
}
