/* Native token index: a vocabulary's hash table built once, then looked up chunk after chunk.
 *
 * `pyarrow.compute.index_in(tokens, value_set=vocabulary)` builds a hash table of the whole vocabulary
 * on every call: 50-60 ms for 300 k tokens, against about 1 ms to look up a 32 k-row chunk. This
 * module keeps the table (pipelines.token_index.TokenIndex owns its arrays; the pyarrow call stays the
 * reference, and tests/test_token_index.py checks the two agree).
 *
 * Tokens are given as Arrow large_binary buffers: int64 offsets (n + 1 of them, not rebased) and the
 * data bytes. The table is token_table.h's (16-byte slots, open addressing over a power-of-two number
 * of them, the caller's zeroed buffer); the first of equal vocabulary tokens wins, as with index_in. Only
 * the buffer protocol is used (no numpy headers).
 *
 * The same table counts tokens (`count`, behind pipelines.token_index.TokenCounter): the distinct tokens
 * are kept in first-seen order in arrays the caller owns and grows, so one pass over a chunk's tokens
 * replaces pyarrow's value_counts per chunk and the group_by merges of their tables.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "token_table.h"

/* A table larger than the cache costs a miss per probe: the loops below hash the token PREFETCH places ahead
 * and ask for its slot then, so that the miss overlaps the probes before it (about twice as fast for the
 * vocabularies and counters of a Criteo-like data set; the same results). */
#define PREFETCH 16

static inline uint64_t prefetch_slot(const token_slot *slots, uint64_t mask, const uint8_t *data, const int64_t *off,
                                     Py_ssize_t j, const uint8_t *end) {
  uint64_t h = hash_bytes_in(data + off[j], off[j + 1] - off[j], end);
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(&slots[h & mask]);
#endif
  return h;
}

static void release(Py_buffer *bufs, int n) {
  for (int i = 0; i < n; i++) PyBuffer_Release(&bufs[i]);
}

static int check_sizes(Py_buffer *voff, Py_buffer *vdata, Py_buffer *slots, Py_ssize_t *nv) {
  Py_ssize_t m = slots->len / (Py_ssize_t)sizeof(token_slot);
  *nv = voff->len / 8 - 1;
  if (*nv < 0 || m < 1 || (m & (m - 1)) || m <= *nv || *nv >= INT32_MAX) {
    PyErr_SetString(PyExc_ValueError, "token index: slots must be a power of two above the vocabulary size");
    return -1;
  }
  const int64_t *o = (const int64_t *)voff->buf;
  if (*nv > 0 && (o[0] < 0 || o[*nv] > vdata->len)) {
    PyErr_SetString(PyExc_ValueError, "token index: vocabulary offsets outside its data");
    return -1;
  }
  return 0;
}

/* build(vocab_offsets, vocab_data, slots): fills the zeroed slots (a buffer of token_slot). */
static PyObject *build(PyObject *self, PyObject *args) {
  Py_buffer b[3];
  if (!PyArg_ParseTuple(args, "y*y*w*", &b[0], &b[1], &b[2])) return NULL;
  Py_ssize_t nv;
  if (check_sizes(&b[0], &b[1], &b[2], &nv) < 0) {
    release(b, 3);
    return NULL;
  }
  const int64_t *voff = (const int64_t *)b[0].buf;
  const uint8_t *vdata = (const uint8_t *)b[1].buf, *vend = vdata + b[1].len;
  token_slot *slots = (token_slot *)b[2].buf;
  uint64_t mask = (uint64_t)(b[2].len / (Py_ssize_t)sizeof(token_slot)) - 1;
  for (Py_ssize_t i = 0; i < nv; i++) {
    if (voff[i + 1] < voff[i]) {
      PyErr_SetString(PyExc_ValueError, "token index: vocabulary offsets decrease");
      release(b, 3);
      return NULL;
    }
  }
  Py_BEGIN_ALLOW_THREADS
  uint64_t ahead[PREFETCH];  /* as in lookup: the slots of the tokens PREFETCH places ahead asked for first */
  for (Py_ssize_t k = 0; k < nv && k < PREFETCH; k++) ahead[k] = prefetch_slot(slots, mask, vdata, voff, k, vend);
  for (Py_ssize_t i = 0; i < nv; i++) {
    const uint8_t *p = vdata + voff[i];
    int64_t n = voff[i + 1] - voff[i];
    uint64_t h = ahead[i % PREFETCH], empty = 0;
    if (i + PREFETCH < nv) ahead[i % PREFETCH] = prefetch_slot(slots, mask, vdata, voff, i + PREFETCH, vend);
    if (token_probe_in(slots, mask, voff, vdata, p, n, vend, h, &empty) < 0)
      token_slot_set_in(&slots[empty], p, n, vend, h, i);
  }
  Py_END_ALLOW_THREADS
  release(b, 3);
  Py_RETURN_NONE;
}

