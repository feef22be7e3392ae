/* The positions of the set bits of a packed token bitmask (bit j of word w = token 32*w + j), in
 * ascending order: the id list of a sparse mask (grammars/masks/sparse_mask.py), read at a state's first
 * visit. numpy's unpackbits + nonzero took 120-190 us for 700 bits of a 49k-token row; this loop
 * ~2 us, beside ~15-20 us of ctypes call. */
#include <stdint.h>

/* Writes at most cap positions to out; returns how many were written, or -1 if more were set. */
int64_t set_bits(const uint32_t *words, int64_t n, int64_t *out, int64_t cap) {
    int64_t k = 0;
    for (int64_t w = 0; w < n; w++) {
        uint32_t x = words[w];
        while (x) {
            if (k == cap) return -1;
            out[k++] = 32 * w + __builtin_ctz(x);
            x &= x - 1;
        }
    }
    return k;
}
