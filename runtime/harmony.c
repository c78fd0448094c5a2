/* harmony — see harmony.h. One pass over the messages; each body goes to the part its header names. Bodies
 * end at the first marker, so a marker never lands inside reasoning or content; a call's arguments are read
 * by tool_call_args_object once its END is known.
 */
#include "runtime/harmony.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"

enum mark {
    MARK_START,
    MARK_CHANNEL,
    MARK_MESSAGE,
    MARK_END,
    MARK_RETURN,
    MARK_CALL,
    MARK_CONSTRAIN,
    N_MARKS
};

static const char *const MARKS[N_MARKS] = {"<|start|>",  "<|channel|>", "<|message|>",  "<|end|>",
                                           "<|return|>", "<|call|>",    "<|constrain|>"};

#define BIT(m) (1u << (m))
/* what ends a message's header (the body starts at <|message|>), and what ends a body */
#define HEADER_ENDS (BIT(MARK_MESSAGE) | BIT(MARK_START) | BIT(MARK_END) | BIT(MARK_RETURN) | BIT(MARK_CALL))
#define BODY_ENDS   (BIT(MARK_START) | BIT(MARK_CHANNEL) | BIT(MARK_END) | BIT(MARK_RETURN) | BIT(MARK_CALL))

int harmony_template_is(const char *tmpl)
{
    return tmpl && strstr(tmpl, "<|channel|>") != NULL;
}

/* ---- text -----------------------------------------------------------------------------------------------
 */

/* Whether t[at, n) begins with m (full), or, partial set, is a proper prefix of it. */
static int at_mark(const char *t, size_t n, size_t at, const char *m, int partial)
{
    const size_t k = strlen(m), left = n - at;
    if (left >= k) return !memcmp(t + at, m, k);
    return partial && !memcmp(t + at, m, left);
}

/* The first mark of set in t[from, n): its position, *which its enum mark. None: returns n, *which -1, and
 * *hold the position of a tail that may still become one of them (n when none). */
static size_t next_mark(const char *t, size_t n, size_t from, unsigned set, int *which, size_t *hold)
{
    *which = -1;
    *hold = n;
    for (size_t i = from; i < n; i++) {
        const char *lt = memchr(t + i, '<', n - i);
        if (!lt) break;
        i = (size_t)(lt - t);
        for (int m = 0; m < N_MARKS; m++) {
            if (!(set & BIT(m))) continue;
            const size_t k = strlen(MARKS[m]);
            if (n - i >= k && !memcmp(t + i, MARKS[m], k)) {
                *which = m;
                return i;
            }
            if (*hold == n && n - i < k && !memcmp(t + i, MARKS[m], n - i)) *hold = i;
        }
    }
    return n;
}

/* A name in a header at s[0, n): up to a space or a marker. */
static size_t name_len(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n && s[i] != ' ' && s[i] != '<' && s[i] != '\n') i++;
    return i;
}

/* ---- headers ------------------------------------------------------------------------------------------- */

struct header {
    const char *channel; /* the last <|channel|>'s name; NULL when none */
    size_t channel_n;
    const char *to; /* the recipient other than "assistant"; NULL when none */
    size_t to_n;
};

static void header_read(const char *h, size_t n, struct header *out)
{
    memset(out, 0, sizeof *out);
    const size_t cl = strlen(MARKS[MARK_CHANNEL]);
    for (size_t i = 0; i < n; i++) {
        if (n - i >= cl && !memcmp(h + i, MARKS[MARK_CHANNEL], cl)) {
            out->channel = h + i + cl;
            out->channel_n = name_len(out->channel, n - i - cl);
        } else if (n - i > 3 && !memcmp(h + i, "to=", 3) && (i == 0 || h[i - 1] == ' ')) {
            const char *v = h + i + 3;
            const size_t vn = name_len(v, n - i - 3);
            if (!(vn == 9 && !memcmp(v, "assistant", 9))) out->to = v, out->to_n = vn;
        }
    }
}

/* A function's name as the API takes them: [A-Za-z0-9_.-]{1,64}. */
static int function_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '-' || s[i] == '.'))
            return 0;
    return 1;
}

static int name_is(const char *s, size_t n, const char *w)
{
    return s && n == strlen(w) && !memcmp(s, w, n);
}

/* ---- the parse ---------------------------------------------------------------------------------------- */

enum body_kind { BODY_CONTENT, BODY_REASONING, BODY_RAW, BODY_CALL, BODY_DROP };

struct parse {
    FILE *r, *c; /* the reasoning and the content, growing (open_memstream) */
    struct harmony_parse *out;
    int rc;
};

static void put(struct parse *p, FILE *f, const char *s, size_t n)
{
    if (n && fwrite(s, 1, n, f) != n) p->rc = FERRY_ERR_NOMEM;
}