/* lookup(vocab_offsets, vocab_data, slots, token_offsets, token_data, out): out[j] = the position of
 * token j in the vocabulary, or -1 (int64 out, one per token). */
static PyObject *lookup(PyObject *self, PyObject *args) {
  Py_buffer b[6];
  if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5])) return NULL;
  Py_ssize_t nv, nt = b[3].len / 8 - 1;
  if (check_sizes(&b[0], &b[1], &b[2], &nv) < 0) {
    release(b, 6);
    return NULL;
  }
  const int64_t *toff = (const int64_t *)b[3].buf;
  if (nt < 0 || b[5].len / 8 < nt || (nt > 0 && (toff[0] < 0 || toff[nt] > b[4].len))) {
    PyErr_SetString(PyExc_ValueError, "token index: token offsets outside their data, or out too small");
    release(b, 6);
    return NULL;
  }
  for (Py_ssize_t j = 0; j < nt; j++) {
    if (toff[j + 1] < toff[j]) {
      PyErr_SetString(PyExc_ValueError, "token index: token offsets decrease");
      release(b, 6);
      return NULL;
    }
  }
  const int64_t *voff = (const int64_t *)b[0].buf;
  const uint8_t *vdata = (const uint8_t *)b[1].buf, *tdata = (const uint8_t *)b[4].buf, *tend = tdata + b[4].len;
  const token_slot *slots = (const token_slot *)b[2].buf;
  int64_t *out = (int64_t *)b[5].buf;
  uint64_t mask = (uint64_t)(b[2].len / (Py_ssize_t)sizeof(token_slot)) - 1;
  Py_BEGIN_ALLOW_THREADS
  uint64_t ahead[PREFETCH];  /* the hashes of the next tokens, their slots asked for ahead */
  for (Py_ssize_t j = 0; j < nt && j < PREFETCH; j++) ahead[j] = prefetch_slot(slots, mask, tdata, toff, j, tend);
  for (Py_ssize_t j = 0; j < nt; j++) {
    const uint8_t *p = tdata + toff[j];
    int64_t n = toff[j + 1] - toff[j];
    uint64_t empty, h = ahead[j % PREFETCH];
    if (j + PREFETCH < nt) ahead[j % PREFETCH] = prefetch_slot(slots, mask, tdata, toff, j + PREFETCH, tend);
    out[j] = token_probe_in(slots, mask, voff, vdata, p, n, tend, h, &empty);
  }
  Py_END_ALLOW_THREADS
  release(b, 6);
  Py_RETURN_NONE;
}

/* count(offsets, data, slots, counts, state, token_offsets, token_data, token_counts, start[, codes]):
 * adds tokens start.. (each with token_counts[j], or 1 when token_counts is empty) to the distinct tokens
 * [0, n) held in offsets / data (n = state[0], data bytes used = state[1]), their counts and slots.
 * Returns the index of the first token not added: the number of tokens when all were, else the first
 * new token that does not fit (more distinct tokens than len(counts), len(offsets) - 1 or half the slots
 * allow, or more bytes than data holds). The caller grows the arrays (rebuilding the slots with `build`
 * when they grow) and calls again from there. `codes` (int32, one per token, optional): each added token's
 * position among the distinct tokens is written there (its dictionary code). */
