/* grammar_build — see grammar_build.h: nodes into pools, then gb_finish computes each node's shortest
 * completion and first bytes by fixpoint (recursion through reserved nodes converges), drops what accepts
 * nothing, and hands the pools over as a struct grammar. */
#include "runtime/grammar_build.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/core/status.h"
#include "runtime/grammar_impl.h"

#define MAX_BYTES      (1 << 22)
#define MAX_POOL       (1 << 20)
#define MAX_PROPS      64    /* properties of one object (a 64-bit candidate mask) */
#define MAX_DFA_STATES 16384 /* automaton states of all patterns of a grammar (512 bytes of table each) */

/* ---- builder ------------------------------------------------------------------------------------------ */

struct gbuilder {
    struct grammar g;
    int cap_nodes;
    size_t n_bytes, cap_bytes;
    int n_kids, cap_kids, n_props, cap_props, n_lits, cap_lits, cap_dfas;
    uint8_t *defined; /* (cap_nodes) 0 for a reserved node not yet defined */
    int any_node, any_ws;
    int dfa_states; /* over all patterns: bounds the tables' memory */
    int status;
    char err[256];
};

int gb_fail(struct gbuilder *b, int status, const char *fmt, ...)
{
    if (b->status) return -1;
    b->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->err, sizeof b->err, fmt, ap);
    va_end(ap);
    return -1;
}

int gb_error(const struct gbuilder *b, char err[256])
{
    if (b->status && err) snprintf(err, 256, "%s", b->err);
    return b->status;
}

int gb_init(struct gbuilder **out)
{
    struct gbuilder *b = calloc(1, sizeof *b);
    *out = b;
    if (!b) return FERRY_ERR_NOMEM;
    b->any_node = -1;
    b->g.free_string = -1;
    return 0;
}

void gb_free(struct gbuilder *b)
{
    if (!b) return;
    free(b->g.nodes);
    free(b->g.bytes);
    free(b->g.kids);
    free(b->g.props);
    free(b->g.lits);
    for (int i = 0; i < b->g.n_dfas; i++) regex_free(b->g.dfas[i]);
    free(b->g.dfas);
    free(b->defined);
    free(b);
}

static int grow(struct gbuilder *b, void **p, int *cap, int need, size_t size, int limit, const char *what)
{
    if (need <= *cap) return 0;
    if (need > limit)
        return gb_fail(b, FERRY_ERR_RANGE, "the grammar is too large (more than %d %s)", limit, what);
    int nc = *cap ? *cap : 64;
    while (nc < need) nc *= 2;
    if (nc > limit) nc = limit;
    void *q = realloc(*p, (size_t)nc * size);
    if (!q) return gb_fail(b, FERRY_ERR_NOMEM, "out of memory");
    *p = q;
    *cap = nc;
    return 0;
}

static int new_node(struct gbuilder *b, int kind)
{
    if (b->status) return -1;
    int n = b->g.n_nodes;
    int cap = b->cap_nodes;
    if (grow(b, (void **)&b->g.nodes, &b->cap_nodes, n + 1, sizeof(struct gnode), GRAMMAR_MAX_NODES, "nodes"))
        return -1;
    if (b->cap_nodes != cap) {
        uint8_t *d = realloc(b->defined, (size_t)b->cap_nodes);
        if (!d) return gb_fail(b, FERRY_ERR_NOMEM, "out of memory");
        b->defined = d;
    }
    memset(&b->g.nodes[n], 0, sizeof b->g.nodes[n]);
    b->g.nodes[n].kind = (uint8_t)kind;
    b->g.nodes[n].a = b->g.nodes[n].c = -1;
    b->g.nodes[n].cost = GCOST_INF;
    b->defined[n] = 1;
    b->g.n_nodes++;
    return n;
}

