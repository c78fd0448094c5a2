/* grammar_mask — which tokens may come next: a depth-first walk of a trie of the vocabulary's byte pieces,
 * stepping the recogniser one byte per trie edge and skipping every subtree whose prefix it refuses.
 *
 * Two tries are built once per vocabulary: one over every text token, one over the tokens that are not
 * "plain" (plain: printable characters other than '"' and '\', or complete UTF-8 characters). Inside an
 * unconstrained JSON string the plain tokens are accepted in bulk (by their length in code points), and only
 * the second, much smaller trie is walked. Level states of the walk live in one growable buffer (scratch),
 * addressed by offset, so a mask allocates nothing once the scratch has grown to its working size.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/grammar.h"
#include "runtime/grammar_impl.h"

struct tnode {
    int32_t child, n_child; /* children are contiguous: nodes[child .. child + n_child) */
    int32_t tok, n_tok;     /* tokens whose piece ends here: toks[tok .. tok + n_tok) */
    uint8_t byte;           /* the edge from the parent */
};

struct trie {
    struct tnode *nodes; /* node 0 is the root */
    int n;
    int32_t *toks;
};

struct gvocab {
    int n_vocab;
    int max_len; /* longest piece (bytes) */
    struct trie all, special;
    int32_t *plain;       /* (n_plain) plain tokens, by code points ascending */
    int32_t *plain_chars; /* (n_plain) their code points */
    int n_plain;
};

struct gscratch {
    char *buf;
    size_t cap;
    size_t *off; /* (levels) offset of each level's state in buf */
    int n_off;
    struct {
        int32_t node, level;
    } * stack;
    int stack_cap;
};

/* ---- building ----------------------------------------------------------------------------------------- */

struct piece_ref {
    const char *const *pieces;
    const size_t *lens;
};

static int cmp_piece(const void *x, const void *y, void *arg)
{
    const struct piece_ref *r = arg;
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    size_t la = r->lens[a], lb = r->lens[b];
    int c = memcmp(r->pieces[a], r->pieces[b], la < lb ? la : lb);
    if (c) return c;
    return la < lb ? -1 : la > lb ? 1 : (a > b) - (a < b);
}

/* Tokens ids[0, n) (already sorted by piece) into a trie, breadth first. */
static int trie_build(struct trie *t, int32_t *ids, int n, const char *const *pieces, const size_t *lens)
{
    size_t total = 1;
    for (int i = 0; i < n; i++) total += lens[ids[i]];
    t->nodes = calloc(total, sizeof *t->nodes);
    t->toks = ids;
    struct item {
        int32_t node, lo, hi, depth;
    } *q = malloc(total * sizeof *q);
    if (!t->nodes || !q) {
        free(q);
        return FERRY_ERR_NOMEM;
    }
    t->n = 1;
    int qh = 0, qt = 0;
    q[qt++] = (struct item){0, 0, n, 0};
    while (qh < qt) {
        struct item it = q[qh++];
        struct tnode *nd = &t->nodes[it.node];
        int lo = it.lo;
        nd->tok = lo;
        while (lo < it.hi && (int)lens[ids[lo]] == it.depth) lo++;
        nd->n_tok = lo - it.lo;
        nd->child = t->n;
        for (int i = lo; i < it.hi;) {
            unsigned char c = (unsigned char)pieces[ids[i]][it.depth];
            int j = i + 1;
            while (j < it.hi && (unsigned char)pieces[ids[j]][it.depth] == c) j++;
            int k = t->n++;
            t->nodes[k].byte = c;
            q[qt++] = (struct item){k, i, j, it.depth + 1};
            nd = &t->nodes[it.node];
            nd->n_child++;
            i = j;
        }
    }
    free(q);
    return 0;
}

/* Code points of a plain piece, or 0 when the piece is not plain. */
static int plain_chars(const unsigned char *s, size_t n)
{
    int chars = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k;
        if (c < 0x80) {
            if (c < 0x20 || c == '"' || c == '\\' || c == 0x7F) return 0;
            k = 1;
        } else if (c >= 0xC2 && c <= 0xDF) {
            k = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 4;
        } else {
            return 0;
        }
        if (i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        if (k == 3) {
            unsigned c1 = s[i + 1];
            if ((c == 0xE0 && c1 < 0xA0) || (c == 0xED && c1 > 0x9F)) return 0;
        } else if (k == 4) {
            unsigned c1 = s[i + 1];
            if ((c == 0xF0 && c1 < 0x90) || (c == 0xF4 && c1 > 0x8F)) return 0;
        }
        i += k;
        chars++;
    }
    return chars;
}

