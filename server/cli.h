/* cli — the subcommands of the ferry binary and the pieces they share (logging sink, model loading). */
#ifndef FERRY_CLI_H
#define FERRY_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/core/log.h"
#include "weights/model_file.h"

int cli_run_main(int argc, char **argv);
int cli_inspect_main(int argc, char **argv);
int cli_bench_main(int argc, char **argv);
int cli_quantize_main(int argc, char **argv);
int cli_chat_main(int argc, char **argv);
int cli_pull_main(int argc, char **argv);
/* `ferry pull SPEC` without the printing: the local path of the model's (first) file in path, or an error
 * already reported on stderr (FERRY_ERR_INVALID for a malformed SPEC). */
int cli_pull_model(const char *spec, char *path, size_t path_size);
int cli_list_main(int argc, char **argv);

/* Installs the stderr log sink. */
void cli_log_init(enum log_level level);
/* Parses "error|warn|info|debug"; -1 when unknown. */
int cli_log_level_parse(const char *s);
/* Opens a model with load progress on stderr (cli_progress); prints a one-line error and returns non-zero on
 * failure. */
int cli_open_model(const char *path, struct model_file **out);

/* Load progress for model_file_open: on a TTY a bar redrawn in place, otherwise (a log file, a service's
 * journal) one line at each quarter. user points to a struct cli_progress set up by cli_progress_init. */
struct cli_progress {
    int tty;
    int last; /* the last quarter printed (lines mode), -1 before any */
};
void cli_progress_init(struct cli_progress *p);
void cli_progress(uint64_t done, uint64_t total, void *user);

#endif