static int add_bytes(struct gbuilder *b, const char *s, size_t n)
{
    if (b->status) return -1;
    if (b->n_bytes + n > MAX_BYTES)
        return gb_fail(b, FERRY_ERR_RANGE, "the grammar is too large (more than %d literal bytes)",
                       MAX_BYTES);
    if (b->n_bytes + n > b->cap_bytes) {
        size_t nc = b->cap_bytes ? b->cap_bytes : 1024;
        while (nc < b->n_bytes + n) nc *= 2;
        char *q = realloc(b->g.bytes, nc);
        if (!q) return gb_fail(b, FERRY_ERR_NOMEM, "out of memory");
        b->g.bytes = q;
        b->cap_bytes = nc;
    }
    if (n) memcpy(b->g.bytes + b->n_bytes, s, n);
    int off = (int)b->n_bytes;
    b->n_bytes += n;
    return off;
}

static int add_kids(struct gbuilder *b, const int *kids, int n)
{
    if (b->status) return -1;
    for (int i = 0; i < n; i++)
        if (kids[i] < 0 || kids[i] >= b->g.n_nodes) return gb_fail(b, FERRY_ERR_INTERNAL, "bad child node");
    if (grow(b, (void **)&b->g.kids, &b->cap_kids, b->n_kids + n, sizeof(int32_t), MAX_POOL, "children"))
        return -1;
    int off = b->n_kids;
    for (int i = 0; i < n; i++) b->g.kids[off + i] = kids[i];
    b->n_kids += n;
    return off;
}

int gb_lit(struct gbuilder *b, const char *s, size_t n)
{
    int off = add_bytes(b, s, n);
    int nd = new_node(b, GK_LIT);
    if (nd < 0 || off < 0) return -1;
    b->g.nodes[nd].a = off;
    b->g.nodes[nd].b = (int32_t)n;
    return nd;
}

static int list_node(struct gbuilder *b, int kind, const int *kids, int n)
{
    int off = add_kids(b, kids, n);
    int nd = new_node(b, kind);
    if (nd < 0 || off < 0) return -1;
    b->g.nodes[nd].a = off;
    b->g.nodes[nd].b = n;
    return nd;
}

int gb_seq(struct gbuilder *b, const int *kids, int n)
{
    return list_node(b, GK_SEQ, kids, n);
}

int gb_alt(struct gbuilder *b, const int *kids, int n)
{
    return list_node(b, GK_ALT, kids, n);
}

int gb_rep(struct gbuilder *b, int child, int min, int max)
{
    if (b->status) return -1;
    if (child < 0 || min < 0 || (max >= 0 && max < min))
        return gb_fail(b, FERRY_ERR_INTERNAL, "bad repetition");
    int nd = new_node(b, GK_REP);
    if (nd < 0) return -1;
    b->g.nodes[nd].a = child;
    b->g.nodes[nd].min = min;
    b->g.nodes[nd].max = max;
    return nd;
}

int gb_ws(struct gbuilder *b, int max)
{
    int nd = new_node(b, GK_WS);
    if (nd >= 0) b->g.nodes[nd].max = max < 0 ? 0 : max > 255 ? 255 : max;
    return nd;
}

int gb_string(struct gbuilder *b, struct regex_dfa *dfa, int min, int max)
{
    if (b->status) {
        regex_free(dfa);
        return -1;
    }
    int di = -1;
    if (dfa && (b->dfa_states += dfa->n_states) > MAX_DFA_STATES) {
        regex_free(dfa);
        return gb_fail(b, FERRY_ERR_RANGE,
                       "the patterns and formats need more than %d automaton states in all", MAX_DFA_STATES);
    }
    if (dfa) {
        /* bytes as a JSON string writes them: quote, backslash and \b\f\n\r\t escaped, other controls never
         */
        uint8_t w[256];
        for (int c = 0; c < 256; c++) w[c] = c >= 0x20 ? 1 : 0;
        w['"'] = w['\\'] = w['\b'] = w['\f'] = w['\n'] = w['\r'] = w['\t'] = 2;
        if (regex_weigh(dfa, w)) {
            regex_free(dfa);
            return gb_fail(b, FERRY_ERR_NOMEM, "out of memory");
        }
        if (grow(b, (void **)&b->g.dfas, &b->cap_dfas, b->g.n_dfas + 1, sizeof *b->g.dfas, 256, "patterns")) {
            regex_free(dfa);
            return -1;
        }
        di = b->g.n_dfas++;
        b->g.dfas[di] = dfa;
    }
    int nd = new_node(b, GK_STRING);
    if (nd < 0) return -1;
    b->g.nodes[nd].a = di;
    b->g.nodes[nd].min = min < 0 ? 0 : min;
    b->g.nodes[nd].max = max;
    return nd;
}

