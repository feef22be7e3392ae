/* Distance table of an outlines-core token index, read straight from its serialised form.
 *
 * An outlines_core.Index pickles as bincode with variable-length integers: every field is an
 * unsigned varint (< 251: one byte; 251/252/253: a u16/u32/u64 little-endian follows). Layout:
 *   initial_state, n_finals, finals..., n_states, (state, n_tokens, (token, next_state)...)...,
 *   eos_token_id, vocab_size
 * Parsing 20M transitions here takes ~0.2 s; outlines-core's get_transitions() takes ~5 s and
 * gigabytes of Python objects for the same index.
 *
 * index_table() computes, for every state, the fewest tokens that reach a final state (a BFS
 * backwards from the finals); the distance of its farthest successor; the most common distance
 * among its successors (the mode: inside a JSON string, that of the ~48k tokens that stay in the
 * string); and its "odd" tokens, those whose successor's distance differs from the mode. Under a
 * token budget a state's mask is then its full mask minus odd tokens, or odd tokens alone.
 *
 * Given the logits width (vocab_size > 0), it also writes every state's mask in the short form
 * grammars/sparse_mask.py applies on CPU, so a state's first visit needs no bitmask: the state's
 * tokens below vocab_size, plus eos_ids in final states; kind 2 (banned ids over [0, vocab_size))
 * when banned <= banned_max and banned <= allowed, else kind 1 (allowed ids) when allowed <=
 * allowed_max, else kind 0 (none). Ids ascend. If all the lists together would hold more than
 * ids_cap ids, none are written (n_sparse = -1).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t n_states, n_trans, n_odd;
    uint32_t initial;
    uint32_t *keys;      /* [n_states] state ids, in serialised order */
    int32_t *dist;       /* [n_states] fewest tokens to a final state; -1 if none is reachable */
    int32_t *far;        /* [n_states] distance of the state's farthest successor (-1: none) */
    int32_t *mode;       /* [n_states] the most common distance among its successors */
    int64_t *odd_off;    /* [n_states + 1] CSR offsets into odd_tok / odd_dist */
    int32_t *odd_tok;    /* [n_odd] tokens whose successor's distance is not the mode */
    int32_t *odd_dist;   /* [n_odd] distance of the state the token leads to */
    int64_t n_sparse;    /* ids in sp_ids; -1: not written (no vocab_size, or over ids_cap) */
    int32_t *count;      /* [n_states] the state's tokens other than the index's EOS */
    int8_t *sp_kind;     /* [n_states] 0 none, 1 allowed ids, 2 banned ids */
    int32_t *sp_off;     /* [n_states + 1] CSR offsets into sp_ids */
    int32_t *sp_ids;     /* [n_sparse] ascending token ids */
} index_table_t;

#include "_varint.h"

void index_table_free(index_table_t *t) {
    free(t->keys); free(t->dist); free(t->far); free(t->mode); free(t->odd_off); free(t->odd_tok); free(t->odd_dist);
    free(t->count); free(t->sp_kind); free(t->sp_off); free(t->sp_ids);
    memset(t, 0, sizeof *t);
}

static int sparse_forms(index_table_t *out, const int64_t *off, const int32_t *tok, const uint8_t *final,
                        uint32_t eos, int64_t vocab_size, const int32_t *eos_ids, int64_t n_eos,
                        int64_t allowed_max, int64_t banned_max, int64_t ids_cap);

