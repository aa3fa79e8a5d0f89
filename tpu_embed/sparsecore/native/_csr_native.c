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
#include <pthread.h>
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

/* One stacked table on one chip.  The work splits by local SparseCore: each local SC's samples
 * are a contiguous block of every feature, and TF sorts and merges per local SC, so the blocks
 * are independent and run on worker threads without the GIL. */
typedef struct {
  Py_ssize_t F, R;
  const int64_t **rows, **ids;
  const float **weights;
  const int64_t *offsets, *shift, *ctok, *vocab;
  const int32_t *srow_of;
  const int8_t *row_code;
  int nsc, log2s, tbits, any_combiner;
  const Py_ssize_t *bounds; /* F x (nsc + 1): first element of SC s in feature f */
  float *scale;             /* R: combiner sums, then scales (each SC owns its rows) */
  int64_t **out_hi;
  int32_t **out_srow;
  float **out_gain;
  Py_ssize_t *out_k;
  int64_t *ids_pp, *uniq_pp; /* nsc x S */
  int *err_kind;             /* per SC: 0 ok, 1 bad id, 2 bad weight, 3 bad row, 9 no memory */
  Py_ssize_t *err_f, *err_i;
  int nthreads;
} Job;

static void sc_task(Job *J, int s) {
  const int log2s = J->log2s, tbits = J->tbits;
  const int64_t S = (int64_t)1 << log2s, mask = S - 1;
  const Py_ssize_t F = J->F, nb = J->nsc + 1;
  Py_ssize_t n = 0;
  for (Py_ssize_t f = 0; f < F; f++) n += J->bounds[f * nb + s + 1] - J->bounds[f * nb + s];
  int ibits = 1;
  while (((Py_ssize_t)1 << ibits) <= n) ibits++;
  int64_t *G = malloc(sizeof(int64_t) * (n + 1));
  float *W = malloc(sizeof(float) * (n + 1));
  uint64_t *keys = malloc(sizeof(uint64_t) * (n + 1)), *tmp = malloc(sizeof(uint64_t) * (n + 1));
  Radix radix = {0};
  if (!G || !W || !keys || !tmp || radix_init(&radix, ibits, log2s + tbits) < 0) {
    J->err_kind[s] = 9;
    goto out;
  }
  Py_ssize_t *const hist0 = radix.count, *const hist1 = radix.count + radix.buckets;
  const int rlo = radix.lo, rdig = radix.digit, rpasses = radix.passes;
  const uint64_t rmask = radix.dmask;
  float *scale = J->scale;

  /* 1. Validate, rewrite columns, merge adjacent duplicates, accumulate combiner sums
   *    (of weights for mean, of squared weights for sqrtn: TF's contribution functions). */
  Py_ssize_t m = 0;
  int64_t pg = -1, pid = -1;
  for (Py_ssize_t f = 0; f < F; f++) {
    const int64_t *rows = J->rows[f], *ids = J->ids[f];
    const float *weights = J->weights[f];
    const int64_t off = J->offsets[f], sh = J->shift[f], ct = J->ctok[f], v = J->vocab[f];
    const int64_t per_sc = ((f + 1 < F ? J->offsets[f + 1] : J->R) - off) / J->nsc;
    const int64_t rlo_row = s * per_sc, rhi_row = rlo_row + per_sc;
    const int code = J->row_code[off];
    int64_t prev_r = rlo_row;
    for (Py_ssize_t i = J->bounds[f * nb + s], end = J->bounds[f * nb + s + 1]; i < end; i++) {
      const int64_t id = ids[i], r = rows[i];
      if (id < 0 || id >= v) { J->err_kind[s] = 1; J->err_f[s] = f; J->err_i[s] = i; goto out; }
      if (r < prev_r || r >= rhi_row) { J->err_kind[s] = 3; J->err_f[s] = f; J->err_i[s] = i; goto out; }
      prev_r = r;
      const float w = weights ? weights[i] : 1.0f;
      if (weights && !isfinite(w)) { J->err_kind[s] = 2; J->err_f[s] = f; J->err_i[s] = i; goto out; }
      const int64_t g = r + off;
      if (code == 1) scale[g] = scale[g] + w;
      else if (code == 2) scale[g] = scale[g] + w * w;
      if (g == pg && id == pid) { W[m - 1] = W[m - 1] + w; continue; }
      G[m] = g;
      const uint64_t key =
          ((((uint64_t)((id + sh) & mask)) << tbits | (uint64_t)((id >> log2s) + ct)) << ibits) | (uint64_t)m;
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

  /* 2. Combiner scale per sample, applied per entry in step 4 before merges add (TF's order).
   *    TF computes (float)(1.0 / x) in double; float32 division (and sqrtf) round to the same
   *    value, double rounding being innocuous for / and sqrt.  'sum' samples get 1.0f, and
   *    x * 1.0f == x for every finite x. */
  if (J->any_combiner) {
    for (Py_ssize_t f = 0; f < F; f++) {
      const int64_t off = J->offsets[f];
      const int64_t per_sc = ((f + 1 < F ? J->offsets[f + 1] : J->R) - off) / J->nsc;
      const int code = J->row_code[off];
      for (int64_t g = off + s * per_sc, ge = g + per_sc; g < ge; g++) {
        const float x = scale[g];
        scale[g] = code == 0 ? 1.0f : x == 0.0f ? 0.0f : code == 1 ? 1.0f / x : 1.0f / sqrtf(x);
      }
    }
  }

  /* 3. Stable sort by (destination SC, token): entries start in TF's order (features in
   *    order, positions in order), so sorting only the high bits keeps ties by position. */
  uint64_t *sorted = radix_sort(&radix, keys, tmp, m);

  /* 4. Merge equal (sample, column) pairs, now adjacent; count ids and unique ids. */
  int64_t *out_hi = malloc(sizeof(int64_t) * (m + 1));
  int32_t *out_srow = malloc(sizeof(int32_t) * (m + 1));
  float *out_gain = malloc(sizeof(float) * (m + 1));
  if (!out_hi || !out_srow || !out_gain) {
    free(out_hi); free(out_srow); free(out_gain);
    J->err_kind[s] = 9;
    goto out;
  }
  int64_t *ids_pp = J->ids_pp + s * S, *uniq_pp = J->uniq_pp + s * S;
  const uint64_t imask = ((uint64_t)1 << ibits) - 1;
  const int64_t sc_bits = (int64_t)s << (log2s + tbits);
  const int any_combiner = J->any_combiner;
  Py_ssize_t k = 0;
  int64_t ph = -1, prow = -1;
  for (Py_ssize_t j = 0; j < m; j++) {
    const uint64_t key = sorted[j];
    const Py_ssize_t e = (Py_ssize_t)(key & imask);
    const int64_t h = (int64_t)(key >> ibits), g = G[e];
    const float gain = any_combiner ? W[e] * scale[g] : W[e];
    if (h == ph && g == prow) { out_gain[k - 1] = out_gain[k - 1] + gain; continue; }
    const int64_t dest = h >> tbits;
    ids_pp[dest]++;
    if (h != ph) uniq_pp[dest]++;
    out_hi[k] = sc_bits | h;
    out_srow[k] = J->srow_of[g];
    out_gain[k] = gain;
    k++;
    ph = h; prow = g;
  }
  J->out_hi[s] = out_hi;
  J->out_srow[s] = out_srow;
  J->out_gain[s] = out_gain;
  J->out_k[s] = k;
out:
  free(G); free(W); free(keys); free(tmp); free(radix.count);
}

typedef struct {
  Job *job;
  int t;
} Worker;

static void *worker_main(void *arg) {
  Worker *w = arg;
  for (int s = w->t; s < w->job->nsc; s += w->job->nthreads) sc_task(w->job, s);
  return NULL;
}

/* sort_stack(features, offsets, shift, col_token_offset, vocab, srow_of, row_code,
 *            num_sc_per_chip, log2s, tbits, num_threads)
 *   features  list of (rows int64[n_f], ids int64[n_f], weights float32[n_f] or None), stack order;
 *             rows non-decreasing in [0, samples of the feature)
 *   offsets, shift, col_token_offset, vocab: int64[F] per feature (sample offset in the stack, ...)
 *   srow_of int32[R], row_code int8[R] (0 sum, 1 mean, 2 sqrtn) per stack sample
 * Returns (0, hi int64[k], srow int32[k], gain float32[k], ids_pp int64[nsc*S], uniq_pp int64[nsc*S])
 * where hi = (local SC, destination SC, token) packed, or (1, feature, position) for an id out of
 * [0, vocab), (2, feature, position) for a non-finite weight, (3, feature, position) for a row
 * that is out of range or out of order. */
static PyObject *sort_stack(PyObject *self, PyObject *args) {
  PyObject *features, *o[6];
  int nsc, log2s, tbits, nthreads;
  if (!PyArg_ParseTuple(args, "O!OOOOOOiiii", &PyList_Type, &features, &o[0], &o[1], &o[2], &o[3], &o[4],
                        &o[5], &nsc, &log2s, &tbits, &nthreads))
    return NULL;
  if (nsc < 1 || log2s < 0 || log2s > 20 || tbits < 1 || log2s + tbits + 2 > 62) {
    PyErr_SetString(PyExc_ValueError, "bad SparseCore geometry");
    return NULL;
  }
  Buf b[6];
  static const Py_ssize_t sizes[6] = {8, 8, 8, 8, 4, 1};
  static const char *names[6] = {"offsets", "shift", "col_token_offset", "vocab", "srow_of", "row_code"};
  for (int i = 0; i < 6; i++) b[i].held = 0;
  const Py_ssize_t F = PyList_GET_SIZE(features);
  const int64_t S = (int64_t)1 << log2s;
  Buf *fb = calloc(3 * (F + 1), sizeof(Buf));
  Job J;
  memset(&J, 0, sizeof(J));
  PyObject *result = NULL;
  if (!fb) return PyErr_NoMemory();
  for (int i = 0; i < 6; i++)
    if (get_buf(o[i], &b[i], sizes[i], names[i]) < 0) goto done;
  J.F = F;
  J.R = b[4].b.len / 4;
  J.offsets = b[0].b.buf; J.shift = b[1].b.buf; J.ctok = b[2].b.buf; J.vocab = b[3].b.buf;
  J.srow_of = b[4].b.buf; J.row_code = b[5].b.buf;
  J.nsc = nsc; J.log2s = log2s; J.tbits = tbits;
  if (b[0].b.len / 8 != F || b[1].b.len / 8 != F || b[2].b.len / 8 != F || b[3].b.len / 8 != F ||
      b[5].b.len != J.R) {
    PyErr_SetString(PyExc_ValueError, "per-feature or per-sample tables have the wrong length");
    goto done;
  }
  J.rows = calloc(F + 1, sizeof(int64_t *));
  J.ids = calloc(F + 1, sizeof(int64_t *));
  J.weights = calloc(F + 1, sizeof(float *));
  Py_ssize_t *bounds = calloc((F + 1) * (nsc + 1), sizeof(Py_ssize_t));
  J.bounds = bounds;
  J.scale = calloc(J.R + 1, sizeof(float));
  J.out_hi = calloc(nsc, sizeof(int64_t *));
  J.out_srow = calloc(nsc, sizeof(int32_t *));
  J.out_gain = calloc(nsc, sizeof(float *));
  J.out_k = calloc(nsc, sizeof(Py_ssize_t));
  J.ids_pp = calloc(nsc * S, sizeof(int64_t));
  J.uniq_pp = calloc(nsc * S, sizeof(int64_t));
  J.err_kind = calloc(nsc, sizeof(int));
  J.err_f = calloc(nsc, sizeof(Py_ssize_t));
  J.err_i = calloc(nsc, sizeof(Py_ssize_t));
  if (!J.rows || !J.ids || !J.weights || !bounds || !J.scale || !J.out_hi || !J.out_srow || !J.out_gain ||
      !J.out_k || !J.ids_pp || !J.uniq_pp || !J.err_kind || !J.err_f || !J.err_i) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t r = 0; r < J.R; r++) if (J.row_code[r]) { J.any_combiner = 1; break; }
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
    const Py_ssize_t nf = fb[3 * f + 1].b.len / 8;
    if (fb[3 * f].b.len / 8 != nf || (fb[3 * f + 2].held && fb[3 * f + 2].b.len / 4 != nf)) {
      PyErr_SetString(PyExc_ValueError, "rows, ids and weights of a feature differ in length");
      goto done;
    }
    J.rows[f] = fb[3 * f].b.buf;
    J.ids[f] = fb[3 * f + 1].b.buf;
    J.weights[f] = fb[3 * f + 2].held ? fb[3 * f + 2].b.buf : NULL;
    /* Where each local SC's block starts (rows are sorted; the tasks re-check the order). */
    const int64_t per_sc = ((f + 1 < F ? J.offsets[f + 1] : J.R) - J.offsets[f]) / nsc;
    const int64_t *rows = J.rows[f];
    Py_ssize_t lo = 0;
    for (int sc = 0; sc <= nsc; sc++) {
      const int64_t target = (int64_t)sc * per_sc;
      Py_ssize_t a = lo, z = nf;
      if (sc == nsc) a = nf;
      while (a < z) {
        const Py_ssize_t mid = a + (z - a) / 2;
        if (rows[mid] < target) a = mid + 1; else z = mid;
      }
      bounds[f * (nsc + 1) + sc] = a;
      lo = a;
    }
    if (nf && (rows[0] < 0 || rows[nf - 1] >= (int64_t)nsc * per_sc)) {
      result = Py_BuildValue("(inn)", 3, f, rows[0] < 0 ? (Py_ssize_t)0 : nf - 1);
      goto done;
    }
  }

  J.nthreads = nthreads < 1 ? 1 : nthreads > nsc ? nsc : nthreads;
  Py_BEGIN_ALLOW_THREADS
  pthread_t tid[64];
  Worker wk[64];
  int started = 0;
  if (J.nthreads > 64) J.nthreads = 64;
  for (int t = 1; t < J.nthreads; t++) {
    wk[t].job = &J; wk[t].t = t;
    if (pthread_create(&tid[t], NULL, worker_main, &wk[t]) == 0) started = t;
    else break;
  }
  if (started < J.nthreads - 1) {
    /* Could not start every thread: finish their share here (tasks are independent). */
    for (int t = started + 1; t < J.nthreads; t++)
      for (int s = t; s < nsc; s += J.nthreads) sc_task(&J, s);
  }
  wk[0].job = &J; wk[0].t = 0;
  worker_main(&wk[0]);
  for (int t = 1; t <= started; t++) pthread_join(tid[t], NULL);
  Py_END_ALLOW_THREADS

  for (int sc = 0; sc < nsc; sc++) {
    if (J.err_kind[sc] == 9) { PyErr_NoMemory(); goto done; }
    if (J.err_kind[sc]) {
      result = Py_BuildValue("(inn)", J.err_kind[sc], J.err_f[sc], J.err_i[sc]);
      goto done;
    }
  }
  Py_ssize_t k = 0;
  for (int sc = 0; sc < nsc; sc++) k += J.out_k[sc];
  char *p_hi, *p_srow, *p_gain, *p_ids, *p_uniq;
  PyObject *o_hi = new_bytes(8 * k, &p_hi), *o_srow = new_bytes(4 * k, &p_srow),
           *o_gain = new_bytes(4 * k, &p_gain), *o_ids = new_bytes(8 * nsc * S, &p_ids),
           *o_uniq = new_bytes(8 * nsc * S, &p_uniq);
  if (!o_hi || !o_srow || !o_gain || !o_ids || !o_uniq) {
    Py_XDECREF(o_hi); Py_XDECREF(o_srow); Py_XDECREF(o_gain); Py_XDECREF(o_ids); Py_XDECREF(o_uniq);
    goto done;
  }
  Py_ssize_t at = 0;
  for (int sc = 0; sc < nsc; sc++) {
    const Py_ssize_t c = J.out_k[sc];
    memcpy(p_hi + 8 * at, J.out_hi[sc], 8 * c);
    memcpy(p_srow + 4 * at, J.out_srow[sc], 4 * c);
    memcpy(p_gain + 4 * at, J.out_gain[sc], 4 * c);
    at += c;
  }
  memcpy(p_ids, J.ids_pp, 8 * nsc * S);
  memcpy(p_uniq, J.uniq_pp, 8 * nsc * S);
  result = Py_BuildValue("(iNNNNN)", 0, o_hi, o_srow, o_gain, o_ids, o_uniq);

done:
  for (int q = 0; q < 6; q++) release(&b[q]);
  for (Py_ssize_t q = 0; q < 3 * F; q++) release(&fb[q]);
  free(fb);
  if (J.out_hi) for (int sc = 0; sc < nsc; sc++) free(J.out_hi[sc]);
  if (J.out_srow) for (int sc = 0; sc < nsc; sc++) free(J.out_srow[sc]);
  if (J.out_gain) for (int sc = 0; sc < nsc; sc++) free(J.out_gain[sc]);
  free(J.out_hi); free(J.out_srow); free(J.out_gain); free(J.out_k);
  free(J.rows); free(J.ids); free(J.weights); free((void *)J.bounds); free(J.scale);
  free(J.ids_pp); free(J.uniq_pp); free(J.err_kind); free(J.err_f); free(J.err_i);
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
