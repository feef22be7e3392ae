/* Distance table of a token index (grammars/index/unit_index.py: CSR transitions per state, final and
 * loop flags; a loop state also leads every plain token back to itself, grammars/index/_token_index.c).
 *
 * index_table() computes, for every state, the fewest tokens that reach a final state (a BFS
 * backwards from the finals); the distance of its farthest successor; the most common distance
 * among its successors (the mode: inside a JSON string, that of the ~48k plain tokens that stay in
 * the string); and its "odd" tokens, those whose successor's distance differs from the mode, ordered
 * by that distance. Under a token budget a state's mask is then its full mask minus a suffix of its
 * odd tokens, or a prefix of them alone.
 *
 * Given the logits width (vocab_size > 0), it also writes every state's mask in the short form
 * grammars/masks/sparse_mask.py applies on CPU, so a state's first visit needs no bitmask: the state's
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
    uint32_t *keys;      /* [n_states] state numbers (0 .. n_states - 1) */
    int32_t *dist;       /* [n_states] fewest tokens to a final state; -1 if none is reachable */
    int32_t *far;        /* [n_states] distance of the state's farthest successor (-1: none) */
    int32_t *mode;       /* [n_states] the most common distance among its successors */
    int64_t *odd_off;    /* [n_states + 1] CSR offsets into odd_tok / odd_dist */
    int32_t *odd_tok;    /* [n_odd] tokens whose successor's distance is not the mode */
    int32_t *odd_dist;   /* [n_odd] distance of the state the token leads to */
    int64_t n_sparse;    /* ids in sp_ids; -1: not written (no vocab_size, or over ids_cap) */
    int32_t *count;      /* [n_states] the state's tokens (EOS not counted) */
    int8_t *sp_kind;     /* [n_states] 0 none, 1 allowed ids, 2 banned ids */
    int32_t *sp_off;     /* [n_states + 1] CSR offsets into sp_ids */
    int32_t *sp_ids;     /* [n_sparse] ascending token ids */
} index_table_t;

void index_table_free(index_table_t *t) {
    free(t->keys); free(t->dist); free(t->far); free(t->mode); free(t->odd_off); free(t->odd_tok); free(t->odd_dist);
    free(t->count); free(t->sp_kind); free(t->sp_off); free(t->sp_ids);
    memset(t, 0, sizeof *t);
}

static int sparse_forms(index_table_t *out, const int64_t *off, const int32_t *tok, const uint8_t *final,
                        const uint8_t *loop, const int32_t *plain, int64_t n_plain, const uint32_t *plain_bits,
                        int64_t vocab_size, const int32_t *eos_ids, int64_t n_eos, int64_t allowed_max,
                        int64_t banned_max, int64_t ids_cap);

/* A state's odd tokens ordered by their distance, ties kept in order (a counting sort): a budget then
 * keeps a prefix of them ("only") or drops a suffix ("drop"), read as a slice (grammars/index/budget.py).
 * tmp_*: room for n; start: [max_dist + 2] zeros, left zeroed. */
static void sort_by_distance(int32_t *tok, int32_t *dist, int64_t n, int32_t *tmp_tok, int32_t *tmp_dist,
                             int64_t *start) {
    int32_t lo = INT32_MAX, hi = -1;
    int sorted = 1;
    for (int64_t i = 0; i < n; i++) {
        if (dist[i] < lo) lo = dist[i];
        if (dist[i] > hi) hi = dist[i];
        if (i && dist[i] < dist[i - 1]) sorted = 0;
    }
    if (sorted) return;
    for (int64_t i = 0; i < n; i++) start[dist[i] + 1]++;
    for (int32_t d = lo; d <= hi; d++) start[d + 1] += start[d];
    for (int64_t i = 0; i < n; i++) {
        int64_t at = start[dist[i]]++;
        tmp_tok[at] = tok[i];
        tmp_dist[at] = dist[i];
    }
    memcpy(tok, tmp_tok, n * sizeof *tok);
    memcpy(dist, tmp_dist, n * sizeof *dist);
    memset(start + lo, 0, (size_t)(hi - lo + 2) * sizeof *start);
}

/* 0 on success; -1 malformed input (a next state out of range), -2 out of memory. `plain`: the plain
 * token ids, ascending; `plain_bits`: those below vocab_size as a packed bitmask, or NULL (then made
 * here); `eos_ids` ascending, once each. */
