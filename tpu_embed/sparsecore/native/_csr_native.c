/* Native kernel for SparseCore CSR packing: the per-id loops of TF's
 * ConvertToListOfSparseCoreCooTensors + SortListOfSparseCoreCooTensors for
 * one stacked table on one chip, in one pass plus a radix sort.
 *
 * Exactness: every float operation is a single IEEE float32 operation in
 * TF's order (compile without -ffast-math).  The combiner transform is done
 * in double and rounded to float, as TF's `1.0 / x` lambdas do.
 *
 * Only the buffer protocol is used (no numpy headers): the Python side
 * passes C-contiguous arrays of the documented dtypes and wraps the returned
 * bytearrays with numpy.frombuffer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  Py_buffer b;
  int held;
} Buf;

static int get_buf(PyObject *o, Buf *buf, Py_ssize_t itemsize, const char *name) {
  buf->held = 0;
  if (o == Py_None) return 0;
  if (PyObject_GetBuffer(o, &buf->b, PyBUF_C_CONTIGUOUS) < 0) return -1;
  buf->held = 1;
  if (buf->b.len % itemsize) {
    PyErr_Format(PyExc_ValueError, "%s: buffer length is not a multiple of %zd", name, itemsize);
    return -1;
  }
  return 0;
}

static void release(Buf *buf) {
  if (buf->held) PyBuffer_Release(&buf->b);
  buf->held = 0;
}

/* Stable LSD radix sort of keys on bits [lo, lo + width), in `passes` digits of `digit` bits.
 * `count` holds one histogram per pass (built by the caller while it wrote the keys, which
 * saves a read of the keys).  Returns the array holding the result (keys or tmp). */
typedef struct {
  int lo, passes, digit;
  Py_ssize_t buckets;
  uint64_t dmask;
  Py_ssize_t *count;
} Radix;

static int radix_init(Radix *r, int lo, int width) {
  enum { MAXD = 14 };
  r->lo = lo;
  r->passes = width <= 0 ? 0 : (width + MAXD - 1) / MAXD;
  r->digit = r->passes ? (width + r->passes - 1) / r->passes : 1;
  r->buckets = (Py_ssize_t)1 << r->digit;
  r->dmask = ((uint64_t)1 << r->digit) - 1;
  r->count = calloc((size_t)(r->passes ? r->passes : 1) * r->buckets, sizeof(Py_ssize_t));
  return r->count ? 0 : -1;
}

static inline void radix_count(Radix *r, uint64_t key) {
  const uint64_t k = key >> r->lo;
  for (int p = 0; p < r->passes; p++) r->count[p * r->buckets + ((k >> (p * r->digit)) & r->dmask)]++;
}

static uint64_t *radix_sort(Radix *r, uint64_t *keys, uint64_t *tmp, Py_ssize_t n) {
  uint64_t *src = keys, *dst = tmp;
  for (int p = 0; p < r->passes; p++) {
    Py_ssize_t *c = r->count + p * r->buckets;
    const int shift = r->lo + p * r->digit;
    Py_ssize_t sum = 0, nonzero = 0;
    for (Py_ssize_t d = 0; d < r->buckets; d++) {
      const Py_ssize_t v = c[d];
      nonzero += v != 0;
      c[d] = sum;
      sum += v;
    }
    if (nonzero <= 1) continue; /* every key has the same digit: order unchanged */
    const uint64_t dmask = r->dmask;
    for (Py_ssize_t i = 0; i < n; i++) dst[c[(src[i] >> shift) & dmask]++] = src[i];
    uint64_t *t = src; src = dst; dst = t;
  }
  return src;
}

static PyObject *new_bytes(Py_ssize_t size, char **data) {
  PyObject *o = PyByteArray_FromStringAndSize(NULL, size > 0 ? size : 0);
  if (o) *data = PyByteArray_AS_STRING(o);
  return o;
}

/* sort_stack(features, offsets, shift, col_token_offset, vocab, sc_of, srow_of, row_code,
 *            num_sc_per_chip, log2s, tbits)
 *   features  list of (rows int64[n_f], ids int64[n_f], weights float32[n_f] or None), stack order
 *   offsets, shift, col_token_offset, vocab: int64[F] per feature
 *   sc_of int64[R], srow_of int32[R], row_code int8[R] (0 sum, 1 mean, 2 sqrtn) per stack sample
 * Returns (0, hi int64[k], srow int32[k], gain float32[k], ids_pp int64[nsc*S], uniq_pp int64[nsc*S])
 * or (1, feature, position) for an id out of [0, vocab), (2, feature, position) for a
 * non-finite weight, (3, feature, position) for a row outside the feature's samples. */