static PyObject *count(PyObject *self, PyObject *args) {
  Py_buffer b[9];
  Py_ssize_t start;
  b[8].buf = NULL;
  b[8].len = 0;
  b[8].obj = NULL;
  if (!PyArg_ParseTuple(args, "w*w*w*w*w*y*y*y*n|w*", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5], &b[6], &b[7],
                        &start, &b[8]))
    return NULL;
  int nbufs = b[8].obj != NULL ? 9 : 8;
  int32_t *codes = (int32_t *)b[8].buf;
  int64_t *off = (int64_t *)b[0].buf, *counts = (int64_t *)b[3].buf, *state = (int64_t *)b[4].buf;
  uint8_t *data = (uint8_t *)b[1].buf;
  token_slot *slots = (token_slot *)b[2].buf;
  const int64_t *toff = (const int64_t *)b[5].buf, *tcounts = (const int64_t *)b[7].buf;
  const uint8_t *tdata = (const uint8_t *)b[6].buf, *tend = tdata + b[6].len;
  Py_ssize_t m = b[2].len / (Py_ssize_t)sizeof(token_slot), nt = b[5].len / 8 - 1;
  Py_ssize_t cap = b[3].len / 8;
  if (b[0].len / 8 - 1 < cap) cap = b[0].len / 8 - 1;
  if (m / 2 < cap) cap = m / 2;
  const char *err = NULL;
  if (b[4].len < 16 || m < 2 || (m & (m - 1)) || m > INT32_MAX)
    err = "token counter: state needs two int64, slots a power of two";
  else if (state[0] < 0 || state[0] > cap || state[1] < 0 || state[1] > b[1].len || off[0] != 0 ||
           off[state[0]] != state[1])
    err = "token counter: its state does not match its arrays";
  else if (nt < 0 || start < 0 || start > nt || (b[7].len && b[7].len / 8 < nt) ||
           (nt > 0 && (toff[0] < 0 || toff[nt] > b[6].len)))
    err = "token counter: token offsets outside their data, or fewer counts than tokens";
  else if (codes && b[8].len / 4 < nt)
    err = "token counter: fewer codes than tokens";
  for (Py_ssize_t j = start; !err && j < nt; j++)
    if (toff[j + 1] < toff[j]) err = "token counter: token offsets decrease";
  if (err) {
    PyErr_SetString(PyExc_ValueError, err);
    release(b, nbufs);
    return NULL;
  }
  int64_t n = state[0], used = state[1], dcap = b[1].len;
  uint64_t mask = (uint64_t)m - 1;
  int weighted = b[7].len > 0;
  Py_ssize_t j = start;
  Py_BEGIN_ALLOW_THREADS
  uint64_t ahead[PREFETCH];  /* as in lookup */
  for (Py_ssize_t k = j; k < nt && k < j + PREFETCH; k++)
    ahead[k % PREFETCH] = prefetch_slot(slots, mask, tdata, toff, k, tend);
  for (; j < nt; j++) {
    const uint8_t *p = tdata + toff[j];
    int64_t len = toff[j + 1] - toff[j];
    int64_t c = weighted ? tcounts[j] : 1;
    uint64_t h = ahead[j % PREFETCH], empty = 0;
    if (j + PREFETCH < nt) ahead[j % PREFETCH] = prefetch_slot(slots, mask, tdata, toff, j + PREFETCH, tend);
    int64_t i = token_probe_in(slots, mask, off, data, p, len, tend, h, &empty);
    if (i >= 0) {
      counts[i] += c;
      if (codes) codes[j] = (int32_t)i;
      continue;
    }
    if (n >= cap || used + len > dcap) break;
    if (codes) codes[j] = (int32_t)n;
    memcpy(data + used, p, (size_t)len);
    used += len;
    off[n + 1] = used;
    counts[n] = c;
    token_slot_set_in(&slots[empty], p, len, tend, h, n);
    n++;
  }
  Py_END_ALLOW_THREADS
  state[0] = n;
  state[1] = used;
  release(b, nbufs);
  return PyLong_FromSsize_t(j);
}

