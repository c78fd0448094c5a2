/* main — the ferry binary: `ferry serve | run | chat | inspect | bench | quantize`, each in its own file. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/core/log.h"
#include "kernels/core/status.h"
#include "server/cli.h"
#include "server/gpu_arch.h"
#ifdef FERRY_SERVER
#include "server/serve.h"
#endif

static const char *level_names[] = {"error", "warn", "info", "debug"};

static void stderr_sink(enum log_level level, const char *msg, void *user)
{
    (void)user;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld %-5s %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            level_names[level], msg);
}

void cli_log_init(enum log_level level)
{
    ferry_log_set(stderr_sink, NULL, level);
}

int cli_log_level_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, level_names[i])) return i;
    return -1;
}

void cli_progress_init(struct cli_progress *p)
{
    p->tty = isatty(STDERR_FILENO);
    p->last = -1;
}

void cli_progress(uint64_t done, uint64_t total, void *user)
{
    struct cli_progress *p = user;
    if (!total || !p) return;
    if (done > total) done = total;
    int pct = (int)(done * 100 / total);
    if (p->tty) {
        fprintf(stderr, "\rloading model: %3d%% (%llu / %llu MiB)", pct, (unsigned long long)(done >> 20),
                (unsigned long long)(total >> 20));
        if (done >= total) fputc('\n', stderr);
        return;
    }
    int quarter = pct / 25;
    if (quarter <= p->last) return;
    p->last = quarter;
    /* without a terminal: log lines, as the rest of the start-up */
    FLOG_INFO("loading model: %d%% (%llu / %llu MiB)", quarter * 25, (unsigned long long)(done >> 20),
              (unsigned long long)(total >> 20));
}

int cli_open_model(const char *path, struct model_file **out)
{
    char err[256] = "";
    struct cli_progress prog;
    cli_progress_init(&prog);
    int rc = model_file_open(path, out, cli_progress, &prog, err);
    if (rc)
        fprintf(stderr, "ferry: cannot load model %s: %s (%s)\n", path, err[0] ? err : "",
                ferry_status_str(rc));
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: ferry COMMAND [OPTIONS]\n\n"
               "commands:\n"
               "  serve     OpenAI-compatible HTTP server (ferry serve --help)\n"
               "  run       one generation from the command line (ferry run --help)\n"
               "  chat      an interactive chat in the terminal (ferry chat --help)\n"
               "  pull      download a GGUF model from a Hugging Face hub (ferry pull OWNER/REPO[:QUANT])\n"
               "  list      the models ferry pull downloaded\n"
               "  inspect   model metadata and the placement plan (ferry inspect --help)\n"
               "  bench     prefill/decode throughput (ferry bench --help)\n"
               "  quantize  write a quantized GGUF (ferry quantize --help)\n"
               "  version   print the version\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return cli_run_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return cli_inspect_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cli_bench_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return cli_quantize_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat")) return cli_chat_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "pull")) return cli_pull_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "list")) return cli_list_main(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) {
#ifdef FERRY_SERVER
        return serve_main(argc - 1, argv + 1);
#else
        fprintf(stderr, "ferry: this build has no server (libuv was missing at build time)\n");
        return 2;
#endif
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        const char *archs = gpu_arch_built();
        printf("ferry 0.1.0 (%s%s)\n",
               archs[0] ? "CUDA kernels for compute capabilities " : "CPU only, no CUDA", archs);
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "ferry: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