/* 0 on success; -1 malformed input, -2 out of memory, -3 state ids too large. */
int index_table(const uint8_t *buf, int64_t size, int64_t vocab_size, const int32_t *eos_ids, int64_t n_eos,
                int64_t allowed_max, int64_t banned_max, int64_t ids_cap, index_table_t *out) {
    memset(out, 0, sizeof *out);
    reader_t r = {buf, buf + size, 0};
    uint64_t initial = rd(&r), n_finals = rd(&r);
    const uint8_t *finals_at = r.p;
    for (uint64_t i = 0; i < n_finals && !r.err; i++) rd(&r);
    uint64_t n_states = rd(&r);
    if (r.err || n_states == 0 || n_states > (uint64_t)size) return -1;
    const uint8_t *states_at = r.p;

    /* pass 1: sizes and the largest state id */
    uint64_t n_trans = 0, max_id = initial;
    for (uint64_t s = 0; s < n_states && !r.err; s++) {
        uint64_t key = rd(&r), n = rd(&r);
        if (key > max_id) max_id = key;
        for (uint64_t j = 0; j < n && !r.err; j++) {
            rd(&r);
            uint64_t next = rd(&r);
            if (next > max_id) max_id = next;
        }
        n_trans += n;
    }
    if (r.err) return -1;
    if (max_id > 0x7fffffffULL) return -3;

    int rc = -2;
    int32_t *dense = malloc((max_id + 1) * sizeof *dense);
    int64_t *off = malloc((n_states + 1) * sizeof *off);
    int32_t *tok = malloc((n_trans + 1) * sizeof *tok), *nxt = malloc((n_trans + 1) * sizeof *nxt);
    int64_t *rev_off = calloc(n_states + 1, sizeof *rev_off);
    int32_t *rev = malloc((n_trans + 1) * sizeof *rev), *queue = malloc(n_states * sizeof *queue);
    uint8_t *final = calloc(n_states, 1);
    out->keys = malloc(n_states * sizeof *out->keys);
    out->dist = malloc(n_states * sizeof *out->dist);
    out->far = malloc(n_states * sizeof *out->far);
    out->mode = malloc(n_states * sizeof *out->mode);
    out->odd_off = calloc(n_states + 1, sizeof *out->odd_off);
    if (!dense || !off || !tok || !nxt || !rev_off || !rev || !queue || !final || !out->keys || !out->dist
        || !out->far || !out->mode
        || !out->odd_off) goto done;
    memset(dense, 0xff, (max_id + 1) * sizeof *dense);

    /* pass 2: transitions, with next states as dense indices */
    r.p = states_at;
    off[0] = 0;
    for (uint64_t s = 0; s < n_states; s++) {
        uint64_t key = rd(&r), n = rd(&r);
        out->keys[s] = (uint32_t)key;
        dense[key] = (int32_t)s;
        for (uint64_t j = 0; j < n; j++) {
            tok[off[s] + j] = (int32_t)rd(&r);
            nxt[off[s] + j] = (int32_t)rd(&r); /* a state id for now */
        }
        off[s + 1] = off[s] + n;
    }
    uint64_t eos = rd(&r); /* the index's own EOS token, on final states' transitions */
    rc = -1;
    if (r.err) goto done;
    for (uint64_t k = 0; k < n_trans; k++) {
        if ((nxt[k] = dense[nxt[k]]) < 0) goto done; /* a next state with no entry of its own */
    }

    /* reverse adjacency (CSR), then BFS from the finals */
    for (uint64_t k = 0; k < n_trans; k++) rev_off[nxt[k] + 1]++;
    for (uint64_t s = 0; s < n_states; s++) rev_off[s + 1] += rev_off[s];
    {
        int64_t *fill = malloc((n_states + 1) * sizeof *fill);
        if (!fill) { rc = -2; goto done; }
        memcpy(fill, rev_off, (n_states + 1) * sizeof *fill);
        for (uint64_t s = 0; s < n_states; s++)
            for (int64_t k = off[s]; k < off[s + 1]; k++) rev[fill[nxt[k]]++] = (int32_t)s;
        free(fill);
    }
    for (uint64_t s = 0; s < n_states; s++) out->dist[s] = -1;
    int64_t head = 0, tail = 0;
    r.p = finals_at;
    for (uint64_t i = 0; i < n_finals; i++) {
        uint64_t f = rd(&r);
        if (f > max_id || dense[f] < 0) continue; /* a final state no transition mentions */
        final[dense[f]] = 1;
        if (out->dist[dense[f]] < 0) { out->dist[dense[f]] = 0; queue[tail++] = dense[f]; }
    }
    while (head < tail) {
        int32_t u = queue[head++];
        for (int64_t k = rev_off[u]; k < rev_off[u + 1]; k++) {
            int32_t s = rev[k];
            if (out->dist[s] < 0) { out->dist[s] = out->dist[u] + 1; queue[tail++] = s; }
        }
    }

    /* per state: the farthest and the most common successor distance, then the odd tokens */
    int32_t max_dist = 0;
    for (uint64_t s = 0; s < n_states; s++) if (out->dist[s] > max_dist) max_dist = out->dist[s];
    int32_t *count = calloc((size_t)max_dist + 1, sizeof *count);
    if (!count) { rc = -2; goto done; }
    int64_t n_odd = 0;
    for (uint64_t s = 0; s < n_states; s++) {
        int32_t far = -1, mode = -1, most = 0;
        for (int64_t k = off[s]; k < off[s + 1]; k++) {
            int32_t d = out->dist[nxt[k]];
            if (d > far) far = d;
            if (d >= 0 && ++count[d] > most) { most = count[d]; mode = d; }
        }
        for (int64_t k = off[s]; k < off[s + 1]; k++)
            if (out->dist[nxt[k]] >= 0) count[out->dist[nxt[k]]] = 0;
        for (int64_t k = off[s]; k < off[s + 1]; k++)
            if (out->dist[nxt[k]] >= 0 && out->dist[nxt[k]] != mode) n_odd++;
        out->far[s] = far;
        out->mode[s] = mode;
    }
    free(count);
    out->odd_tok = malloc((n_odd + 1) * sizeof *out->odd_tok);
    out->odd_dist = malloc((n_odd + 1) * sizeof *out->odd_dist);
    if (!out->odd_tok || !out->odd_dist) { rc = -2; goto done; }
    n_odd = 0;
    for (uint64_t s = 0; s < n_states; s++) {
        for (int64_t k = off[s]; k < off[s + 1]; k++) {
            int32_t d = out->dist[nxt[k]];
            if (d >= 0 && d != out->mode[s]) { out->odd_tok[n_odd] = tok[k]; out->odd_dist[n_odd++] = d; }
        }
        out->odd_off[s + 1] = n_odd;
    }
    out->n_states = (int64_t)n_states;
    out->n_trans = (int64_t)n_trans;
    out->n_odd = n_odd;
    out->initial = (uint32_t)initial;
    rc = sparse_forms(out, off, tok, final, (uint32_t)eos, vocab_size, eos_ids, n_eos, allowed_max, banned_max,
                      ids_cap);
done:
    free(dense); free(off); free(tok); free(nxt); free(rev_off); free(rev); free(queue); free(final);
    if (rc) index_table_free(out);
    return rc;
}

