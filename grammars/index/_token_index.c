/* A regex's token index, from its byte-level DFA and a trie of the vocabulary's tokens.
 *
 * outlines-core builds an Index by walking every token through the DFA from every state: states x
 * vocabulary, ~1.3 s for one tool's unit on a 262k vocabulary. Here the DFA comes from outlines-core
 * itself, as the Index of `(R)\x02` over a vocabulary of the 256 single bytes (~2 ms; the sentinel
 * byte \x02 marks where R may end, see below), and each state's tokens come from one walk of the
 * token trie that prunes a branch at the first byte the DFA refuses.
 *
 * Loop states. Inside a JSON string almost every token stays in the string: a state to which every
 * character of string content (strict UTF-8, all but `"`, `\`, U+0000-U+001F and U+007F-U+009F)
 * leads back is a loop state, and every *plain* token (one spelling only such characters: 48,463 of
 * SmolLM2's 49,135, 254,197 of Gemma 3's 255,823) surely leads from it to itself. Such a state's
 * transitions are written as a flag plus its other tokens' transitions (found by walking a trie of
 * the non-plain tokens alone), not as ~50k-260k pairs: the walk, the tables and the memory shrink
 * by as much (grammars/index/unit_index.py reads the flag).
 *
 * Sentinel: R's accepting states are those with a \x02 edge into an accepting state of `(R)\x02`.
 * Every accepting state of `(R)\x02` must have no byte edge (else \x02 is part of R itself, and
 * token_index returns -4: the caller falls back to outlines-core). Those edges are then removed.
 *
 * Output (token_index_t): states numbered in breadth-first order from the initial state (0); per
 * state, final and loop flags and its explicit transitions (CSR, token ids ascending). No EOS
 * transitions: a final state accepts EOS. Unlike outlines-core 0.2.14, a token leaving an accepting
 * state for a non-accepting one is kept (`a(;b)*` accepts `a;b`).
 */
#include "_varint.h"
typedef struct {
    int64_t n_nodes;
    int32_t *child, *sibling; /* [n_nodes] first child, next sibling; -1: none */
    uint8_t *byte;            /* [n_nodes] the byte on the edge into the node */
    int32_t *tok_at, *tok_n;  /* [n_nodes] the node's tokens: ids[tok_at .. tok_at + tok_n) */
    int32_t *ids;             /* [n_tokens] token ids in sorted-bytes order */
} trie_t;

void trie_free(trie_t *t) {
    free(t->child); free(t->sibling); free(t->byte); free(t->tok_at); free(t->tok_n); free(t->ids);
    memset(t, 0, sizeof *t);
}

/* Tokens sorted by their bytes: token k is bytes[off[k] .. off[k+1]) with id ids[k]. 0, or -2. */
int trie_build(const uint8_t *bytes, const int64_t *off, const int32_t *ids, int64_t n, trie_t *t) {
    memset(t, 0, sizeof *t);
    int64_t cap = off[n] + 1;
    t->child = malloc(cap * sizeof *t->child); t->sibling = malloc(cap * sizeof *t->sibling);
    t->byte = malloc(cap); t->tok_at = malloc(cap * sizeof *t->tok_at);
    t->tok_n = calloc(cap, sizeof *t->tok_n); t->ids = malloc((n + 1) * sizeof *t->ids);
    int32_t *path = malloc((cap + 1) * sizeof *path); /* path[d]: node at depth d of the last token */
    if (!t->child || !t->sibling || !t->byte || !t->tok_at || !t->tok_n || !t->ids || !path) {
        free(path); trie_free(t); return -2;
    }
    t->child[0] = t->sibling[0] = -1;
    t->n_nodes = 1;
    path[0] = 0;
    int64_t depth = 0; /* nodes on the path below the root */
    for (int64_t k = 0; k < n; k++) {
        const uint8_t *s = bytes + off[k];
        int64_t len = off[k + 1] - off[k], common = 0;
        if (k > 0) {
            const uint8_t *prev = bytes + off[k - 1];
            int64_t plen = off[k] - off[k - 1];
            while (common < len && common < plen && common < depth && prev[common] == s[common]) common++;
        }
        depth = common;
        for (int64_t d = common; d < len; d++) { /* new nodes, prepended to their parent's children */
            int32_t node = (int32_t)t->n_nodes++, parent = path[d];
            t->byte[node] = s[d];
            t->child[node] = -1;
            t->sibling[node] = t->child[parent];
            t->child[parent] = node;
            path[d + 1] = node;
        }
        depth = len;
        int32_t node = path[len];
        if (t->tok_n[node] == 0) t->tok_at[node] = (int32_t)k;
        t->tok_n[node]++;
        t->ids[k] = ids[k];
    }
    free(path);
    return 0;
}

