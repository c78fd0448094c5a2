/* cli — the subcommands of the ferry binary and the pieces they share (logging sink, model loading). */
#ifndef FERRY_CLI_H
#define FERRY_CLI_H

#include <stdint.h>

#include "kernels/core/log.h"
#include "weights/model_file.h"

int cli_run_main(int argc, char **argv);
int cli_inspect_main(int argc, char **argv);
int cli_bench_main(int argc, char **argv);
int cli_quantize_main(int argc, char **argv);


/* Installs the stderr log sink. */
void cli_log_init(enum log_level level);
/* Parses "error|warn|info|debug"; -1 when unknown. */
int cli_log_level_parse(const char *s);
/* Opens a model with a progress bar on a TTY; prints a one-line error and returns non-zero on failure. */
int cli_open_model(const char *path, struct model_file **out);

#endif