int gvocab_init(struct gvocab **out, int n_vocab, const char *const *pieces, const size_t *lens,
                const uint8_t *is_text)
{
    *out = NULL;
    struct gvocab *v = calloc(1, sizeof *v);
    int32_t *all = malloc((size_t)(n_vocab ? n_vocab : 1) * sizeof *all);
    int32_t *special = malloc((size_t)(n_vocab ? n_vocab : 1) * sizeof *special);
    int *chars = malloc((size_t)(n_vocab ? n_vocab : 1) * sizeof *chars);
    if (!v || !all || !special || !chars) goto oom;
    v->n_vocab = n_vocab;
    v->plain = malloc((size_t)(n_vocab ? n_vocab : 1) * sizeof *v->plain);
    v->plain_chars = malloc((size_t)(n_vocab ? n_vocab : 1) * sizeof *v->plain_chars);
    if (!v->plain || !v->plain_chars) goto oom;
    int n_all = 0, n_special = 0, max_chars = 0;
    for (int i = 0; i < n_vocab; i++) {
        if (!is_text[i] || !pieces[i] || lens[i] == 0) continue;
        all[n_all++] = i;
        if ((int)lens[i] > v->max_len) v->max_len = (int)lens[i];
        chars[i] = plain_chars((const unsigned char *)pieces[i], lens[i]);
        if (chars[i] == 0) special[n_special++] = i;
        if (chars[i] > max_chars) max_chars = chars[i];
    }
    /* plain tokens by code points (counting sort keeps it linear) */
    int *count = calloc((size_t)max_chars + 2, sizeof *count);
    if (!count) goto oom;
    for (int k = 0; k < n_all; k++) count[chars[all[k]]]++;
    for (int c = 1, at = 0; c <= max_chars; c++) {
        int m = count[c];
        count[c] = at;
        at += m;
    }
    for (int k = 0; k < n_all; k++) {
        int c = chars[all[k]];
        if (c == 0) continue;
        v->plain[count[c]] = all[k];
        v->plain_chars[count[c]++] = c;
        v->n_plain++;
    }
    free(count);
    struct piece_ref ref = {pieces, lens};
    qsort_r(all, (size_t)n_all, sizeof *all, cmp_piece, &ref);
    qsort_r(special, (size_t)n_special, sizeof *special, cmp_piece, &ref);
    if (trie_build(&v->all, all, n_all, pieces, lens)) {
        all = NULL;
        goto oom;
    }
    all = NULL;
    if (trie_build(&v->special, special, n_special, pieces, lens)) {
        special = NULL;
        goto oom;
    }
    special = NULL;
    free(chars);
    *out = v;
    return 0;
oom:
    free(all);
    free(special);
    free(chars);
    gvocab_free(v);
    return FERRY_ERR_NOMEM;
}

void gvocab_free(struct gvocab *v)
{
    if (!v) return;
    free(v->all.nodes);
    free(v->all.toks);
    free(v->special.nodes);
    free(v->special.toks);
    free(v->plain);
    free(v->plain_chars);
    free(v);
}

struct gscratch *gscratch_new(void)
{
    return calloc(1, sizeof(struct gscratch));
}

void gscratch_free(struct gscratch *s)
{
    if (!s) return;
    free(s->buf);
    free(s->off);
    free(s->stack);
    free(s);
}

/* ---- the walk ------------------------------------------------------------------------------------------ */

static int ensure(struct gscratch *s, size_t need)
{
    if (need <= s->cap) return 0;
    size_t nc = s->cap ? s->cap : (size_t)1 << 16;
    while (nc < need) nc *= 2;
    char *q = realloc(s->buf, nc);
    if (!q) return FERRY_ERR_NOMEM;
    s->buf = q;
    s->cap = nc;
    return 0;
}