typedef struct {
    int64_t n_states, n_trans;
    uint8_t *final, *loop; /* [n_states] */
    int64_t *off;          /* [n_states + 1] CSR offsets into tok / nxt */
    int32_t *tok, *nxt;    /* [n_trans] token ids (ascending within a state) and next states */
} token_index_t;

void token_index_free(token_index_t *x) {
    free(x->final); free(x->loop); free(x->off); free(x->tok); free(x->nxt);
    memset(x, 0, sizeof *x);
}

/* Whether every string of k bytes 0x80-0xBF leads from q to s (memo[q * 4 + k]: -1 unknown). */
static int tail_ok(const int32_t *table, int32_t q, int k, int32_t s, int8_t *memo) {
    if (q < 0) return 0;
    if (k == 0) return q == s;
    int8_t *m = &memo[(int64_t)q * 4 + k];
    if (*m < 0) {
        int ok = 1;
        for (int c = 0x80; c <= 0xbf && ok; c++) ok = tail_ok(table, table[(int64_t)q * 256 + c], k - 1, s, memo);
        *m = (int8_t)ok;
    }
    return *m;
}

/* Whether every character of JSON string content leads from s back to s (see the top). */
static int loops(const int32_t *table, int64_t n, int32_t s, int8_t *memo) {
    const int32_t *row = table + (int64_t)s * 256;
    for (int b = 0x20; b < 0x7f; b++)
        if (b != '"' && b != '\\' && row[b] != s) return 0;
    memset(memo, 0xff, (size_t)n * 4);
    for (int b = 0xc2; b <= 0xf4; b++) { /* strict UTF-8 lead bytes and their first continuation's range */
        int k = b < 0xe0 ? 1 : b < 0xf0 ? 2 : 3, lo = 0x80, hi = 0xbf;
        if (b == 0xc2 || b == 0xe0) lo = 0xa0; /* C2 80-9F: U+0080-U+009F, not string content */
        else if (b == 0xed) hi = 0x9f;
        else if (b == 0xf0) lo = 0x90;
        else if (b == 0xf4) hi = 0x8f;
        int32_t q = row[b];
        if (q < 0) return 0;
        for (int c = lo; c <= hi; c++)
            if (!tail_ok(table, table[(int64_t)q * 256 + c], k - 1, s, memo)) return 0;
    }
    return 1;
}

/* (token, next) pairs p[0 .. 2n) sorted by token (distinct, >= 0): insertion sort when few, else
 * least-significant-byte radix sort through tmp[0 .. 2n) (qsort's callback per comparison took a
 * third of a Gemma-sized compile's walk). */
#define FEW_PAIRS 32 /* sorted by insertion; more, by radix through a second buffer */
static void sort_pairs(int32_t *p, int64_t n, int32_t *tmp) {
    if (n <= FEW_PAIRS) {
        for (int64_t i = 1; i < n; i++) {
            int32_t tok = p[2 * i], nxt = p[2 * i + 1];
            int64_t j = i;
            for (; j > 0 && p[2 * (j - 1)] > tok; j--) { p[2 * j] = p[2 * (j - 1)]; p[2 * j + 1] = p[2 * (j - 1) + 1]; }
            p[2 * j] = tok; p[2 * j + 1] = nxt;
        }
        return;
    }
    uint32_t top = 0;
    for (int64_t i = 0; i < n; i++) top |= (uint32_t)p[2 * i];
    int32_t *src = p, *dst = tmp;
    for (int shift = 0; shift < 32 && (top >> shift); shift += 8) {
        int64_t at[257] = {0};
        for (int64_t i = 0; i < n; i++) at[(((uint32_t)src[2 * i] >> shift) & 0xff) + 1]++;
        for (int d = 0; d < 256; d++) at[d + 1] += at[d];
        for (int64_t i = 0; i < n; i++) {
            int64_t k = at[((uint32_t)src[2 * i] >> shift) & 0xff]++;
            dst[2 * k] = src[2 * i]; dst[2 * k + 1] = src[2 * i + 1];
        }
        int32_t *swap = src; src = dst; dst = swap;
    }
    if (src != p) memcpy(p, src, (size_t)n * 2 * sizeof *p);
}

