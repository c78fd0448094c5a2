/* serve — `ferry serve`: the OpenAI-compatible HTTP server with continuous batching.
 *
 * serve_main() is the whole program behind the `serve` subcommand: it parses the option table
 * (server/options.h: argv, then FERRY_* environment, then defaults), binds the socket, loads the model in
 * the background (/health answers 503 until it is ready), runs until SIGTERM/SIGINT, drains and returns.
 * Usage: main.c calls serve_main(argc, argv) with argv[0] = "serve"; the return value is the exit status.
 */
#ifndef FERRY_SERVE_H
#define FERRY_SERVE_H

/* Returns 0 after a clean shutdown or --help, 1 on a startup error (bad option, a model that does not
 * load, port in use). */
int serve_main(int argc, char **argv);

#endif