int gb_number(struct gbuilder *b, int flags, double lo, double hi)
{
    int nd = new_node(b, GK_NUMBER);
    if (nd < 0) return -1;
    struct gnode *n = &b->g.nodes[nd];
    n->flags = (uint8_t)flags;
    n->lo = lo;
    n->hi = hi;
    n->cost = gnum_min_len(n);
    return nd;
}

/* ---- containers ---- */

/* Appends s as a JSON string literal (quotes included) to the byte pool; returns its offset. */
static int add_json_string(struct gbuilder *b, const char *s, size_t n, int32_t *len)
{
    int start = -1;
    size_t before = b->n_bytes;
    if (add_bytes(b, "\"", 1) < 0) return -1;
    start = (int)before;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        char esc[8];
        size_t k = 0;
        if (ch == '"' || ch == '\\')
            esc[k++] = '\\', esc[k++] = (char)ch;
        else if (ch == '\n')
            esc[k++] = '\\', esc[k++] = 'n';
        else if (ch == '\t')
            esc[k++] = '\\', esc[k++] = 't';
        else if (ch == '\r')
            esc[k++] = '\\', esc[k++] = 'r';
        else if (ch < 0x20)
            k = (size_t)snprintf(esc, sizeof esc, "\\u%04x", ch);
        else
            esc[k++] = (char)ch;
        if (add_bytes(b, esc, k) < 0) return -1;
    }
    if (add_bytes(b, "\"", 1) < 0) return -1;
    *len = (int32_t)(b->n_bytes - before);
    return start;
}

int gb_object(struct gbuilder *b, const struct gb_prop *props, int n, int additional, int ws)
{
    if (b->status) return -1;
    if (n > MAX_PROPS)
        return gb_fail(b, FERRY_ERR_RANGE, "an object may declare at most %d properties", MAX_PROPS);
    if (grow(b, (void **)&b->g.props, &b->cap_props, b->n_props + n, sizeof(struct gprop), MAX_POOL,
             "properties"))
        return -1;
    int off = b->n_props;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++)
            if (props[j].key_len == props[i].key_len && !memcmp(props[j].key, props[i].key, props[i].key_len))
                return gb_fail(b, FERRY_ERR_INVALID, "property '%.60s' is declared twice", props[i].key);
        struct gprop *p = &b->g.props[off + i];
        p->key_off = add_json_string(b, props[i].key, props[i].key_len, &p->key_len);
        p->value = props[i].value;
        p->required = (uint8_t)(props[i].required != 0);
        p->enabled = 1;
        if (p->key_off < 0 || p->value < 0) return -1;
    }
    b->n_props += n;
    if (n == 0 && additional >= 0 && b->g.free_string < 0 &&
        (b->g.free_string = gb_string(b, NULL, 0, -1)) < 0)
        return -1;
    int nd = new_node(b, GK_OBJECT);
    if (nd < 0) return -1;
    struct gnode *o = &b->g.nodes[nd];
    o->a = off;
    o->b = n;
    o->c = n == 0 ? additional : -1;
    o->ws = (uint8_t)(ws < 0 ? 0 : ws > 255 ? 255 : ws);
    return nd;
}