/* 0 on success; -1 malformed input, -2 out of memory, -3 state ids too large, -4 the sentinel is
 * part of the regex. `full`: every text token; `other`: the non-plain ones (walked from loop states). */
int token_index(const trie_t *full, const trie_t *other, const uint8_t *buf, int64_t size, uint8_t sentinel,
                token_index_t *out) {
    memset(out, 0, sizeof *out);
    reader_t r = {buf, buf + size, 0};
    uint64_t initial = rd(&r), n_finals = rd(&r);
    const uint8_t *finals_at = r.p;
    for (uint64_t i = 0; i < n_finals && !r.err; i++) rd(&r);
    uint64_t n = rd(&r);
    if (r.err || n == 0 || n > (uint64_t)size) return -1;
    const uint8_t *states_at = r.p;
    uint64_t max_id = initial;
    for (uint64_t s = 0; s < n && !r.err; s++) {
        uint64_t key = rd(&r), m = rd(&r);
        if (key > max_id) max_id = key;
        for (uint64_t j = 0; j < m && !r.err; j++) { rd(&r); uint64_t x = rd(&r); if (x > max_id) max_id = x; }
    }
    if (r.err) return -1;
    if (max_id > 0x7fffffffULL) return -3;

    int rc = -2;
    int64_t nodes = full->n_nodes > other->n_nodes ? full->n_nodes : other->n_nodes;
    int32_t *dense = malloc((max_id + 1) * sizeof *dense), *table = malloc(n * 256 * sizeof *table);
    uint8_t *accepting = calloc(n, 1), *final = calloc(n, 1), *loop = calloc(n, 1);
    int8_t *memo = malloc(n * 4);
    int32_t *number = malloc(n * sizeof *number), *queue = malloc(n * sizeof *queue);
    int32_t *stack_node = malloc(nodes * sizeof *stack_node), *stack_state = malloc(nodes * sizeof *stack_state);
    int64_t cap = 1 << 16, n_trans = 0;
    int32_t *pairs = malloc(2 * cap * sizeof *pairs); /* (token, DFA state) pairs, then (token, number) */
    int32_t *sorting = NULL; /* sort_pairs' second buffer: the most pairs of one state so far */
    int64_t sorting_cap = 0;
    out->off = malloc((n + 1) * sizeof *out->off);
    if (!dense || !table || !accepting || !final || !loop || !memo || !number || !queue || !stack_node
        || !stack_state || !pairs || !out->off) goto done;
    memset(dense, 0xff, (max_id + 1) * sizeof *dense);
    memset(table, 0xff, n * 256 * sizeof *table);
    memset(number, 0xff, n * sizeof *number);
    r.p = states_at;
    for (uint64_t s = 0; s < n; s++) { /* the key order first: next states may come later */
        uint64_t key = rd(&r), m = rd(&r);
        dense[key] = (int32_t)s;
        for (uint64_t j = 0; j < 2 * m; j++) rd(&r);
    }
    r.p = states_at;
    rc = -1;
    for (uint64_t s = 0; s < n; s++) {
        rd(&r);
        uint64_t m = rd(&r);
        for (uint64_t j = 0; j < m; j++) {
            uint64_t tok = rd(&r), x = rd(&r);
            if (dense[x] < 0) goto done;
            if (tok < 256) table[s * 256 + tok] = dense[x];
        }
    }
    reader_t f = {finals_at, buf + size, 0};
    for (uint64_t i = 0; i < n_finals; i++) {
        uint64_t id = rd(&f);
        if (id > max_id || dense[id] < 0) goto done;
        accepting[dense[id]] = 1;
    }
    rc = -4;
    for (uint64_t s = 0; s < n; s++)
        for (int b = 0; accepting[s] && b < 256; b++)
            if (table[s * 256 + b] >= 0) goto done;
    for (uint64_t s = 0; s < n; s++) {
        int32_t *edge = &table[s * 256 + sentinel];
        if (*edge >= 0 && accepting[*edge]) { final[s] = 1; *edge = -1; }
    }

    /* breadth-first over the states tokens reach, each state's tokens from one pruned trie walk */
    rc = -2;
    int64_t head_q = 0, tail_q = 0;
    if (initial > max_id || dense[initial] < 0) { rc = -1; goto done; }
    number[dense[initial]] = 0;
    queue[tail_q++] = dense[initial];
    out->off[0] = 0;
    while (head_q < tail_q) {
        int32_t s = queue[head_q++];
        loop[s] = (uint8_t)loops(table, (int64_t)n, s, memo);
        const trie_t *t = loop[s] ? other : full;
        int64_t top = 0, start = n_trans;
        for (int32_t c = t->child[0]; c >= 0; c = t->sibling[c]) {
            int32_t x = table[s * 256 + t->byte[c]];
            if (x >= 0) { stack_node[top] = c; stack_state[top++] = x; }
        }
        while (top > 0) {
            int32_t node = stack_node[--top], x = stack_state[top];
            if (t->tok_n[node]) {
                if (number[x] < 0) { number[x] = (int32_t)tail_q; queue[tail_q++] = x; }
                if (n_trans + t->tok_n[node] > cap) {
                    while (n_trans + t->tok_n[node] > cap) cap *= 2;
                    int32_t *grown = realloc(pairs, 2 * cap * sizeof *pairs);
                    if (!grown) goto done;
                    pairs = grown;
                }
                for (int32_t k = 0; k < t->tok_n[node]; k++) {
                    pairs[2 * n_trans] = t->ids[t->tok_at[node] + k];
                    pairs[2 * n_trans++ + 1] = number[x];
                }
            }
            for (int32_t c = t->child[node]; c >= 0; c = t->sibling[c]) {
                int32_t y = table[(int64_t)x * 256 + t->byte[c]];
                if (y >= 0) { stack_node[top] = c; stack_state[top++] = y; }
            }
        }
        if (n_trans - start > FEW_PAIRS && n_trans - start > sorting_cap) {
            free(sorting);
            sorting_cap = n_trans - start;
            if (!(sorting = malloc(2 * sorting_cap * sizeof *sorting))) goto done;
        }
        sort_pairs(pairs + 2 * start, n_trans - start, sorting);
        out->off[head_q] = n_trans;
    }
    out->n_states = tail_q;
    out->n_trans = n_trans;
    out->final = malloc(tail_q + 1);
    out->loop = malloc(tail_q + 1);
    out->tok = malloc((n_trans + 1) * sizeof *out->tok);
    out->nxt = malloc((n_trans + 1) * sizeof *out->nxt);
    if (!out->final || !out->loop || !out->tok || !out->nxt) goto done;
    for (int64_t i = 0; i < tail_q; i++) { out->final[i] = final[queue[i]]; out->loop[i] = loop[queue[i]]; }
    for (int64_t k = 0; k < n_trans; k++) { out->tok[k] = pairs[2 * k]; out->nxt[k] = pairs[2 * k + 1]; }
    rc = 0;
done:
    free(dense); free(table); free(accepting); free(final); free(loop); free(memo); free(number); free(queue);
    free(stack_node); free(stack_state); free(pairs); free(sorting);
    if (rc) token_index_free(out);
    return rc;
}

/* best[k] for k in [0, n]: the fewest tokens spelling text[k:] (UNSPLIT = 1 << 30 where none does);
 * a `hole` byte is one token of its own (the JSON-value automaton's value) and no token spans it. */
void token_split(const trie_t *t, const uint8_t *text, int64_t n, uint8_t hole, int32_t *best) {
    const int32_t unsplit = 1 << 30;
    best[n] = 0;
    for (int64_t k = n - 1; k >= 0; k--) {
        best[k] = unsplit;
        if (text[k] == hole) { best[k] = best[k + 1] < unsplit ? best[k + 1] + 1 : unsplit; continue; }
        int32_t node = 0;
        for (int64_t d = k; d < n && text[d] != hole; d++) {
            int32_t c = t->child[node];
            while (c >= 0 && t->byte[c] != text[d]) c = t->sibling[c];
            if (c < 0) break;
            node = c;
            if (t->tok_n[node] && best[d + 1] < unsplit && best[d + 1] + 1 < best[k]) best[k] = best[d + 1] + 1;
        }
    }
}
