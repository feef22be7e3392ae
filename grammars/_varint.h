/* bincode's variable-length unsigned integers, as outlines-core serialises an Index: < 251 is one
 * byte; 251/252/253 are followed by a u16/u32/u64, little-endian. */
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

typedef struct { uint8_t *p; int64_t len, cap; int err; } writer_t;

static inline int room(writer_t *w, int64_t n) {
    if (w->len + n <= w->cap) return 1;
    int64_t cap = w->cap ? 2 * w->cap : 1 << 16;
    while (cap < w->len + n) cap *= 2;
    uint8_t *p = realloc(w->p, cap);
    if (!p) { w->err = 1; return 0; }
    w->p = p;
    w->cap = cap;
    return 1;
}

static inline void wr_raw(writer_t *w, const uint8_t *bytes, int64_t n) {
    if (!room(w, n)) return;
    memcpy(w->p + w->len, bytes, n);
    w->len += n;
}

static inline void wr(writer_t *w, uint64_t v) {
    if (!room(w, 9)) return;
    int n = v < 251 ? 0 : v <= 0xffff ? 2 : v <= 0xffffffffULL ? 4 : 8;
    if (n == 0) { w->p[w->len++] = (uint8_t)v; return; }
    w->p[w->len++] = n == 2 ? 251 : n == 4 ? 252 : 253;
    for (int i = 0; i < n; i++) w->p[w->len++] = (uint8_t)(v >> (8 * i));
}
#endif