static PyObject *sort_stack(PyObject *self, PyObject *args) {
  PyObject *features, *o[7];
  int nsc, log2s, tbits;
  if (!PyArg_ParseTuple(args, "O!OOOOOOOiii", &PyList_Type, &features, &o[0], &o[1], &o[2], &o[3], &o[4],
                        &o[5], &o[6], &nsc, &log2s, &tbits))
    return NULL;
  Buf b[7];
  static const Py_ssize_t sizes[7] = {8, 8, 8, 8, 8, 4, 1};
  static const char *names[7] = {"offsets", "shift", "col_token_offset", "vocab", "sc_of", "srow_of",
                                 "row_code"};
  for (int i = 0; i < 7; i++) b[i].held = 0;
  Py_ssize_t F = PyList_GET_SIZE(features);
  Buf *fb = calloc(3 * (F + 1), sizeof(Buf));
  PyObject *result = NULL;
  uint64_t *keys = NULL, *tmp = NULL;
  int64_t *G = NULL;
  float *W = NULL, *s1 = NULL;
  Radix radix = {0};
  if (!fb) return PyErr_NoMemory();
  for (int i = 0; i < 7; i++)
    if (get_buf(o[i], &b[i], sizes[i], names[i]) < 0) goto done;
  Py_ssize_t n = 0;
  for (Py_ssize_t f = 0; f < F; f++) {
    PyObject *t = PyList_GET_ITEM(features, f);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3) {
      PyErr_SetString(PyExc_TypeError, "features must be (rows, ids, weights) tuples");
      goto done;
    }
    if (get_buf(PyTuple_GET_ITEM(t, 0), &fb[3 * f], 8, "rows") < 0 ||
        get_buf(PyTuple_GET_ITEM(t, 1), &fb[3 * f + 1], 8, "ids") < 0 ||
        get_buf(PyTuple_GET_ITEM(t, 2), &fb[3 * f + 2], 4, "weights") < 0)
      goto done;
    if (fb[3 * f].b.len != fb[3 * f + 1].b.len ||
        (fb[3 * f + 2].held && fb[3 * f + 2].b.len / 4 != fb[3 * f + 1].b.len / 8)) {
      PyErr_SetString(PyExc_ValueError, "rows, ids and weights of a feature differ in length");
      goto done;
    }
    n += fb[3 * f + 1].b.len / 8;
  }

  const int64_t *offsets = b[0].b.buf, *shift = b[1].b.buf, *ctok = b[2].b.buf, *vocab = b[3].b.buf;
  const int64_t *sc_of = b[4].b.buf;
  const int32_t *srow_of = b[5].b.buf;
  const int8_t *row_code = b[6].b.buf;
  Py_ssize_t R = b[4].b.len / 8;
  const int64_t S = (int64_t)1 << log2s, mask = S - 1;
  int any_combiner = 0;
  for (Py_ssize_t r = 0; r < R; r++) if (row_code[r]) { any_combiner = 1; break; }

  /* Position bits: enough for n entries (the merged count m <= n). */
  int ibits = 1;
  while (((Py_ssize_t)1 << ibits) <= n) ibits++;
  int scbits = 1;
  while ((1 << scbits) < nsc) scbits++;
  const int hibits = scbits + log2s + tbits;
  if (hibits + ibits > 64) {
    PyErr_SetString(PyExc_OverflowError, "stack too large for 64-bit sort keys");
    goto done;
  }
  G = malloc(sizeof(int64_t) * (n + 1));
  W = malloc(sizeof(float) * (n + 1));
  keys = malloc(sizeof(uint64_t) * (n + 1));
  tmp = malloc(sizeof(uint64_t) * (n + 1));
  s1 = calloc(R + 1, sizeof(float));
  if (!G || !W || !keys || !tmp || !s1) { PyErr_NoMemory(); goto done; }
  if (radix_init(&radix, ibits, hibits) < 0) { PyErr_NoMemory(); goto done; }

  /* Histogram pointers for (at most) the first two radix passes, kept in registers. */
  Py_ssize_t *const hist0 = radix.count, *const hist1 = radix.count + radix.buckets;
  const int rlo = radix.lo, rdig = radix.digit, rpasses = radix.passes;
  const uint64_t rmask = radix.dmask;

  /* 1. Validate, rewrite columns, merge adjacent duplicates, accumulate combiner sums
   *    (sum of weights for mean, of squared weights for sqrtn: TF's contribution functions). */
  Py_ssize_t m = 0;
  int64_t pg = -1, pid = -1;
  for (Py_ssize_t f = 0; f < F; f++) {
    const int64_t *rows = fb[3 * f].b.buf, *ids = fb[3 * f + 1].b.buf;
    const float *weights = fb[3 * f + 2].held ? (const float *)fb[3 * f + 2].b.buf : NULL;
    const int64_t off = offsets[f], sh = shift[f], ct = ctok[f], v = vocab[f];
    const int64_t limit = (f + 1 < F ? offsets[f + 1] : R) - off;
    const int code = off < R ? row_code[off] : 0;
    const Py_ssize_t nf = fb[3 * f + 1].b.len / 8;
    for (Py_ssize_t i = 0; i < nf; i++) {
      const int64_t id = ids[i], r = rows[i];
      if (id < 0 || id >= v) { result = Py_BuildValue("(inn)", 1, f, i); goto done; }
      if (r < 0 || r >= limit) { result = Py_BuildValue("(inn)", 3, f, i); goto done; }
      const float w = weights ? weights[i] : 1.0f;
      if (weights && !isfinite(w)) { result = Py_BuildValue("(inn)", 2, f, i); goto done; }
      const int64_t g = r + off;
      if (code == 1) s1[g] = s1[g] + w;
      else if (code == 2) s1[g] = s1[g] + w * w;
      if (g == pg && id == pid) { W[m - 1] = W[m - 1] + w; continue; }
      G[m] = g;
      const uint64_t key = ((((uint64_t)sc_of[g] << (log2s + tbits)) | ((uint64_t)((id + sh) & mask) << tbits) |
                             (uint64_t)((id >> log2s) + ct)) << ibits) | (uint64_t)m;
      keys[m] = key;
      if (rpasses == 2) {
        hist0[(key >> rlo) & rmask]++;
        hist1[(key >> (rlo + rdig)) & rmask]++;
      } else {
        radix_count(&radix, key);
      }
      W[m] = w;
      m++;
      pg = g; pid = id;
    }
  }

  /* 2. Combiner scale per sample (applied to each entry in step 4, before the merge adds, as
   *    TF does).  TF computes (float)(1.0 / x) in double; a float32 division (and sqrtf) rounds
   *    to the same value, double rounding being innocuous for / and sqrt.  'sum' samples get
   *    1.0f, and x * 1.0f == x for every finite x. */
  if (any_combiner) {
    for (Py_ssize_t r = 0; r < R; r++) {
      const float x = s1[r];
      switch (row_code[r]) {
        case 1: s1[r] = x == 0.0f ? 0.0f : 1.0f / x; break;
        case 2: s1[r] = x == 0.0f ? 0.0f : 1.0f / sqrtf(x); break;
        default: s1[r] = 1.0f;
      }
    }
  }

  /* 3. Stable sort by (local SC, destination SC, token): entries start in TF's order, so
   *    sorting only the high bits keeps ties by position. */
  uint64_t *sorted = radix_sort(&radix, keys, tmp, m);

  /* 4. Merge equal (sample, column) pairs, count ids and unique ids per partition. */
  char *p_hi, *p_srow, *p_gain, *p_ids, *p_uniq;
  PyObject *o_hi = new_bytes(8 * m, &p_hi), *o_srow = new_bytes(4 * m, &p_srow),
           *o_gain = new_bytes(4 * m, &p_gain), *o_ids = new_bytes(8 * nsc * S, &p_ids),
           *o_uniq = new_bytes(8 * nsc * S, &p_uniq);
  if (!o_hi || !o_srow || !o_gain || !o_ids || !o_uniq) {
    Py_XDECREF(o_hi); Py_XDECREF(o_srow); Py_XDECREF(o_gain); Py_XDECREF(o_ids); Py_XDECREF(o_uniq);
    goto done;
  }
  int64_t *out_hi = (int64_t *)p_hi, *ids_pp = (int64_t *)p_ids, *uniq_pp = (int64_t *)p_uniq;
  int32_t *out_srow = (int32_t *)p_srow;
  float *out_gain = (float *)p_gain;
  memset(ids_pp, 0, 8 * nsc * S);
  memset(uniq_pp, 0, 8 * nsc * S);
  const uint64_t imask = ((uint64_t)1 << ibits) - 1;
  Py_ssize_t k = 0;
  int64_t ph = -1, prow = -1;
  for (Py_ssize_t j = 0; j < m; j++) {
    const uint64_t key = sorted[j];
    const Py_ssize_t e = (Py_ssize_t)(key & imask);
    const int64_t h = (int64_t)(key >> ibits), g = G[e];
    const float gain = any_combiner ? W[e] * s1[g] : W[e];
    if (h == ph && g == prow) { out_gain[k - 1] = out_gain[k - 1] + gain; continue; }
    const int64_t seg = h >> tbits;
    ids_pp[seg]++;
    if (h != ph) uniq_pp[seg]++;
    out_hi[k] = h;
    out_srow[k] = srow_of[g];
    out_gain[k] = gain;
    k++;
    ph = h; prow = g;
  }
  if (PyByteArray_Resize(o_hi, 8 * k) < 0 || PyByteArray_Resize(o_srow, 4 * k) < 0 ||
      PyByteArray_Resize(o_gain, 4 * k) < 0) {
    Py_DECREF(o_hi); Py_DECREF(o_srow); Py_DECREF(o_gain); Py_DECREF(o_ids); Py_DECREF(o_uniq);
    goto done;
  }
  result = Py_BuildValue("(iNNNNN)", 0, o_hi, o_srow, o_gain, o_ids, o_uniq);