int gb_array(struct gbuilder *b, int items, const int *prefix, int n_prefix, int min, int max, int ws)
{
    if (b->status) return -1;
    if (min < 0 || (max >= 0 && max < min)) return gb_fail(b, FERRY_ERR_INTERNAL, "bad array bounds");
    int off = add_kids(b, prefix, n_prefix);
    int nd = new_node(b, GK_ARRAY);
    if (nd < 0 || off < 0) return -1;
    struct gnode *a = &b->g.nodes[nd];
    a->a = items;
    a->b = off;
    a->c = n_prefix;
    a->min = min;
    a->max = max;
    a->ws = (uint8_t)(ws < 0 ? 0 : ws > 255 ? 255 : ws);
    return nd;
}

static int cmp_lit(const void *x, const void *y, void *arg)
{
    const struct glit *a = x, *b = y;
    const char *bytes = arg;
    int n = a->len < b->len ? a->len : b->len;
    int c = memcmp(bytes + a->off, bytes + b->off, (size_t)n);
    return c ? c : a->len - b->len;
}

int gb_litset(struct gbuilder *b, const struct gb_lit *lits, int n)
{
    if (b->status) return -1;
    if (n <= 0) return gb_fail(b, FERRY_ERR_INVALID, "an empty set of values accepts nothing");
    if (grow(b, (void **)&b->g.lits, &b->cap_lits, b->n_lits + n, sizeof(struct glit), MAX_POOL, "literals"))
        return -1;
    int off = b->n_lits;
    for (int i = 0; i < n; i++) {
        struct glit *l = &b->g.lits[off + i];
        l->off = add_bytes(b, lits[i].s, lits[i].n);
        l->len = (int32_t)lits[i].n;
        l->cont = lits[i].cont;
        if (l->off < 0) return -1;
    }
    /* sorted, duplicates dropped: the members sharing a prefix are then one contiguous range */
    qsort_r(b->g.lits + off, (size_t)n, sizeof(struct glit), cmp_lit, b->g.bytes);
    int m = 0;
    for (int i = 0; i < n; i++) {
        struct glit *l = &b->g.lits[off + i];
        if (m && !cmp_lit(&b->g.lits[off + m - 1], l, b->g.bytes)) continue;
        b->g.lits[off + m++] = *l;
    }
    b->n_lits = off + m;
    int nd = new_node(b, GK_LITSET);
    if (nd < 0) return -1;
    b->g.nodes[nd].a = off;
    b->g.nodes[nd].b = m;
    return nd;
}

int gb_reserve(struct gbuilder *b)
{
    int nd = new_node(b, GK_ALT);
    if (nd >= 0) b->defined[nd] = 0;
    return nd;
}

int gb_define(struct gbuilder *b, int id, int node)
{
    if (b->status) return -1;
    if (id < 0 || id >= b->g.n_nodes || b->defined[id] || node < 0)
        return gb_fail(b, FERRY_ERR_INTERNAL, "bad definition of a reserved node");
    int off = add_kids(b, &node, 1);
    if (off < 0) return -1;
    b->g.nodes[id].a = off;
    b->g.nodes[id].b = 1;
    b->defined[id] = 1;
    return id;
}

int gb_any(struct gbuilder *b, int ws)
{
    if (b->any_node >= 0 && b->any_ws == ws) return b->any_node;
    int id = gb_reserve(b);
    int kids[7];
    kids[0] = gb_object(b, NULL, 0, id, ws);
    kids[1] = gb_array(b, id, NULL, 0, 0, -1, ws);
    kids[2] = gb_string(b, NULL, 0, -1);
    kids[3] = gb_number(b, 0, 0, 0);
    kids[4] = gb_lit(b, "true", 4);
    kids[5] = gb_lit(b, "false", 5);
    kids[6] = gb_lit(b, "null", 4);
    int alt = gb_alt(b, kids, 7);
    if (gb_define(b, id, alt) < 0) return -1;
    b->any_node = id;
    b->any_ws = ws;
    return id;
}