/* hash(data) -> int: token_table.h's hash of the bytes (tests look for tokens that collide in a slot). */
static PyObject *hash(PyObject *self, PyObject *args) {
  Py_buffer b;
  if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
  uint64_t h = hash_bytes((const uint8_t *)b.buf, b.len);
  PyBuffer_Release(&b);
  return PyLong_FromUnsignedLongLong(h);
}

/* spread(ids, codes, code_width, lengths, found_limit, out_ids, out_oov) -> number of values out of the vocabulary
 *
 * The ids of a chunk's distinct tokens (int64 `ids`, one per dictionary entry) spread over its values in one pass
 * without the GIL: value i gets ids[codes[i]] (codes: int32 or int64 by `code_width`, 4 or 8), and each example
 * (`lengths`: int64 values per example, in order) the number of its values whose id is outside [0, found_limit)
 * (out of the vocabulary: -1 or an OOV bucket), in int32 `out_oov`. The readable rule is
 * `pipelines.mapping.ids` (`np.take` and `_per_row`), which this is tested against. ValueError where a code is
 * outside the ids or the lengths do not add up to the values. */
static PyObject *spread(PyObject *self, PyObject *args) {
  Py_buffer b[5];
  int width;
  long long found_limit;
  if (!PyArg_ParseTuple(args, "y*y*iy*Lw*w*", &b[0], &b[1], &width, &b[2], &found_limit, &b[3], &b[4])) return NULL;
  const Py_ssize_t d = b[0].len / 8, rows = b[2].len / 8;
  if (width != 4 && width != 8) {
    release(b, 5);
    PyErr_SetString(PyExc_ValueError, "spread: codes must be int32 or int64");
    return NULL;
  }
  const Py_ssize_t n = b[1].len / width;
  if (b[3].len / 8 < n || b[4].len / 4 < rows) {
    release(b, 5);
    PyErr_SetString(PyExc_ValueError, "spread: output buffers too small");
    return NULL;
  }
  const int64_t *ids = (const int64_t *)b[0].buf, *lengths = (const int64_t *)b[2].buf;
  const int32_t *c32 = (const int32_t *)b[1].buf;
  const int64_t *c64 = (const int64_t *)b[1].buf;
  int64_t *out = (int64_t *)b[3].buf;
  int32_t *oov = (int32_t *)b[4].buf;
  const uint64_t limit = (uint64_t)found_limit;
  int64_t n_oov = 0;
  int bad = 0; /* 1: a code outside the ids, 2: the lengths are not the values */
  Py_BEGIN_ALLOW_THREADS
  Py_ssize_t i = 0;
  for (Py_ssize_t r = 0; r < rows && !bad; r++) {
    const int64_t len = lengths[r];
    if (len < 0 || len > n - i) { bad = 2; break; }
    int32_t k = 0;
    for (int64_t e = i + len; i < e; i++) {
      const int64_t code = width == 4 ? (int64_t)c32[i] : c64[i];
      if ((uint64_t)code >= (uint64_t)d) { bad = 1; break; }
      const int64_t id = ids[code];
      out[i] = id;
      k += (uint64_t)id >= limit; /* -1 too, as uint64 */
    }
    oov[r] = k;
    n_oov += k;
  }
  if (!bad && i != n) bad = 2;
  Py_END_ALLOW_THREADS
  release(b, 5);
  if (bad) {
    PyErr_SetString(PyExc_ValueError, bad == 1 ? "spread: a code outside the distinct tokens"
                                                : "spread: the lengths do not add up to the values");
    return NULL;
  }
  return PyLong_FromLongLong(n_oov);
}