/* count, and (with vocab_size > 0) the short form of every state's mask; 0 or -2 (out of memory). */
static int sparse_forms(index_table_t *out, const int64_t *off, const int32_t *tok, const uint8_t *final,
                        uint32_t eos, int64_t vocab_size, const int32_t *eos_ids, int64_t n_eos,
                        int64_t allowed_max, int64_t banned_max, int64_t ids_cap) {
    int64_t n_states = out->n_states, width = (vocab_size + 31) / 32;
    out->n_sparse = -1;
    out->count = malloc((n_states + 1) * sizeof *out->count);
    if (!out->count) return -2;
    for (int64_t s = 0; s < n_states; s++) {
        int32_t n = (int32_t)(off[s + 1] - off[s]);
        for (int64_t k = off[s]; k < off[s + 1]; k++) if ((uint32_t)tok[k] == eos) { n--; break; }
        out->count[s] = n;
    }
    if (vocab_size <= 0) return 0;
    int rc = -2;
    uint8_t *is_eos = calloc(vocab_size, 1);
    uint32_t *words = calloc(width, sizeof *words);
    out->sp_kind = calloc(n_states + 1, 1);
    out->sp_off = malloc((n_states + 1) * sizeof *out->sp_off);
    if (!is_eos || !words || !out->sp_kind || !out->sp_off) goto fail;
    int64_t n_extra = 0;
    for (int64_t i = 0; i < n_eos; i++)
        if (eos_ids[i] >= 0 && eos_ids[i] < vocab_size && !is_eos[eos_ids[i]]) { is_eos[eos_ids[i]] = 1; n_extra++; }

    /* pass 1: the allowed count of every state, hence its kind and list length */
    int64_t total = 0;
    out->sp_off[0] = 0;
    for (int64_t s = 0; s < n_states; s++) {
        int64_t allowed = 0, eos_present = 0;
        for (int64_t k = off[s]; k < off[s + 1]; k++) {
            if (tok[k] < 0 || tok[k] >= vocab_size) continue;
            allowed++;
            eos_present += is_eos[tok[k]];
        }
        if (final[s]) allowed += n_extra - eos_present;
        int64_t banned = vocab_size - allowed, n = 0;
        if (banned <= banned_max && banned <= allowed) { out->sp_kind[s] = 2; n = banned; }
        else if (allowed <= allowed_max) { out->sp_kind[s] = 1; n = allowed; }
        total += n;
        if (total > ids_cap) { rc = 0; goto fail; } /* too big to keep: states are masked lazily */
        out->sp_off[s + 1] = (int32_t)total;
    }

    /* pass 2: each list from a bitmap of the state's tokens, so the ids come out ascending */
    out->sp_ids = malloc((total + 1) * sizeof *out->sp_ids);
    if (!out->sp_ids) goto fail;
    uint32_t tail = vocab_size % 32 ? (1u << (vocab_size % 32)) - 1 : 0xffffffffu; /* last word's tokens */
    for (int64_t s = 0; s < n_states; s++) {
        if (!out->sp_kind[s]) continue;
        for (int64_t k = off[s]; k < off[s + 1]; k++)
            if (tok[k] >= 0 && tok[k] < vocab_size) words[tok[k] >> 5] |= 1u << (tok[k] & 31);
        if (final[s])
            for (int64_t i = 0; i < n_eos; i++)
                if (eos_ids[i] >= 0 && eos_ids[i] < vocab_size) words[eos_ids[i] >> 5] |= 1u << (eos_ids[i] & 31);
        uint32_t flip = out->sp_kind[s] == 2 ? 0xffffffffu : 0;
        int32_t *ids = out->sp_ids + out->sp_off[s];
        for (int64_t w = 0; w < width; w++) {
            uint32_t bits = (words[w] ^ flip) & (w == width - 1 ? tail : 0xffffffffu);
            while (bits) {
                *ids++ = (int32_t)(w * 32 + __builtin_ctz(bits));
                bits &= bits - 1;
            }
        }
        memset(words, 0, width * sizeof *words);
    }
    out->n_sparse = total;
    free(is_eos); free(words);
    return 0;
fail:
    free(is_eos); free(words); free(out->sp_kind); free(out->sp_off);
    out->sp_kind = NULL; out->sp_off = NULL;
    return rc;
}