/* ---- finishing: costs, first bytes, pruning ---- */

static uint32_t node_cost(const struct grammar *g, const struct gnode *n)
{
    switch (n->kind) {
    case GK_LIT:
        return (uint32_t)n->b;
    case GK_SEQ: {
        uint32_t s = 0;
        for (int i = 0; i < n->b; i++) s = cadd(s, g->nodes[g->kids[n->a + i]].cost);
        return s;
    }
    case GK_ALT: {
        uint32_t m = GCOST_INF;
        for (int i = 0; i < n->b; i++) {
            uint32_t c = g->nodes[g->kids[n->a + i]].cost;
            if (c < m) m = c;
        }
        return m;
    }
    case GK_REP:
        return n->min ? cmul(g->nodes[n->a].cost, (uint32_t)n->min) : 0;
    case GK_WS:
        return 0;
    case GK_STRING:
        if (n->a >= 0) {
            const struct regex_dfa *d = g->dfas[n->a];
            if (n->max >= 0 && d->cmin[d->start] > (uint32_t)n->max) return GCOST_INF;
            if (d->cmax[d->start] != REGEX_UNBOUNDED && d->cmax[d->start] < (uint32_t)n->min)
                return GCOST_INF;
            return cadd(2, d->wdist[d->start] == REGEX_UNBOUNDED ? GCOST_INF : d->wdist[d->start]);
        }
        return n->max >= 0 && n->max < n->min ? GCOST_INF : cadd(2, (uint32_t)n->min);
    case GK_NUMBER:
        return n->cost; /* fixed at creation */
    case GK_OBJECT: {
        uint32_t s = 2;
        int req = 0;
        for (int i = 0; i < n->b; i++) {
            const struct gprop *p = &g->props[n->a + i];
            if (!p->required) continue;
            s = cadd(s, cadd((uint32_t)p->key_len + 1, g->nodes[p->value].cost));
            req++;
        }
        return cadd(s, req > 1 ? (uint32_t)req - 1 : 0);
    }
    case GK_ARRAY: {
        uint32_t s = 2;
        for (int i = 0; i < n->min; i++) {
            int item = i < n->c ? g->kids[n->b + i] : n->a;
            s = cadd(s, item < 0 ? GCOST_INF : g->nodes[item].cost);
            if (i) s = cadd(s, 1);
        }
        return s;
    }
    default: { /* GK_LITSET */
        uint32_t m = GCOST_INF;
        for (int i = 0; i < n->b; i++) {
            const struct glit *l = &g->lits[n->a + i];
            uint32_t c = cadd((uint32_t)l->len, l->cont >= 0 ? g->nodes[l->cont].cost : 0);
            if (c < m) m = c;
        }
        return m;
    }
    }
}

static uint32_t hmax(uint32_t a, uint32_t b)
{
    return a > b ? a : b;
}

/* Frames a complete match of n needs, its own included, along the path needing fewest (see gnode.height): a
 * list's frame stays under each kid, an alternative is replaced by the kid it takes, a literal set by its
 * continuation. */