/* A call of name[0, nn) with the arguments body[0, bn); a body that is not a JSON object is content. */
static void call_add(struct parse *p, const char *name, size_t nn, const char *body, size_t bn)
{
    char *args;
    const int r = tool_call_args_object(body, bn, &args);
    if (r < 0) {
        p->rc = r;
        return;
    }
    if (r == 0) {
        put(p, p->c, body, bn);
        return;
    }
    struct tool_parse *tp = &p->out->calls;
    if (tp->n_calls >= TOOL_CALL_MAX) { /* kept the first ones */
        free(args);
        return;
    }
    char *copy = strndup(name, nn);
    if (!copy) {
        free(args);
        p->rc = FERRY_ERR_NOMEM;
        return;
    }
    tp->calls[tp->n_calls].name = copy;
    tp->calls[tp->n_calls].arguments = args;
    tp->n_calls++;
}

/* Whether a header starts at t[h, n): a marker of one, or the recipient of a role header. wait: only the
 * beginning of one so far. */
static int header_starts(const char *t, size_t n, size_t h, int final, int *wait)
{
    static const enum mark opens[] = {MARK_CHANNEL, MARK_MESSAGE, MARK_CONSTRAIN};
    *wait = 0;
    for (size_t k = 0; k < sizeof opens / sizeof opens[0]; k++) {
        if (at_mark(t, n, h, MARKS[opens[k]], 0)) return 1;
        if (!final && at_mark(t, n, h, MARKS[opens[k]], 1)) *wait = 1;
    }
    if (at_mark(t, n, h, " to=", 0)) return 1;
    if (!final && at_mark(t, n, h, " to=", 1)) *wait = 1;
    return 0;
}

static void parse_run(struct parse *p, const char *t, size_t n, int final, int flags)
{
    size_t at = 0;
    while (at < n && !p->rc) {
        size_t h = at;
        if (at_mark(t, n, at, MARKS[MARK_START],
                    0)) { /* a role: only the assistant's messages are the answer */
            const size_t r = at + strlen(MARKS[MARK_START]), rn = name_len(t + r, n - r);
            if (r + rn == n || !name_is(t + r, rn, "assistant")) return;
            h = r + rn;
        } else if (!final && at_mark(t, n, at, MARKS[MARK_START], 1)) {
            return;
        }
        int wait;
        const int has_header = header_starts(t, n, h, final, &wait);
        if (wait) return;
        enum body_kind kind = BODY_CONTENT;
        struct header hd = {0};
        size_t b0 = h, hold;
        int which;
        if (has_header) {
            const size_t m = next_mark(t, n, h, HEADER_ENDS, &which, &hold);
            if (which < 0) return;       /* the header is still coming, or was cut off (dropped) */
            if (which != MARK_MESSAGE) { /* a header without a body: dropped up to its marker */
                if (which == MARK_RETURN) return;
                at = which == MARK_START ? m : m + strlen(MARKS[which]);
                continue;
            }
            header_read(t + h, m - h, &hd);
            b0 = m + strlen(MARKS[MARK_MESSAGE]);
            if (hd.to)
                kind = (flags & HARMONY_CALLS) && hd.to_n > 10 && !memcmp(hd.to, "functions.", 10) &&
                               function_name_ok(hd.to + 10, hd.to_n - 10)
                           ? BODY_CALL
                           : BODY_DROP;
            else if (name_is(hd.channel, hd.channel_n, "analysis"))
                kind = flags & HARMONY_REASONING ? BODY_REASONING : BODY_RAW;
        }
        const size_t e = next_mark(t, n, b0, BODY_ENDS, &which, &hold);
        const size_t shown = which >= 0 || final ? e : hold; /* the body's part that is certain */
        switch (kind) {
        case BODY_CONTENT:
            put(p, p->c, t + b0, shown - b0);
            break;
        case BODY_REASONING:
            put(p, p->r, t + b0, shown - b0);
            break;
        case BODY_RAW:
            put(p, p->c, t + h, shown - h);
            if (which == MARK_END) put(p, p->c, MARKS[MARK_END], strlen(MARKS[MARK_END]));
            break;
        case BODY_CALL:
            if (which >= 0 || final) call_add(p, hd.to + 10, hd.to_n - 10, t + b0, e - b0);
            break;
        case BODY_DROP:
            break;
        }
        if (which < 0 || which == MARK_RETURN) return;
        const size_t next = which == MARK_START || which == MARK_CHANNEL ? e : e + strlen(MARKS[which]);
        if (next <= at) return; /* (cannot happen: a message always moves on) */
        at = next;
    }
}

int harmony_parse(const char *text, size_t len, int final, int flags, struct harmony_parse *out)
{
    memset(out, 0, sizeof *out);
    struct parse p = {.out = out};
    p.r = open_memstream(&out->reasoning, &out->r_len);
    p.c = open_memstream(&out->content, &out->c_len);
    if (p.r && p.c)
        parse_run(&p, text ? text : "", text ? len : 0, final, flags);
    else
        p.rc = FERRY_ERR_NOMEM;
    /* closing writes both texts, NUL-terminated */
    const int bad_r = p.r && fclose(p.r), bad_c = p.c && fclose(p.c);
    if (bad_r || bad_c || !out->reasoning || !out->content) p.rc = FERRY_ERR_NOMEM;
    if (p.rc) harmony_parse_free(out);
    return p.rc;
}

void harmony_parse_free(struct harmony_parse *p)
{
    free(p->reasoning);
    free(p->content);
    tool_parse_free(&p->calls);
    memset(p, 0, sizeof *p);
}
