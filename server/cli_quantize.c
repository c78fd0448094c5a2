/* cli_quantize — `ferry quantize --model IN --type Q4_K_M --out OUT.gguf` (or llama-quantize's order: `ferry
 * quantize IN OUT TYPE`): an F32/F16/BF16 GGUF or a Hugging Face directory to a quantized GGUF that llama.cpp
 * and ferry load (weights/quantize.h does the work). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/core/status.h"
#include "kernels/cpu/threadpool.h"
#include "quant/mix.h"
#include "server/cli.h"
#include "weights/quantize.h"

static void quantize_usage(FILE *f)
{
    fprintf(
        f,
        "usage: ferry quantize --model IN --type TYPE --out OUT.gguf [--imatrix FILE] [--threads N]\n"
        "       ferry quantize [--imatrix FILE] [--threads N] IN OUT.gguf TYPE\n\n"
        "  --model IN     F32/F16/BF16 GGUF file or Hugging Face directory (env FERRY_MODEL)\n"
        "  --type TYPE    %s\n"
        "                 (any case; Q3_K, Q4_K, Q5_K are the _M mixes). llama.cpp's mixes, byte for byte\n"
        "                 what llama-quantize writes (with the same --imatrix): the output head in Q6_K,\n"
        "                 more bits for attn_v, ffn_down and attn_output by layer position and attention\n"
        "                 shape; MXFP4_MOE: experts in MXFP4, the rest in Q8_0. The IQ1, IQ2 and\n"
        "                 IQ3_XXS/IQ3_XS mixes and Q2_K_S need --imatrix; TQ1_0/TQ2_0 are not written\n"
        "  --out OUT      the GGUF to write (written to OUT.tmp-PID, renamed when complete)\n"
        "  --imatrix FILE llama.cpp importance matrix (llama-imatrix's GGUF or legacy .dat): weighs the\n"
        "                 K-quant, Q4_0..Q5_1 and i-quant quantizers and selects the mixes'\n"
        "                 imatrix rules, as llama-quantize --imatrix does\n"
        "  --threads N    worker threads (default: all cores)\n",
        quant_ftype_names());
}

/* kernels/cpu/threadpool as quant/'s parallel-for. */
static void run_on_pool(void *pool, quant_task_fn task, void *ctx, int n_tasks)
{
    tpool_run(pool, task, ctx, n_tasks);
}

struct progress_state {
    int tty;
    int last_pct, last_i;
    double t0;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void on_progress(int i, int n, const char *name, enum dtype from, enum dtype to, uint64_t done,
                        uint64_t total, void *user)
{
    struct progress_state *ps = user;
    const int pct = total ? (int)(done * 100 / total) : 100;
    if (ps->tty) {
        fprintf(stderr, "\r[%4d/%4d] %3d%% %-32.32s %5s -> %-5s %7.1fs", i + 1, n, pct, name,
                dtype_name(from), dtype_name(to), now_s() - ps->t0);
        fflush(stderr);
    } else if (pct >= ps->last_pct + 10 || (i == 0 && ps->last_i < 0)) {
        /* A log file gets a line every tenth of the output. */
        fprintf(stderr, "ferry quantize: %3d%% (tensor %d/%d %s, %.1fs)\n", pct, i + 1, n, name,
                now_s() - ps->t0);
        ps->last_pct = pct - pct % 10;
    }
    ps->last_i = i;
}

static int same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int cli_quantize_main(int argc, char **argv)
{
    static const struct option longopts[] = {{"model", required_argument, 0, 'm'},
                                             {"type", required_argument, 0, 't'},
                                             {"out", required_argument, 0, 'o'},
                                             {"threads", required_argument, 0, 'j'},
                                             {"help", no_argument, 0, 'h'},
                                             {"imatrix", required_argument, 0, 'i'},
                                             {0, 0, 0, 0}};
    const char *model = getenv("FERRY_MODEL"), *type = NULL, *out_path = NULL, *imatrix_path = NULL;
    int n_threads = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:t:o:j:hi:", longopts, NULL)) != -1) {
        switch (c) {
        case 'i':
            imatrix_path = optarg;
            break;
        case 'm':
            model = optarg;
            break;
        case 't':
            type = optarg;
            break;
        case 'o':
            out_path = optarg;
            break;
        case 'j':
            n_threads = atoi(optarg);
            if (n_threads < 1 || n_threads > 1024) {
                fprintf(stderr, "ferry quantize: --threads must be 1..1024, not '%s'\n", optarg);
                return 2;
            }
            break;
        case 'h':
            quantize_usage(stdout);
            return 0;
        default:
            quantize_usage(stderr);
            return 2;
        }
    }
    if (!type && !out_path && argc - optind == 3) { /* llama-quantize's IN OUT TYPE */
        model = argv[optind];
        out_path = argv[optind + 1];
        type = argv[optind + 2];
        optind = argc;
    }
    if (!model || !type || !out_path || optind < argc) {
        quantize_usage(stderr);
        return 2;
    }
    const int ftype = quant_ftype_from_name(type);
    if (ftype < 0) {
        const char *why = quant_ftype_refusal(type);
        if (why)
            fprintf(stderr, "ferry quantize: %s is not written by ferry: %s\n", type, why);
        else
            fprintf(stderr, "ferry quantize: unknown --type '%s' (one of %s)\n", type, quant_ftype_names());
        return 2;
    }
    if (same_file(model, out_path)) {
        fprintf(stderr, "ferry quantize: --out %s is the input model\n", out_path);
        return 2;
    }
    cli_log_init(LOG_LEVEL_WARN);
    char err[256] = "";
    struct imatrix *im = NULL;
    if (imatrix_path && imatrix_load(imatrix_path, &im, err)) {
        fprintf(stderr, "ferry quantize: %s\n", err);
        return 1;
    }
    struct model_file *mf = NULL;
    if (cli_open_model(model, &mf)) {
        imatrix_free(im);
        return 1;
    }
    struct tpool *tp = NULL;
    if (tpool_init(&tp, n_threads)) {
        fprintf(stderr, "ferry quantize: cannot start %d threads\n", n_threads);
        model_file_close(mf);
        imatrix_free(im);
        return 1;
    }
    struct progress_state ps = {.tty = isatty(STDERR_FILENO), .last_pct = -10, .last_i = -1, .t0 = now_s()};
    const struct quantize_params qp = {
        .ftype = ftype, .runner = {run_on_pool, tp}, .progress = on_progress, .user = &ps, .imatrix = im};
    const int rc = quantize_model_file(mf, out_path, &qp, err);
    if (ps.tty) fputc('\n', stderr);
    if (rc) {
        fprintf(stderr, "ferry quantize: %s (%s)\n", err, ferry_status_str(rc));
    } else {
        struct stat st;
        const double out_mib = stat(out_path, &st) == 0 ? (double)st.st_size / 1048576.0 : 0;
        fprintf(stderr, "ferry quantize: wrote %s (%s, %.1f MiB from %.1f MiB) in %.1fs with %d threads\n",
                out_path, quant_ftype_name(ftype), out_mib, (double)mf->file_bytes / 1048576.0,
                now_s() - ps.t0, tpool_size(tp));
    }
    tpool_free(tp);
    model_file_close(mf);
    imatrix_free(im);
    return rc ? 1 : 0;
}