static size_t align8(size_t x)
{
    return (x + 7) & ~(size_t)7;
}

/* Walks trie t from state st (copied to level 0). Tokens after which the cost is <= limit are allowed; *best
 * gets the lowest cost seen over all tokens the grammar accepts. Returns the number allowed, or an error. */
static int walk(const struct grammar *g, const struct gstate *st, const struct trie *t, int max_len,
                uint32_t limit, uint8_t *allowed, uint32_t *best, struct gscratch *s)
{
    if (t->n == 0) return 0;
    if (s->n_off < max_len + 2) {
        size_t *o = realloc(s->off, (size_t)(max_len + 2) * sizeof *o);
        if (!o) return FERRY_ERR_NOMEM;
        s->off = o;
        s->n_off = max_len + 2;
    }
    if (s->stack_cap < t->n) {
        void *q = realloc(s->stack, (size_t)t->n * sizeof *s->stack);
        if (!q) return FERRY_ERR_NOMEM;
        s->stack = q;
        s->stack_cap = t->n;
    }
    size_t size0 = gstate_size(gstate_frames(st));
    if (ensure(s, size0 + sizeof(struct gstate))) return FERRY_ERR_NOMEM;
    memcpy(s->buf, st, size0);
    s->off[0] = 0;
    s->off[1] = align8(size0);
    int sp = 0, n_allowed = 0;
    const struct tnode *root = &t->nodes[0];
    for (int k = root->n_child - 1; k >= 0; k--)
        s->stack[sp].node = root->child + k, s->stack[sp++].level = 0;
    while (sp) {
        sp--;
        const int nd = s->stack[sp].node, level = s->stack[sp].level;
        const struct tnode *x = &t->nodes[nd];
        size_t at = s->off[level + 1];
        if (ensure(s, at + sizeof(struct gstate))) return FERRY_ERR_NOMEM;
        const struct gstate *in = (const struct gstate *)(s->buf + s->off[level]);
        struct gstate *out = (struct gstate *)(s->buf + at);
        if (!gstate_step(g, in, x->byte, out)) continue;
        if (x->n_tok) {
            uint32_t c = gstate_cost(g, out);
            if (c < *best) *best = c;
            if (c <= limit)
                for (int k = 0; k < x->n_tok; k++) {
                    allowed[t->toks[x->tok + k]] = 1;
                    n_allowed++;
                }
        }
        if (x->n_child) {
            s->off[level + 2] = at + align8(gstate_size(gstate_frames(out)));
            for (int k = x->n_child - 1; k >= 0; k--)
                s->stack[sp].node = x->child + k, s->stack[sp++].level = level + 1;
        }
    }
    return n_allowed;
}

int grammar_mask(const struct grammar *g, const struct gstate *st, const struct gvocab *v, int budget,
                 uint8_t *allowed, struct gscratch *scr)
{
    memset(allowed, 0, (size_t)v->n_vocab);
    const uint32_t cost0 = gstate_cost(g, st);
    const int accepting = cost0 == 0;
    /* after this token: budget - 1 tokens left for the rest of the output and the end of generation */
    const uint32_t limit = budget < 0 ? GCOST_INF : budget < 2 ? 0 : (uint32_t)budget - 2;
    const int no_text = budget >= 0 && budget < 2;
    int room = 0;
    int bulk = gstate_plain_string(g, st, &room) && (budget < 0 || cost0 <= limit);
    uint32_t best = GCOST_INF;
    int n = walk(g, st, bulk ? &v->special : &v->all, v->max_len, no_text ? 0 : limit, allowed, &best, scr);
    if (n < 0) return n;
    if (no_text && n) { /* the limit 0 above was only to find the closest tokens */
        memset(allowed, 0, (size_t)v->n_vocab);
        n = 0;
    }
    if (bulk && !no_text)
        for (int k = 0; k < v->n_plain && (room < 0 || v->plain_chars[k] <= room); k++) {
            allowed[v->plain[k]] = 1;
            n++;
        }
    if (n == 0 && !accepting && best < GCOST_INF) {
        /* nothing fits the budget: the tokens that come closest to an end */
        n = walk(g, st, &v->all, v->max_len, best, allowed, &best, scr);
        if (n < 0) return n;
    }
    return accepting;
}