/* ------------------------------------------------------------------ vocabulary order */

/* A token and its sort key: ascending (rank, head) is descending (count, first 8 bytes). */
typedef struct {
  uint64_t rank; /* ~count */
  uint64_t head; /* ~(the first 8 bytes, big-endian, zero-padded) */
  int64_t index;
} order_item;

/* Stable LSD radix sort of items by (rank, head), 16 bits a pass; a pass whose digit is the same for every item
 * is skipped (the high bits of the counts, mostly). */
static int radix_sort(order_item *a, Py_ssize_t n) {
  order_item *tmp = malloc((size_t)(n ? n : 1) * sizeof(order_item));
  Py_ssize_t *hist = malloc(65536 * sizeof(Py_ssize_t));
  if (!tmp || !hist) { free(tmp); free(hist); return -1; }
  order_item *src = a, *dst = tmp;
  for (int pass = 0; pass < 8; pass++) {
    const int shift = 16 * (pass % 4);
    const int on_rank = pass >= 4;
    memset(hist, 0, 65536 * sizeof(Py_ssize_t));
    for (Py_ssize_t i = 0; i < n; i++) hist[((on_rank ? src[i].rank : src[i].head) >> shift) & 0xFFFF]++;
    const uint64_t first = n ? ((on_rank ? src[0].rank : src[0].head) >> shift) & 0xFFFF : 0;
    if (hist[first] == n) continue;
    Py_ssize_t at = 0;
    for (int d = 0; d < 65536; d++) { Py_ssize_t c = hist[d]; hist[d] = at; at += c; }
    for (Py_ssize_t i = 0; i < n; i++) dst[hist[((on_rank ? src[i].rank : src[i].head) >> shift) & 0xFFFF]++] = src[i];
    order_item *t = src; src = dst; dst = t;
  }
  if (src != a) memcpy(a, src, (size_t)n * sizeof(order_item));
  free(tmp);
  free(hist);
  return 0;
}

/* Descending bytes (unsigned, a prefix below the longer token), the first 8 known equal. */
static int after_head_desc(const uint8_t *data, const int64_t *off, int64_t x, int64_t y) {
  const int64_t nx = off[x + 1] - off[x], ny = off[y + 1] - off[y];
  const int64_t m = (nx < ny ? nx : ny) - 8;
  if (m > 0) {
    const int c = memcmp(data + off[x] + 8, data + off[y] + 8, (size_t)m);
    if (c) return c > 0 ? -1 : 1;
  }
  return nx == ny ? 0 : nx > ny ? -1 : 1;
}

/* Stable merge sort of idx[0, n) by after_head_desc (a run of tokens with the same count and first 8 bytes). */
static void merge_sort_run(int64_t *idx, int64_t *tmp, Py_ssize_t n, const uint8_t *data, const int64_t *off) {
  if (n < 16) { /* insertion sort */
    for (Py_ssize_t i = 1; i < n; i++) {
      const int64_t v = idx[i];
      Py_ssize_t j = i;
      while (j > 0 && after_head_desc(data, off, v, idx[j - 1]) < 0) { idx[j] = idx[j - 1]; j--; }
      idx[j] = v;
    }
    return;
  }
  const Py_ssize_t h = n / 2;
  merge_sort_run(idx, tmp, h, data, off);
  merge_sort_run(idx + h, tmp, n - h, data, off);
  Py_ssize_t i = 0, j = h, k = 0;
  while (i < h && j < n) tmp[k++] = after_head_desc(data, off, idx[j], idx[i]) < 0 ? idx[j++] : idx[i++];
  while (i < h) tmp[k++] = idx[i++];
  while (j < n) tmp[k++] = idx[j++];
  memcpy(idx, tmp, (size_t)n * sizeof(int64_t));
}