int index_table(int64_t n_states, const int64_t *off, const int32_t *tok, const int32_t *nxt, const uint8_t *final,
                const uint8_t *loop, const int32_t *plain, int64_t n_plain, const uint32_t *plain_bits,
                int64_t vocab_size, const int32_t *eos_ids, int64_t n_eos, int64_t allowed_max, int64_t banned_max,
                int64_t ids_cap, index_table_t *out) {
    memset(out, 0, sizeof *out);
    int64_t n_trans = off[n_states];
    int rc = -1;
    for (int64_t k = 0; k < n_trans; k++)
        if (nxt[k] < 0 || nxt[k] >= n_states) return rc;
    rc = -2;
    int64_t *rev_off = calloc(n_states + 1, sizeof *rev_off);
    int32_t *rev = malloc((n_trans + 1) * sizeof *rev), *queue = malloc(n_states * sizeof *queue);
    out->keys = malloc(n_states * sizeof *out->keys);
    out->dist = malloc(n_states * sizeof *out->dist);
    out->far = malloc(n_states * sizeof *out->far);
    out->mode = malloc(n_states * sizeof *out->mode);
    out->odd_off = calloc(n_states + 1, sizeof *out->odd_off);
    if (!rev_off || !rev || !queue || !out->keys || !out->dist || !out->far || !out->mode || !out->odd_off)
        goto done;
    for (int64_t s = 0; s < n_states; s++) out->keys[s] = (uint32_t)s;

    /* reverse adjacency (CSR), then BFS from the finals */
    for (int64_t k = 0; k < n_trans; k++) rev_off[nxt[k] + 1]++;
    for (int64_t s = 0; s < n_states; s++) rev_off[s + 1] += rev_off[s];
    {
        int64_t *fill = malloc((n_states + 1) * sizeof *fill);
        if (!fill) { rc = -2; goto done; }
        memcpy(fill, rev_off, (n_states + 1) * sizeof *fill);
        for (int64_t s = 0; s < n_states; s++)
            for (int64_t k = off[s]; k < off[s + 1]; k++) rev[fill[nxt[k]]++] = (int32_t)s;
        free(fill);
    }
    for (int64_t s = 0; s < n_states; s++) out->dist[s] = -1;
    int64_t head = 0, tail = 0;
    for (int64_t s = 0; s < n_states; s++)
        if (final[s]) { out->dist[s] = 0; queue[tail++] = (int32_t)s; }
    while (head < tail) {
        int32_t u = queue[head++];
        for (int64_t k = rev_off[u]; k < rev_off[u + 1]; k++) {
            int32_t s = rev[k];
            if (out->dist[s] < 0) { out->dist[s] = out->dist[u] + 1; queue[tail++] = s; }
        }
    }

    /* per state: the farthest and the most common successor distance, then the odd tokens */
    int32_t max_dist = 0;
    for (int64_t s = 0; s < n_states; s++) if (out->dist[s] > max_dist) max_dist = out->dist[s];
    int32_t *count = calloc((size_t)max_dist + 1, sizeof *count);
    if (!count) { rc = -2; goto done; }
    int64_t n_odd = 0;
    for (int64_t s = 0; s < n_states; s++) {
        int32_t far = -1, mode = -1, most = 0;
        if (loop[s] && n_plain && out->dist[s] >= 0) { /* the plain tokens, back to s */
            far = mode = out->dist[s];
            most = count[mode] = (int32_t)n_plain;
        }
        for (int64_t k = off[s]; k < off[s + 1]; k++) {
            int32_t d = out->dist[nxt[k]];
            if (d > far) far = d;
            if (d >= 0 && ++count[d] > most) { most = count[d]; mode = d; }
        }
        for (int64_t k = off[s]; k < off[s + 1]; k++)
            if (out->dist[nxt[k]] >= 0) count[out->dist[nxt[k]]] = 0;
        if (out->dist[s] >= 0) count[out->dist[s]] = 0;
        for (int64_t k = off[s]; k < off[s + 1]; k++)
            if (out->dist[nxt[k]] >= 0 && out->dist[nxt[k]] != mode) n_odd++;
        if (loop[s] && out->dist[s] >= 0 && out->dist[s] != mode) n_odd += n_plain;
        out->far[s] = far;
        out->mode[s] = mode;
    }
    free(count);
    out->odd_tok = malloc((n_odd + 1) * sizeof *out->odd_tok);
    out->odd_dist = malloc((n_odd + 1) * sizeof *out->odd_dist);
    if (!out->odd_tok || !out->odd_dist) { rc = -2; goto done; }
    int32_t *tmp_tok = malloc((n_odd + 1) * sizeof *tmp_tok), *tmp_dist = malloc((n_odd + 1) * sizeof *tmp_dist);
    int64_t *start = calloc((size_t)max_dist + 2, sizeof *start);
    if (!tmp_tok || !tmp_dist || !start) { free(tmp_tok); free(tmp_dist); free(start); rc = -2; goto done; }
    n_odd = 0;
    for (int64_t s = 0; s < n_states; s++) {
        for (int64_t k = off[s]; k < off[s + 1]; k++) {
            int32_t d = out->dist[nxt[k]];
            if (d >= 0 && d != out->mode[s]) { out->odd_tok[n_odd] = tok[k]; out->odd_dist[n_odd++] = d; }
        }
        if (loop[s] && out->dist[s] >= 0 && out->dist[s] != out->mode[s])
            for (int64_t i = 0; i < n_plain; i++) { out->odd_tok[n_odd] = plain[i]; out->odd_dist[n_odd++] = out->dist[s]; }
        int64_t lo = out->odd_off[s];
        sort_by_distance(out->odd_tok + lo, out->odd_dist + lo, n_odd - lo, tmp_tok, tmp_dist, start);
        out->odd_off[s + 1] = n_odd;
    }
    free(tmp_tok); free(tmp_dist); free(start);
    out->n_states = n_states;
    out->n_trans = n_trans;
    out->n_odd = n_odd;
    rc = sparse_forms(out, off, tok, final, loop, plain, n_plain, plain_bits, vocab_size, eos_ids, n_eos,
                      allowed_max, banned_max, ids_cap);
done:
    free(rev_off); free(rev); free(queue);
    if (rc) index_table_free(out);
    return rc;
}

