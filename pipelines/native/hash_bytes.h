/* The byte-string hash of the native token tables (_token_index.c's vocabulary and counting tables,
 * _csv_native.c's per-batch dictionaries): a word-at-a-time multiply-xor over the bytes, then a 64-bit
 * finalizer. One definition for both modules (each is built on its own, so each includes it). */
#ifndef TPU_EMBED_HASH_BYTES_H
#define TPU_EMBED_HASH_BYTES_H
#include <stdint.h>
#include <string.h>

static inline uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ULL;
  h ^= h >> 33;
  return h;
}

static inline uint64_t hash_bytes(const uint8_t *p, int64_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n;
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = (h ^ w) * 0x100000001b3ULL;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    memcpy(&w, p, (size_t)n);
    h = (h ^ w) * 0x100000001b3ULL;
  }
  return mix(h);
}

#endif
