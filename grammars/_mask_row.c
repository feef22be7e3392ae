/* A packed token bitmask applied to one float32 CPU logits row in place (bit j of word w = token
 * 32*w + j; 1 = allowed): every token whose bit is clear, and every token past the mask, gets -inf.
 * The constrained rows a budget narrows (and states with mid-sized masks) take this path on the CPU
 * (engine/constraint_hook.py); torch's byte-LUT index_select + add over the whole row took 100-400
 * us there on SmolLM2's 49k vocabulary. This loop writes only the disallowed tokens: a few us where
 * few are banned, ~10-30 us where nearly all are (the row's whole width written). */
#include <math.h>
#include <stdint.h>

void mask_row_f32(float *logits, int64_t n, const uint32_t *words, int64_t n_words) {
    int64_t full = n / 32 < n_words ? n / 32 : n_words;
    for (int64_t w = 0; w < full; w++) {
        uint32_t banned = ~words[w];
        float *at = logits + 32 * w;
        if (banned == 0xFFFFFFFFu) {
            for (int j = 0; j < 32; j++) at[j] = -INFINITY;
            continue;
        }
        while (banned) {
            at[__builtin_ctz(banned)] = -INFINITY;
            banned &= banned - 1;
        }
    }
    for (int64_t i = 32 * full; i < n; i++)  /* a partial last word, then tokens past the mask */
        if (i >= 32 * n_words || !(words[i >> 5] >> (i & 31) & 1)) logits[i] = -INFINITY;
}

/* The greedy pick under a sparse mask (engine/sampling.py settle()), without writing the row:
 * allowed != 0: the first of the largest logits among ids[0..k) (ascending); allowed == 0: ids are
 * the banned tokens, and ``best`` (the row's own argmax) is returned unless banned; then the first
 * of the largest logits of the other tokens. -1 where nothing is allowed. */
int64_t pick_f32(const float *logits, int64_t n, const int64_t *ids, int64_t k, int allowed, int64_t best) {
    int64_t found = -1;
    float top = -INFINITY;
    if (allowed) {
        for (int64_t i = 0; i < k; i++)
            if (found < 0 || logits[ids[i]] > top) { top = logits[ids[i]]; found = ids[i]; }
        return found;
    }
    int64_t lo = 0, hi = k;  /* is best banned? */
    while (lo < hi) { int64_t mid = (lo + hi) / 2; if (ids[mid] < best) lo = mid + 1; else hi = mid; }
    if (lo == k || ids[lo] != best) return best;
    for (int64_t t = 0, i = 0; t < n; t++) {
        if (i < k && ids[i] == t) { i++; continue; }
        if (found < 0 || logits[t] > top) { top = logits[t]; found = t; }
    }
    return found;
}
