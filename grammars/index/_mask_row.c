/* A packed token bitmask applied to one float32 CPU logits row in place (bit j of word w = token
 * 32*w + j; 1 = allowed): every token whose bit is clear, and every token past the mask, gets -inf.
 * The constrained rows a budget narrows (and states with mid-sized masks) take this path on the CPU
 * (engine/constraint_hook.py); torch's byte-LUT index_select + add over the whole row took 100-400
 * us there on SmolLM2's 49k vocabulary. This loop writes only the disallowed tokens: a few us where
 * few are banned, ~10-30 us where nearly all are (the row's whole width written). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

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

/* The largest of x[0..n) (-INFINITY if none; a NaN is never the largest): eight running maxima
 * with no branch per token, which the compiler turns into vector max instructions. */
static float span_max(const float *x, int64_t n) {
    float m[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t t = 0;
    for (; t + 8 <= n; t += 8)
        for (int j = 0; j < 8; j++)
            m[j] = x[t + j] > m[j] ? x[t + j] : m[j];
    for (; t < n; t++)
        m[0] = x[t] > m[0] ? x[t] : m[0];
    float top = m[0];
    for (int j = 1; j < 8; j++)
        top = m[j] > top ? m[j] : top;
    return top;
}

#define BLOCK 512

/* The first of the largest of x[0..n), or -1 where every one is -inf or NaN: span_max block by
 * block, then the first position holding the largest in the block that first reached it. */
static int64_t argmax_first(const float *x, int64_t n) {
    float top = -INFINITY;
    int64_t at = -1;
    for (int64_t b = 0; b < n; b += BLOCK) {
        float m = span_max(x + b, n - b < BLOCK ? n - b : BLOCK);
        if (m > top) { top = m; at = b; }
    }
    if (at < 0) return -1;
    for (int64_t t = at; t < n; t++)
        if (x[t] == top) return t;
    return -1;  /* not reached */
}

/* The greedy pick under a sparse mask (engine/sampling.py settle()), the row left as it was:
 * allowed != 0: the first of the largest logits among ids[0..k) (ascending); allowed == 0: ids are
 * the banned tokens, and ``best`` (the row's own argmax) is returned unless banned; then the first
 * of the largest logits of the other tokens (the first other token where none is above -inf). -1
 * where nothing is allowed. A budget that forces a value closed bans the model's own pick at most
 * steps near the end; the banned logits are then set to -inf, the row argmaxed in vector blocks
 * and the banned logits put back (a branch per token, skipping the banned ids, took ~1 ns a token:
 * 250 us on a 262k vocabulary). */
int64_t pick_f32(float *logits, int64_t n, const int64_t *ids, int64_t k, int allowed, int64_t best) {
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
    int64_t first = 0;  /* the first token not banned (ids ascending) */
    for (int64_t i = 0; i < k && ids[i] <= first; i++)
        if (ids[i] == first) first++;
    if (first >= n) return -1;
    float near[1024], *kept = k <= 1024 ? near : malloc(k * sizeof(float));
    if (kept == NULL) {  /* no memory to hold them aside: the scan that skips the banned ids */
        for (int64_t t = 0, i = 0; t < n; t++) {
            if (i < k && ids[i] == t) { i++; continue; }
            if (logits[t] > top) { top = logits[t]; found = t; }
        }
        return found < 0 ? first : found;
    }
    for (int64_t i = 0; i < k; i++)
        if (ids[i] < n) { kept[i] = logits[ids[i]]; logits[ids[i]] = -INFINITY; }
    found = argmax_first(logits, n);
    for (int64_t i = k - 1; i >= 0; i--)  /* backwards: a repeated id gets its first value back */
        if (ids[i] < n) logits[ids[i]] = kept[i];
    if (kept != near) free(kept);
    return found < 0 ? first : found;
}
