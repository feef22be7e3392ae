/* A sparse mask's id list changed by a few ids (grammars/masks/sparse_mask.py changed): the ascending ids
 * of one side of a mask, less some ids and plus others, merged in one pass. numpy took ~8 calls
 * (sort, searchsorted, insert, delete) for it: ~30 us hot and ~300 us with cold caches at a value
 * state's first visit; this ~13 and ~110, most of it the ctypes call (a few us through the extension). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int compare(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* src[0..k) sorted into dst without repeats; returns how many, -1 without memory. Unsorted, a
 * short list by qsort and a long one by marking its ids in a bitmap (ids are token ids, >= 0): qsort
 * took ~10x numpy's sort on long lists, the bitmap a pass over ids / 64 words. */
static int64_t distinct(const int64_t *src, int64_t k, int64_t *dst) {
    int sorted = 1;
    int64_t low = 0, high = 0;
    for (int64_t i = 0; i < k; i++) {
        if (i && src[i - 1] > src[i]) sorted = 0;
        if (!i || src[i] < low) low = src[i];
        if (!i || src[i] > high) high = src[i];
    }
    if (!sorted && k > 64 && low >= 0) {
        int64_t words = high / 64 + 1, j = 0;
        uint64_t *bits = calloc((size_t)words, sizeof(uint64_t));
        if (!bits) return -1;
        for (int64_t i = 0; i < k; i++) bits[src[i] >> 6] |= (uint64_t)1 << (src[i] & 63);
        for (int64_t w = 0; w < words; w++)
            for (uint64_t b = bits[w]; b; b &= b - 1) dst[j++] = w * 64 + __builtin_ctzll(b);
        free(bits);
        return j;
    }
    if (k) memcpy(dst, src, (size_t)k * sizeof(int64_t));
    if (!sorted) qsort(dst, (size_t)k, sizeof(int64_t), compare);
    int64_t j = 0;
    for (int64_t i = 0; i < k; i++)
        if (j == 0 || dst[i] != dst[j - 1]) dst[j++] = dst[i];
    return j;
}

/* The first i in [lo, n) with ids[i] >= v (ids ascending), by galloping from lo then bisecting: the
 * edits are few and ascending, so each search starts where the last left off. */
static int64_t seek(const int64_t *ids, int64_t lo, int64_t n, int64_t v) {
    int64_t step = 1, hi = lo;
    while (hi < n && ids[hi] < v) { lo = hi + 1; hi += step; step <<= 1; }
    if (hi > n) hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (ids[mid] < v) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* ids: n ascending distinct ids of one side of a mask; on, off: k and m ids in any order, repeats
 * allowed. allowed != 0 (ids are the allowed tokens): out = (ids less off) plus on; else (ids are the
 * banned ones): out = (ids plus off) less on. out holds n + k + m; returns how many, -1 without memory.
 * One pass over the edits (on and off, sorted): the runs of ids between two edits are copied whole
 * (memcpy) and each edit found by a search, so a long side changed by a few ids (a budget-narrowed
 * mask: ~7,300 banned ids and a few leaving tokens) costs a copy, not a branch per id and a second
 * buffer of the whole list (7,300 banned ids and 14 edits: 7.3 -> 1.5 us hot, 9.9 -> 4.9 us after 4 MB of
 * other memory). */
int64_t merge_ids(const int64_t *ids, int64_t n, const int64_t *on, int64_t k, const int64_t *off, int64_t m,
                  int allowed, int64_t *out) {
    int64_t *buffer = malloc((size_t)(k + m + 1) * sizeof(int64_t));
    if (!buffer) return -1;
    int64_t *sorted_on = buffer, *sorted_off = buffer + k;
    int64_t nk = distinct(on, k, sorted_on), nm = distinct(off, m, sorted_off);
    if (nk < 0 || nm < 0) {
        free(buffer);
        return -1;
    }
    int64_t i = 0, j = 0, at = 0, count = 0;  /* next on, next off, next id */
    while (i < nk || j < nm) {
        int64_t v = (j == nm || (i < nk && sorted_on[i] <= sorted_off[j])) ? sorted_on[i] : sorted_off[j];
        int in_on = i < nk && sorted_on[i] == v, in_off = j < nm && sorted_off[j] == v;
        i += in_on, j += in_off;
        int64_t to = seek(ids, at, n, v);
        memcpy(out + count, ids + at, (size_t)(to - at) * sizeof(int64_t));
        count += to - at, at = to;
        if (at < n && ids[at] == v) at++;
        /* on sets an allowed id, off clears it; on a banned list, off bans it and on frees it: on wins */
        if (allowed ? in_on : !in_on) out[count++] = v;
    }
    memcpy(out + count, ids + at, (size_t)(n - at) * sizeof(int64_t));
    count += n - at;
    free(buffer);
    return count;
}
