/* Reading bincode's variable-length unsigned integers, as outlines-core serialises an Index: < 251 is
 * one byte; 251/252/253 are followed by a u16/u32/u64, little-endian. */
#ifndef MASKD_VARINT_H
#define MASKD_VARINT_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { const uint8_t *p, *end; int err; } reader_t;

static inline uint64_t rd(reader_t *r) {
    if (r->p >= r->end) { r->err = 1; return 0; }
    uint8_t b = *r->p++;
    if (b < 251) return b;
    int n = b == 251 ? 2 : b == 252 ? 4 : b == 253 ? 8 : 0;
    if (n == 0 || r->p + n > r->end) { r->err = 1; return 0; }
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)r->p[i] << (8 * i);
    r->p += n;
    return v;
}

#endif
