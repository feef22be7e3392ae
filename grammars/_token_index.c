/* A regex's token index, from its byte-level DFA and a trie of the vocabulary's tokens.
 *
 * outlines-core builds an Index by walking every token through the DFA from every state: states x
 * vocabulary, ~1.3 s for one tool's unit on a 262k vocabulary. Here the DFA comes from outlines-core
 * itself, as the Index of `(R)\x02` over a vocabulary of the 256 single bytes (~2 ms; the sentinel
 * byte \x02 marks where R may end, see below), and each state's tokens come from one walk of the
 * token trie that prunes a branch at the first byte the DFA refuses: a state inside a JSON string
 * visits most of the trie, a state inside a key or a name a few nodes.
 *
 * Sentinel: R's accepting states are those with a \x02 edge into an accepting state of `(R)\x02`.
 * Every accepting state of `(R)\x02` must have no byte edge (else \x02 is part of R itself, and
 * token_index returns -4: the caller falls back to outlines-core). Those edges are then removed.
 *
 * The result is serialised as outlines-core serialises an Index (grammars/_varint.h), so
 * outlines_core.Index.from_binary reads it and the rest of maskd cannot tell the difference:
 *   initial, n_finals, finals..., n_states, (state, n_tokens, (token, next)...)..., eos, vocab_size
 * Final states carry (eos -> itself), as outlines-core's do. Unlike outlines-core 0.2.14, a token
 * leaving an accepting state for a non-accepting one is kept (`a(;b)*` accepts `a;b`).
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

/* 0 on success (*out: malloc'd bytes); -1 malformed input, -2 out of memory, -3 state ids too large,
 * -4 the sentinel is part of the regex. */
int token_index(const trie_t *t, const uint8_t *buf, int64_t size, uint8_t sentinel, uint64_t eos,
                uint64_t vocab_len, uint8_t **out, int64_t *out_len) {
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
    int32_t *dense = malloc((max_id + 1) * sizeof *dense), *table = malloc(n * 256 * sizeof *table);
    uint32_t *keys = malloc(n * sizeof *keys);
    uint8_t *accepting = calloc(n, 1), *final = calloc(n, 1);
    int32_t *seen = malloc(n * sizeof *seen), *queue = malloc(n * sizeof *queue);
    int32_t *stack_node = malloc(t->n_nodes * sizeof *stack_node), *stack_state = malloc(t->n_nodes * sizeof *stack_state);
    writer_t body = {0}, head = {0}, row = {0};
    if (!dense || !table || !keys || !accepting || !final || !seen || !queue || !stack_node || !stack_state) goto done;
    memset(dense, 0xff, (max_id + 1) * sizeof *dense);
    memset(table, 0xff, n * 256 * sizeof *table);
    memset(seen, 0xff, n * sizeof *seen);
    r.p = states_at;
    for (uint64_t s = 0; s < n; s++) { /* the key order first: next states may come later */
        uint64_t key = rd(&r), m = rd(&r);
        keys[s] = (uint32_t)key;
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
    int64_t head_q = 0, tail_q = 0, n_out = 0, n_final = 0;
    if (initial > max_id || dense[initial] < 0) { rc = -1; goto done; }
    seen[dense[initial]] = 1;
    queue[tail_q++] = dense[initial];
    while (head_q < tail_q) {
        int32_t s = queue[head_q++];
        int64_t top = 0, pairs = 0;
        row.len = 0;
        for (int32_t c = t->child[0]; c >= 0; c = t->sibling[c]) {
            int32_t x = table[s * 256 + t->byte[c]];
            if (x >= 0) { stack_node[top] = c; stack_state[top++] = x; }
        }
        while (top > 0) {
            int32_t node = stack_node[--top], x = stack_state[top];
            for (int32_t k = 0; k < t->tok_n[node]; k++) {
                wr(&row, (uint64_t)t->ids[t->tok_at[node] + k]);
                wr(&row, keys[x]);
                pairs++;
            }
            if (t->tok_n[node] && seen[x] < 0) { seen[x] = 1; queue[tail_q++] = x; }
            for (int32_t c = t->child[node]; c >= 0; c = t->sibling[c]) {
                int32_t y = table[x * 256 + t->byte[c]];
                if (y >= 0) { stack_node[top] = c; stack_state[top++] = y; }
            }
        }
        if (final[s]) { wr(&row, eos); wr(&row, keys[s]); pairs++; n_final++; }
        wr(&body, keys[s]);
        wr(&body, (uint64_t)pairs);
        if (row.err || body.err) goto done;
        wr_raw(&body, row.p, row.len);
        n_out++;
    }
    wr(&head, keys[dense[initial]]);
    wr(&head, (uint64_t)n_final);
    for (int64_t i = 0; i < tail_q; i++)
        if (final[queue[i]]) wr(&head, keys[queue[i]]);
    wr(&head, (uint64_t)n_out);
    wr(&body, eos);
    wr(&body, vocab_len);
    if (head.err || body.err) goto done;
    *out = malloc(head.len + body.len);
    if (!*out) goto done;
    memcpy(*out, head.p, head.len);
    memcpy(*out + head.len, body.p, body.len);
    *out_len = head.len + body.len;
    rc = 0;
done:
    free(dense); free(table); free(keys); free(accepting); free(final); free(seen); free(queue);
    free(stack_node); free(stack_state); free(body.p); free(head.p); free(row.p);
    return rc;
}

void token_index_free(uint8_t *p) { free(p); }

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