/* count, and (with vocab_size > 0) the short form of every state's mask; 0, -2 (out of memory) or -1
 * (a list not of its counted length: never expected; the caller then takes the Python path). */
static int sparse_forms(index_table_t *out, const int64_t *off, const int32_t *tok, const uint8_t *final,
                        const uint8_t *loop, const int32_t *plain, int64_t n_plain, const uint32_t *plain_bits,
                        int64_t vocab_size, const int32_t *eos_ids, int64_t n_eos, int64_t allowed_max,
                        int64_t banned_max, int64_t ids_cap) {
    int64_t n_states = out->n_states, width = (vocab_size + 31) / 32;
    out->n_sparse = -1;
    out->count = malloc((n_states + 1) * sizeof *out->count);
    if (!out->count) return -2;
    for (int64_t s = 0; s < n_states; s++) out->count[s] = (int32_t)(off[s + 1] - off[s] + (loop[s] ? n_plain : 0));
    if (vocab_size <= 0) return 0;
    int rc = -2;
    uint8_t *is_eos = calloc(vocab_size, 1);
    uint32_t *words = calloc(width, sizeof *words), *plain_words = calloc(width, sizeof *plain_words);
    out->sp_kind = calloc(n_states + 1, 1);
    out->sp_off = malloc((n_states + 1) * sizeof *out->sp_off);
    if (!is_eos || !words || !plain_words || !out->sp_kind || !out->sp_off) goto fail;
    int64_t n_extra = 0, plain_in = 0;
    for (int64_t i = 0; i < n_eos; i++)
        if (eos_ids[i] >= 0 && eos_ids[i] < vocab_size && !is_eos[eos_ids[i]]) { is_eos[eos_ids[i]] = 1; n_extra++; }
    if (plain_bits) {
        memcpy(plain_words, plain_bits, width * sizeof *plain_words);
        for (int64_t w = 0; w < width; w++) plain_in += __builtin_popcount(plain_words[w]);
    } else {
        for (int64_t i = 0; i < n_plain; i++)
            if (plain[i] >= 0 && plain[i] < vocab_size) {
                plain_words[plain[i] >> 5] |= 1u << (plain[i] & 31);
                plain_in++;
            }
    }

    /* pass 1: the allowed count of every state, hence its kind and list length (a loop state's
     * explicit tokens are never plain: the walk of its trie has none; nor are the EOS ids it adds) */
    int64_t total = 0, n_extra_other = 0;
    for (int64_t i = 0; i < n_eos; i++)
        if (eos_ids[i] >= 0 && eos_ids[i] < vocab_size && !(plain_words[eos_ids[i] >> 5] >> (eos_ids[i] & 31) & 1))
            n_extra_other++;
    out->sp_off[0] = 0;
    for (int64_t s = 0; s < n_states; s++) {
        int64_t allowed = loop[s] ? plain_in : 0, eos_present = 0;
        for (int64_t k = off[s]; k < off[s + 1]; k++) {
            if (tok[k] < 0 || tok[k] >= vocab_size) continue;
            allowed++;
            eos_present += is_eos[tok[k]];
        }
        if (final[s]) allowed += (loop[s] ? n_extra_other : n_extra) - eos_present;
        int64_t banned = vocab_size - allowed, n = 0;
        if (banned <= banned_max && banned <= allowed) { out->sp_kind[s] = 2; n = banned; }
        else if (allowed <= allowed_max) { out->sp_kind[s] = 1; n = allowed; }
        total += n;
        if (total > ids_cap) { rc = 0; goto fail; } /* too big to keep: states are masked lazily */
        out->sp_off[s + 1] = (int32_t)total;
    }

    /* pass 2: the ids ascending. A state's listed tokens ascend already: an allowed list merges them
     * with the EOS ids, a loop state's banned list is the non-plain tokens it does not list; other
     * lists come from a bitmap of the state's tokens. */
    out->sp_ids = malloc((total + 1) * sizeof *out->sp_ids);
    int32_t *eos_in = malloc((n_eos + 1) * sizeof *eos_in), *other = malloc((vocab_size - plain_in + 1) * sizeof *other);
    if (!out->sp_ids || !eos_in || !other) { free(eos_in); free(other); goto fail; }
    int64_t n_eos_in = 0, n_other = 0;
    for (int64_t i = 0; i < n_eos; i++)
        if (eos_ids[i] >= 0 && eos_ids[i] < vocab_size) eos_in[n_eos_in++] = eos_ids[i];
    uint32_t tail = vocab_size % 32 ? (1u << (vocab_size % 32)) - 1 : 0xffffffffu; /* last word's tokens */
    for (int64_t w = 0; w < width; w++) { /* the tokens below vocab_size that are not plain, ascending */
        uint32_t bits = ~plain_words[w] & (w == width - 1 ? tail : 0xffffffffu);
        while (bits) {
            other[n_other++] = (int32_t)(w * 32 + __builtin_ctz(bits));
            bits &= bits - 1;
        }
    }
    for (int64_t s = 0; s < n_states; s++) {
        if (!out->sp_kind[s]) continue;
        int32_t *ids = out->sp_ids + out->sp_off[s];
        const int32_t *listed = tok + off[s], *end = tok + off[s + 1];
        int64_t e = 0, n_e = final[s] ? n_eos_in : 0;
        if (out->sp_kind[s] == 1 && !loop[s]) { /* merge: listed tokens and EOS ids, ascending, once each */
            while (listed < end || e < n_e) {
                if (listed < end && (*listed < 0 || *listed >= vocab_size)) { listed++; continue; }
                int32_t next = e >= n_e || (listed < end && *listed < eos_in[e]) ? *listed++ : eos_in[e++];
                if (listed < end && *listed == next) listed++;
                if (e < n_e && eos_in[e] == next) e++;
                *ids++ = next;
            }
            if (ids != out->sp_ids + out->sp_off[s + 1]) { rc = -1; goto fail_lists; }
            continue;
        }
        if (out->sp_kind[s] == 2 && loop[s]) { /* the non-plain tokens neither listed nor EOS here */
            for (int64_t k = 0; k < n_other; k++) {
                int32_t t = other[k];
                while (listed < end && *listed < t) listed++;
                while (e < n_e && eos_in[e] < t) e++;
                if ((listed < end && *listed == t) || (e < n_e && eos_in[e] == t)) continue;
                *ids++ = t;
            }
            if (ids != out->sp_ids + out->sp_off[s + 1]) { rc = -1; goto fail_lists; }
            continue;
        }
        if (loop[s]) memcpy(words, plain_words, width * sizeof *words);
        for (int64_t k = off[s]; k < off[s + 1]; k++)
            if (tok[k] >= 0 && tok[k] < vocab_size) words[tok[k] >> 5] |= 1u << (tok[k] & 31);
        if (final[s])
            for (int64_t i = 0; i < n_eos; i++)
                if (eos_ids[i] >= 0 && eos_ids[i] < vocab_size) words[eos_ids[i] >> 5] |= 1u << (eos_ids[i] & 31);
        uint32_t flip = out->sp_kind[s] == 2 ? 0xffffffffu : 0;
        for (int64_t w = 0; w < width; w++) {
            uint32_t bits = (words[w] ^ flip) & (w == width - 1 ? tail : 0xffffffffu);
            while (bits) {
                *ids++ = (int32_t)(w * 32 + __builtin_ctz(bits));
                bits &= bits - 1;
            }
        }
        memset(words, 0, width * sizeof *words);
        if (ids != out->sp_ids + out->sp_off[s + 1]) { rc = -1; goto fail_lists; }
    }
    free(eos_in); free(other);
    out->n_sparse = total;
    free(is_eos); free(words); free(plain_words);
    return 0;
fail_lists: /* a list whose length is not the one counted: none are kept (the caller's slow path) */
    free(eos_in); free(other); free(out->sp_ids);
    out->sp_ids = NULL;
fail:
    free(is_eos); free(words); free(plain_words); free(out->sp_kind); free(out->sp_off);
    out->sp_kind = NULL; out->sp_off = NULL;
    return rc;
}