static uint32_t node_height(const struct grammar *g, const struct gnode *n)
{
    uint32_t h = 0;
    switch (n->kind) {
    case GK_SEQ:
        for (int i = 0; i < n->b; i++) h = hmax(h, g->nodes[g->kids[n->a + i]].height);
        return h >= GHEIGHT_INF ? GHEIGHT_INF : 1 + h;
    case GK_ALT:
        h = GHEIGHT_INF;
        for (int i = 0; i < n->b; i++) {
            const struct gnode *k = &g->nodes[g->kids[n->a + i]];
            if (k->cost < GCOST_INF && k->height < h) h = k->height;
        }
        return h;
    case GK_REP:
        if (n->min == 0) return 1;
        h = g->nodes[n->a].height;
        return h >= GHEIGHT_INF ? GHEIGHT_INF : 1 + h;
    case GK_OBJECT:
        for (int i = 0; i < n->b; i++)
            if (g->props[n->a + i].required) h = hmax(h, g->nodes[g->props[n->a + i].value].height);
        return h >= GHEIGHT_INF ? GHEIGHT_INF : 1 + h;
    case GK_ARRAY:
        for (int i = 0; i < n->min; i++) {
            int item = i < n->c ? g->kids[n->b + i] : n->a;
            h = hmax(h, item < 0 ? GHEIGHT_INF : g->nodes[item].height);
        }
        return h >= GHEIGHT_INF ? GHEIGHT_INF : 1 + h;
    case GK_LITSET:
        h = GHEIGHT_INF;
        for (int i = 0; i < n->b; i++) {
            const struct glit *l = &g->lits[n->a + i];
            uint32_t c = l->cont >= 0 ? g->nodes[l->cont].height : 1;
            if (c < h) h = c;
        }
        return h;
    default: /* LIT, WS, STRING, NUMBER: matched within their own frame */
        return 1;
    }
}

static void set_bit(uint8_t *set, int c)
{
    set[c >> 3] |= (uint8_t)(1u << (c & 7));
}

/* Adds node k's first bytes to set; returns 1 when k can match nothing (is nullable). */
static int add_first(const struct grammar *g, uint8_t *set, int k)
{
    const struct gnode *x = &g->nodes[k];
    if (x->cost >= GCOST_INF) return 0;
    for (int i = 0; i < 32; i++) set[i] |= x->first[i];
    return x->cost == 0;
}

static void node_first(const struct grammar *g, const struct gnode *n, uint8_t *set)
{
    memset(set, 0, 32);
    switch (n->kind) {
    case GK_LIT:
        if (n->b) set_bit(set, (unsigned char)g->bytes[n->a]);
        break;
    case GK_SEQ:
        for (int i = 0; i < n->b; i++)
            if (!add_first(g, set, g->kids[n->a + i])) break;
        break;
    case GK_ALT:
        for (int i = 0; i < n->b; i++) add_first(g, set, g->kids[n->a + i]);
        break;
    case GK_REP:
        if (n->max != 0) add_first(g, set, n->a);
        break;
    case GK_WS:
        if (n->max > 0) set_bit(set, ' '), set_bit(set, '\t'), set_bit(set, '\n'), set_bit(set, '\r');
        break;
    case GK_STRING:
        set_bit(set, '"');
        break;
    case GK_NUMBER:
        set_bit(set, '-');
        for (int c = '0'; c <= '9'; c++) set_bit(set, c);
        break;
    case GK_OBJECT:
        set_bit(set, '{');
        break;
    case GK_ARRAY:
        set_bit(set, '[');
        break;
    default:
        for (int i = 0; i < n->b; i++) {
            const struct glit *l = &g->lits[n->a + i];
            if (l->len)
                set_bit(set, (unsigned char)g->bytes[l->off]);
            else if (l->cont >= 0)
                add_first(g, set, l->cont);
        }
    }
}