/* order(offsets, data, counts, out): out (int64, one per token) = the tokens' positions by count descending, then
 * bytes descending (tf.Transform's vocabulary order; equal tokens keep their order). `offsets`: int64 [n + 1] into
 * `data` (large_binary buffers), `counts`: int64 [n]. The readable rule is pyarrow's sort_indices
 * (`pipelines.mapping.vocabulary.vocabulary_order`), which this is tested against. */
static PyObject *order(PyObject *self, PyObject *args) {
  Py_buffer b[4];
  if (!PyArg_ParseTuple(args, "y*y*y*w*", &b[0], &b[1], &b[2], &b[3])) return NULL;
  const Py_ssize_t n = b[0].len / 8 - 1;
  const int64_t *off = (const int64_t *)b[0].buf, *counts = (const int64_t *)b[2].buf;
  const uint8_t *data = (const uint8_t *)b[1].buf;
  int64_t *out = (int64_t *)b[3].buf;
  const char *err = NULL;
  if (n < 0 || b[2].len / 8 != n || b[3].len / 8 != n)
    err = "order: one count and one output per token";
  else if (n > 0 && (off[0] < 0 || off[n] > b[1].len))
    err = "order: token offsets outside their data";
  for (Py_ssize_t i = 0; !err && i < n; i++)
    if (off[i + 1] < off[i]) err = "order: token offsets decrease";
  if (err) {
    release(b, 4);
    PyErr_SetString(PyExc_ValueError, err);
    return NULL;
  }
  order_item *items = malloc((size_t)(n ? n : 1) * sizeof(order_item));
  int64_t *tmp = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
  int failed = !items || !tmp;
  Py_BEGIN_ALLOW_THREADS
  if (!failed) {
    for (Py_ssize_t i = 0; i < n; i++) {
      const int64_t len = off[i + 1] - off[i];
      uint64_t head = 0;
      for (int64_t k = 0; k < 8 && k < len; k++) head |= (uint64_t)data[off[i] + k] << (56 - 8 * k);
      items[i].rank = ~(uint64_t)counts[i] ^ ((uint64_t)1 << 63); /* signed counts: descending */
      items[i].head = ~head;
      items[i].index = i;
    }
    failed = radix_sort(items, n) < 0;
  }
  if (!failed) {
    for (Py_ssize_t i = 0; i < n; i++) out[i] = items[i].index;
    /* Runs of the same count and first 8 bytes: ordered by the rest (or the length) where a token is longer
     * than 8 bytes or two are equal in their first 8 only by their zero padding. */
    for (Py_ssize_t i = 0; i < n;) {
      Py_ssize_t j = i + 1;
      while (j < n && items[j].rank == items[i].rank && items[j].head == items[i].head) j++;
      if (j - i > 1) merge_sort_run(out + i, tmp, j - i, data, off);
      i = j;
    }
  }
  Py_END_ALLOW_THREADS
  free(items);
  free(tmp);
  release(b, 4);
  if (failed) return PyErr_NoMemory();
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"build", build, METH_VARARGS, "Fill a vocabulary's hash table (slots, hashes)."},
    {"lookup", lookup, METH_VARARGS, "Positions of tokens in the vocabulary, -1 where absent."},
    {"count", count, METH_VARARGS, "Add tokens (and their counts) to a table of distinct tokens; optionally "
                                   "write each token's position among them (its dictionary code)."},
    {"hash", hash, METH_VARARGS, "The tables' hash of a byte string."},
    {"spread", spread, METH_VARARGS, "Distinct tokens' ids spread over their values, and OOV values per example."},
    {"order", order, METH_VARARGS, "Tokens by count descending, then bytes descending (a vocabulary's order)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_token_index", NULL, -1, methods};

PyMODINIT_FUNC PyInit__token_index(void) { return PyModule_Create(&module); }