done:
  for (int q = 0; q < 7; q++) release(&b[q]);
  for (Py_ssize_t q = 0; q < 3 * F; q++) release(&fb[q]);
  free(fb);
  free(keys); free(tmp); free(G); free(W); free(s1); free(radix.count);
  return result;
}

/* fill_csr(hi int64[k], srow int32[k], gain float32[k], start int64[nseg], kept int64[nseg],
 *          ids_unpadded, tbits, pad) -> (sample_ids int32, token_ids int32, gains float32), each
 * ids_unpadded long: entry j of segment s goes to start[s] + its rank if the rank < kept[s];
 * every other slot holds the pad value. */
static PyObject *fill_csr(PyObject *self, PyObject *args) {
  PyObject *o[5];
  Py_ssize_t total;
  int tbits;
  long long pad;
  if (!PyArg_ParseTuple(args, "OOOOOniL", &o[0], &o[1], &o[2], &o[3], &o[4], &total, &tbits, &pad))
    return NULL;
  Buf b[5];
  static const Py_ssize_t sizes[5] = {8, 4, 4, 8, 8};
  static const char *names[5] = {"hi", "srow", "gain", "start", "kept"};
  PyObject *result = NULL;
  for (int i = 0; i < 5; i++) b[i].held = 0;
  for (int i = 0; i < 5; i++)
    if (get_buf(o[i], &b[i], sizes[i], names[i]) < 0) goto done;
  const int64_t *hi = b[0].b.buf, *start = b[3].b.buf, *kept = b[4].b.buf;
  const int32_t *srow = b[1].b.buf;
  const float *gain = b[2].b.buf;
  const Py_ssize_t k = b[0].b.len / 8, nseg = b[3].b.len / 8;
  char *ps, *pt, *pg;
  PyObject *os = new_bytes(4 * total, &ps), *ot = new_bytes(4 * total, &pt), *og = new_bytes(4 * total, &pg);
  if (!os || !ot || !og) { Py_XDECREF(os); Py_XDECREF(ot); Py_XDECREF(og); goto done; }
  int32_t *out_s = (int32_t *)ps, *out_t = (int32_t *)pt;
  float *out_g = (float *)pg;
  const int32_t ipad = (int32_t)pad;
  const float fpad = (float)pad;
  for (Py_ssize_t i = 0; i < total; i++) { out_s[i] = ipad; out_t[i] = ipad; out_g[i] = fpad; }
  const int64_t tmask = ((int64_t)1 << tbits) - 1;
  int64_t cur = -1, rank = 0;
  for (Py_ssize_t j = 0; j < k; j++) {
    const int64_t seg = hi[j] >> tbits;
    if (seg != cur) { cur = seg; rank = 0; }
    if (seg < 0 || seg >= nseg) { PyErr_SetString(PyExc_ValueError, "segment out of range"); break; }
    if (rank < kept[seg]) {
      const int64_t pos = start[seg] + rank;
      if (pos < 0 || pos >= total) { PyErr_SetString(PyExc_ValueError, "position out of range"); break; }
      out_s[pos] = srow[j];
      out_t[pos] = (int32_t)(hi[j] & tmask);
      out_g[pos] = gain[j];
    }
    rank++;
  }
  if (PyErr_Occurred()) { Py_DECREF(os); Py_DECREF(ot); Py_DECREF(og); goto done; }
  result = Py_BuildValue("(NNN)", os, ot, og);
done:
  for (int q = 0; q < 5; q++) release(&b[q]);
  return result;
}

static PyMethodDef methods[] = {
    {"fill_csr", fill_csr, METH_VARARGS, "Scatter sorted entries into the CSR id buffers."},
    {"sort_stack", sort_stack, METH_VARARGS, "Sort, merge and count one stack's ids for one chip."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_csr_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__csr_native(void) { return PyModule_Create(&module); }