int gb_finish(struct gbuilder *b, int root, struct grammar **out, char err[256])
{
    *out = NULL;
    struct grammar *g = &b->g;
    if (!b->status && (root < 0 || root >= g->n_nodes)) gb_fail(b, FERRY_ERR_INTERNAL, "no root node");
    for (int i = 0; !b->status && i < g->n_nodes; i++)
        if (!b->defined[i]) gb_fail(b, FERRY_ERR_INTERNAL, "a reserved node was never defined");
    if (b->status) {
        int st = gb_error(b, err);
        gb_free(b);
        return st;
    }
    /* shortest completions: decrease from "none" until nothing changes (recursion converges) */
    for (int it = 0, changed = 1; changed && it < 400; it++) {
        changed = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            if (g->nodes[i].kind == GK_NUMBER) continue;
            uint32_t c = node_cost(g, &g->nodes[i]);
            if (c < g->nodes[i].cost) g->nodes[i].cost = c, changed = 1;
        }
    }
    for (int it = 0, changed = 1; changed && it < 400; it++) {
        changed = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            uint8_t set[32];
            node_first(g, &g->nodes[i], set);
            if (memcmp(set, g->nodes[i].first, 32)) {
                for (int k = 0; k < 32; k++) set[k] |= g->nodes[i].first[k];
                memcpy(g->nodes[i].first, set, 32);
                changed = 1;
            }
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        struct gnode *n = &g->nodes[i];
        n->nullable = n->cost == 0;
        if (n->kind == GK_OBJECT) {
            for (int k = 0; k < n->b; k++) {
                struct gprop *p = &g->props[n->a + k];
                p->enabled = g->nodes[p->value].cost < GCOST_INF;
            }
            if (n->c >= 0 && g->nodes[n->c].cost >= GCOST_INF) n->c = -1; /* no value fits a free key */
        } else if (n->kind == GK_ARRAY) {
            int lim = n->a >= 0 && g->nodes[n->a].cost < GCOST_INF ? -1 : n->c;
            for (int k = 0; k < n->c; k++)
                if (g->nodes[g->kids[n->b + k]].cost >= GCOST_INF) {
                    lim = k;
                    break;
                }
            if (lim >= 0 && (n->max < 0 || n->max > lim)) n->max = lim;
        } else if (n->kind == GK_REP) {
            if (g->nodes[n->a].cost >= GCOST_INF || g->nodes[n->a].cost == 0) n->max = n->min;
        } else if (n->kind == GK_LITSET) {
            int m = 0;
            for (int k = 0; k < n->b; k++) {
                struct glit l = g->lits[n->a + k];
                if (l.cont >= 0 && g->nodes[l.cont].cost >= GCOST_INF) continue;
                g->lits[n->a + m++] = l;
            }
            n->b = m;
        }
    }
    if (g->nodes[root].cost >= GCOST_INF) {
        snprintf(err, 256, "the schema accepts no value that ferry can generate");
        gb_free(b);
        return FERRY_ERR_INVALID;
    }
    for (int i = 0; i < g->n_nodes; i++) g->nodes[i].height = GHEIGHT_INF;
    for (int it = 0, changed = 1; changed && it < 400; it++) { /* like the costs: down from "none" */
        changed = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            uint32_t h = node_height(g, &g->nodes[i]);
            if (h < g->nodes[i].height) g->nodes[i].height = (uint16_t)h, changed = 1;
        }
    }
    if (g->nodes[root].height > GRAMMAR_MAX_DEPTH) {
        snprintf(err, 256, "every value nests deeper than the recogniser's %d levels", GRAMMAR_MAX_DEPTH);
        gb_free(b);
        return FERRY_ERR_UNSUPPORTED;
    }
    struct grammar *res = malloc(sizeof *res);
    if (!res) {
        gb_free(b);
        return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    }
    *res = *g;
    res->root = root;
    memset(g, 0, sizeof *g);
    gb_free(b);
    *out = res;
    return 0;
}

void grammar_free(struct grammar *g)
{
    if (!g) return;
    free(g->nodes);
    free(g->bytes);
    free(g->kids);
    free(g->props);
    free(g->lits);
    for (int i = 0; i < g->n_dfas; i++) regex_free(g->dfas[i]);
    free(g->dfas);
    free(g);
}

int grammar_json_object(struct grammar **out, int ws, int any_ws, char err[256])
{
    struct gbuilder *b;
    if (gb_init(&b)) return ferry_fail(err, FERRY_ERR_NOMEM, "out of memory");
    b->g.any_ws = any_ws;
    int any = gb_any(b, ws);
    int kids[3] = {gb_ws(b, ws), gb_object(b, NULL, 0, any, ws), gb_ws(b, ws)};
    return gb_finish(b, gb_seq(b, kids, 3), out, err);
}
