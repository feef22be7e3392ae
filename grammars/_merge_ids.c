/* A sparse mask's id list changed by a few ids (grammars/sparse_mask.py changed): the ascending ids
 * of one side of a mask, less some ids and plus others, merged in one pass. numpy took ~8 calls
 * (sort, searchsorted, insert, delete) for it: ~30 us hot and ~300 us with cold caches at a value
 * state's first visit; this ~13 and ~110, most of it the ctypes call. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int compare(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* src[0..k) sorted into dst without repeats; returns how many. qsort only where src is not sorted
 * already (the caller sorts long lists with numpy's far faster sort). */
static int64_t distinct(const int64_t *src, int64_t k, int64_t *dst) {
    int sorted = 1;
    for (int64_t i = 1; i < k && sorted; i++) sorted = src[i - 1] <= src[i];
    if (k) memcpy(dst, src, (size_t)k * sizeof(int64_t));
    if (!sorted) qsort(dst, (size_t)k, sizeof(int64_t), compare);
    int64_t j = 0;
    for (int64_t i = 0; i < k; i++)
        if (j == 0 || dst[i] != dst[j - 1]) dst[j++] = dst[i];
    return j;
}

/* The ascending union of ascending distinct a and b. */
static int64_t unite(const int64_t *a, int64_t na, const int64_t *b, int64_t nb, int64_t *out) {
    int64_t i = 0, j = 0, k = 0;
    while (i < na || j < nb) {
        if (j == nb || (i < na && a[i] < b[j])) out[k++] = a[i++];
        else if (i == na || b[j] < a[i]) out[k++] = b[j++];
        else { out[k++] = a[i++]; j++; }
    }
    return k;
}

/* a less b, both ascending distinct. */
static int64_t subtract(const int64_t *a, int64_t na, const int64_t *b, int64_t nb, int64_t *out) {
    int64_t j = 0, k = 0;
    for (int64_t i = 0; i < na; i++) {
        while (j < nb && b[j] < a[i]) j++;
        if (j == nb || b[j] != a[i]) out[k++] = a[i];
    }
    return k;
}

/* ids: n ascending distinct ids of one side of a mask; on, off: k and m ids in any order, repeats
 * allowed. allowed != 0 (ids are the allowed tokens): out = (ids less off) plus on; else (ids are the
 * banned ones): out = (ids plus off) less on. out holds n + k + m; returns how many, -1 without memory. */
int64_t merge_ids(const int64_t *ids, int64_t n, const int64_t *on, int64_t k, const int64_t *off, int64_t m,
                  int allowed, int64_t *out) {
    int64_t *buffer = malloc((size_t)(k + 2 * m + n + 1) * sizeof(int64_t));
    if (!buffer) return -1;
    int64_t *sorted_on = buffer, *sorted_off = buffer + k, *middle = buffer + k + m;
    int64_t nk = distinct(on, k, sorted_on), nm = distinct(off, m, sorted_off), count;
    if (allowed) {
        int64_t c = subtract(ids, n, sorted_off, nm, middle);
        count = unite(middle, c, sorted_on, nk, out);
    } else {
        int64_t c = unite(ids, n, sorted_off, nm, middle);
        count = subtract(middle, c, sorted_on, nk, out);
    }
    free(buffer);
    return count;
}
