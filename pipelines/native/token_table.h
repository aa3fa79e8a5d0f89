/* The hash tables over byte strings of the native token modules (_token_index.c's vocabulary and counting
 * tables, _csv_native.c's per-batch dictionaries): one hash and one slot layout for both (each module is
 * built on its own, so each includes this file).
 *
 * Open addressing with linear probing over a power-of-two number of 16-byte slots. A slot keeps enough of
 * its token to decide most probes by itself: its first 8 bytes and 24 bits of its hash beside its length.
 * A probe then reads one slot instead of the slot, the token's hash, its two offsets and its bytes (four
 * cache misses in a table larger than the cache); only tokens longer than 8 bytes read their stored bytes,
 * and only once the slot agrees. */
#ifndef TPU_EMBED_TOKEN_TABLE_H
#define TPU_EMBED_TOKEN_TABLE_H
#include <stdint.h>
#include <string.h>

/* A word-at-a-time multiply-xor over the bytes, then a 64-bit finalizer. */
static inline uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define TOKEN_TABLE_LE 1
#else
#define TOKEN_TABLE_LE 0
#endif

/* The n < 8 bytes at p as the low bytes of a word (memcpy into a zeroed word). Where 8 bytes from p are inside
 * the caller's buffer (p + 8 <= end) they are read at once and the rest masked off: the same word on a
 * little-endian host, without a call to memcpy of a variable length (the tokens of a Criteo-like column are
 * mostly shorter than 8 bytes). end: NULL when not known. */
static inline uint64_t low_bytes(const uint8_t *p, int64_t n, const uint8_t *end) {
  uint64_t w = 0;
#if TOKEN_TABLE_LE
  if (end && end - p >= 8) {
    memcpy(&w, p, 8);
    return n ? w & (~(uint64_t)0 >> (64 - 8 * n)) : 0;
  }
#endif
  (void)end;
  memcpy(&w, p, (size_t)n);
  return w;
}

/* hash_bytes of [p, p + n) inside a buffer that ends at `end` (NULL: not known): the same hash, its last
 * bytes read as `low_bytes` does. */
static inline uint64_t hash_bytes_in(const uint8_t *p, int64_t n, const uint8_t *end) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = (h ^ w) * 0x100000001b3ULL;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n) h = (h ^ low_bytes(p, n, end)) * 0x100000001b3ULL;
  return mix(h);
}

static inline uint64_t hash_bytes(const uint8_t *p, int64_t n) { return hash_bytes_in(p, n, NULL); }

typedef struct {
  uint64_t head; /* the token's first 8 bytes, zero-padded */
  uint32_t tag;  /* hash bits 40..63, then min(length, 255) in the low byte */
  int32_t pos1;  /* 0: empty, else 1 + the token's position */
} token_slot;

/* The token's first 8 bytes as a word, zero-padded (end: as `low_bytes`). */
static inline uint64_t token_head_in(const uint8_t *p, int64_t n, const uint8_t *end) {
  uint64_t w = 0;
  if (n >= 8) {
    memcpy(&w, p, 8);
    return w;
  }
#if TOKEN_TABLE_LE
  return low_bytes(p, n, end);
#else
  (void)end;
  for (int64_t k = 0; k < n; k++) w |= (uint64_t)p[k] << (8 * k);
  return w;
#endif
}

/* The slot index comes from the hash's low bits, the tag from its high ones: independent below 2^40 slots. */
static inline uint32_t token_tag(uint64_t h, int64_t n) {
  return ((uint32_t)(h >> 32) & 0xFFFFFF00u) | (uint32_t)(n < 255 ? n : 255);
}

/* The position of token [p, p + n) (hash h) among the tokens at off/data (token i is data[off[i], off[i+1])),
 * or -1 and *empty = the free slot where it would go. */
static inline int64_t token_probe_in(const token_slot *slots, uint64_t mask, const int64_t *off, const uint8_t *data,
                                     const uint8_t *p, int64_t n, const uint8_t *end, uint64_t h, uint64_t *empty) {
  const uint64_t head = token_head_in(p, n, end);
  const uint32_t tag = token_tag(h, n);
  for (uint64_t s = h & mask;; s = (s + 1) & mask) {
    const token_slot *t = &slots[s];
    if (!t->pos1) {
      *empty = s;
      return -1;
    }
    if (t->tag != tag || t->head != head) continue;
    const int64_t i = (int64_t)t->pos1 - 1;
    /* Below 9 bytes the tag's length (exact below 255) and the head decide; else the stored token does. */
    if (n <= 8 || (off[i + 1] - off[i] == n && memcmp(data + off[i] + 8, p + 8, (size_t)(n - 8)) == 0)) return i;
  }
}

/* token_probe_in of a token whose buffer's end is not known. */
static inline int64_t token_probe(const token_slot *slots, uint64_t mask, const int64_t *off, const uint8_t *data,
                                  const uint8_t *p, int64_t n, uint64_t h, uint64_t *empty) {
  return token_probe_in(slots, mask, off, data, p, n, NULL, h, empty);
}

static inline void token_slot_set_in(token_slot *slot, const uint8_t *p, int64_t n, const uint8_t *end, uint64_t h,
                                     int64_t position) {
  slot->head = token_head_in(p, n, end);
  slot->tag = token_tag(h, n);
  slot->pos1 = (int32_t)(position + 1);
}

static inline void token_slot_set(token_slot *slot, const uint8_t *p, int64_t n, uint64_t h, int64_t position) {
  slot->head = token_head_in(p, n, NULL);
  slot->tag = token_tag(h, n);
  slot->pos1 = (int32_t)(position + 1);
}

#endif
