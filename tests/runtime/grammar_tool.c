/* grammar_tool — drives runtime/grammar from the command line for test_grammar.py (and by hand).
 *
 *   grammar_tool gen SCHEMA_FILE SEED N [SOFT_LEN]   N random outputs of the schema's grammar, one per line
 * as hex; "DEADEND <hex>" when a prefix cannot go on (a bug) grammar_tool check SCHEMA_FILE reads hex lines
 * on stdin, prints 1/0: accepted in full grammar_tool compile SCHEMA_FILE                 prints "ok" or
 * "error <status> <message>" SCHEMA_FILE "-object-" stands for response_format json_object's grammar; a file
 * named *.gbnf is a GBNF grammar. The
 * random walk picks among the bytes the recogniser accepts; past SOFT_LEN bytes it picks the byte that brings
 * the end closest, so every walk ends: that is the property the budget of grammar_mask relies on.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/grammar.h"
#include "runtime/json_schema.h"

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    fclose(f);
    if (s) s[n] = 0, *len = (size_t)n;
    return s;
}

static int load(const char *path, struct grammar **g, char err[256])
{
    if (!strcmp(path, "-object-")) return grammar_json_object(g, 16, 1, err);
    size_t len = 0;
    char *s = read_file(path, &len);
    if (!s) return ferry_fail(err, FERRY_ERR_IO, "cannot read %s", path);
    size_t pl = strlen(path);
    int rc = pl > 5 && !strcmp(path + pl - 5, ".gbnf") ? grammar_gbnf(s, len, g, err)
                                                       : json_schema_grammar(s, len, 16, g, err);
    free(s);
    return rc;
}

static uint64_t rng;
static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static void put_hex(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) printf("%02x", s[i]);
    printf("\n");
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: grammar_tool gen|check|compile SCHEMA_FILE ...\n");
        return 2;
    }
    struct grammar *g = NULL;
    char err[256] = "";
    int rc = load(argv[2], &g, err);
    if (!strcmp(argv[1], "compile")) {
        if (rc)
            printf("error %d %s\n", rc, err);
        else
            printf("ok\n");
        grammar_free(g);
        return 0;
    }
    if (rc) {
        fprintf(stderr, "grammar_tool: %s\n", err);
        return 1;
    }
    if (!strcmp(argv[1], "check")) {
        static char line[1 << 20];
        static unsigned char doc[1 << 19];
        while (fgets(line, sizeof line, stdin)) {
            size_t n = 0;
            for (const char *h = line; h[0] && h[1] && h[0] != '\n'; h += 2) {
                unsigned v;
                sscanf(h, "%2x", &v);
                doc[n++] = (unsigned char)v;
            }
            struct gstate *st = grammar_state_new(g);
            int ok = grammar_state_feed(g, st, (const char *)doc, n) == 0 && grammar_state_accepting(g, st);
            printf("%d\n", ok);
            grammar_state_free(st);
        }
        grammar_free(g);
        return 0;
    }
    rng = (uint64_t)strtoull(argc > 3 ? argv[3] : "1", NULL, 10) * 0x9E3779B97F4A7C15ull + 1;
    int n = argc > 4 ? atoi(argv[4]) : 10;
    size_t soft = argc > 5 ? (size_t)atoi(argv[5]) : 200;
    struct gstate *st = grammar_state_new(g), *tmp = grammar_state_new(g), *init = grammar_state_new(g);
    static unsigned char out[1 << 16];
    for (int k = 0; k < n; k++) {
        grammar_state_copy(st, init);
        size_t len = 0;
        for (;;) {
            int cand[256], nc = 0;
            uint32_t best = UINT32_MAX;
            int best_c = -1;
            for (int c = 0; c < 256; c++) {
                grammar_state_copy(tmp, st);
                char ch = (char)c;
                if (grammar_state_feed(g, tmp, &ch, 1)) continue;
                cand[nc++] = c;
                uint32_t cost = grammar_state_cost(g, tmp);
                if (cost < best) best = cost, best_c = c;
            }
            int acc = grammar_state_accepting(g, st);
            if (acc && (nc == 0 || next_rand() % 8 == 0 || len >= soft)) break;
            if (nc == 0 || len >= sizeof out - 1) {
                printf("DEADEND ");
                break;
            }
            int c = len >= soft ? best_c : cand[next_rand() % (uint32_t)nc];
            /* printable bytes are favoured so outputs stay readable */
            if (len < soft && c >= 0x80 && next_rand() % 4) c = cand[next_rand() % (uint32_t)nc];
            char ch = (char)c;
            grammar_state_feed(g, st, &ch, 1);
            out[len++] = (unsigned char)c;
        }
        put_hex(out, len);
    }
    grammar_state_free(st);
    grammar_state_free(tmp);
    grammar_state_free(init);
    grammar_free(g);
    return 0;
}
