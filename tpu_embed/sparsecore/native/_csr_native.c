/* Native kernel for SparseCore CSR packing of one stacked table on one chip.
 *
 * It does what TF's host kernels ConvertToListOfSparseCoreCooTensors,
 * SortListOfSparseCoreCooTensors and ConvertToSparseCoreCsrWrappedCooTensor
 * do, in one pass over the ids, a radix sort and one fill, with the same
 * output bytes (tests/conformance compares against TF itself).
 *
 * Exactness: every float operation is a single IEEE float32 operation in TF's
 * order (compile without -ffast-math), with denormals flushed as TF's kernels
 * run them (x86's flush-to-zero and denormals-are-zero modes, see sc_task_flushed).
 *
 * Speed: TF sorts and merges per local SparseCore, so local SparseCores are
 * independent tasks; they run on a persistent pool of worker threads with the
 * GIL released.  Scratch buffers persist between calls (fresh allocations of
 * this size are mmap'd and page-fault on every call).
 *
 * Only the buffer protocol is used (no numpy headers): the Python side passes
 * C-contiguous arrays of the documented dtypes and wraps the returned buffers
 * (bytearrays and NativeBuffer blocks) with numpy.frombuffer.  TensorFlow's
 * eager tensors are also read through TF's own C API where the Python side
 * registers it (`set_eager_tensor_api`, see tpu_embed/sparsecore/eager_tensors.py):
 * their host memory without a numpy view of each.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define XLA_PAD 8
#define MAX_THREADS 64

typedef struct {
  Py_buffer b;
  int held;              /* 0 nothing, 1 a buffer-protocol view (PyBuffer_Release), 2 a TF_Tensor (TF_DeleteTensor) */
  void *tf_tensor;
  void (*tf_delete)(void *);  /* TF_DeleteTensor of the API that made it (kept if the API is set again meanwhile) */
  Py_ssize_t shape[2];   /* b.shape of a TF_Tensor: its first two dimensions */
} Buf;

/* ------------------------------------------------------------------ TensorFlow's eager tensors
 *
 * TF's C API, as TF's own numpy conversion (TFE_TensorHandleToNumpy) uses it: the tensor's handle,
 * resolved to a TF_Tensor in host memory (a reference to the tensor's buffer on the host CPU; a copy
 * from another device), read, and deleted after the call.  The functions' addresses come from the
 * TensorFlow the process has loaded (eager_tensors.py); nothing is linked against TF. */
typedef struct {
  PyTypeObject *type;                                 /* EagerTensor, compared exactly */
  void *(*handle)(const PyObject *);                  /* EagerTensor_Handle */
  void *(*resolve)(void *handle, void *status);       /* TFE_TensorHandleResolve */
  void *(*data)(const void *tensor);                  /* TF_TensorData */
  int (*dtype)(const void *tensor);                   /* TF_TensorType */
  int (*num_dims)(const void *tensor);                /* TF_NumDims */
  int64_t (*dim)(const void *tensor, int index);      /* TF_Dim */
  void (*delete_tensor)(void *tensor);                /* TF_DeleteTensor */
  int (*code)(const void *status);                    /* TF_GetCode */
  void *status;                                       /* one TF_Status, used with the GIL held */
} EagerApi;

static EagerApi eager;

enum { TF_FLOAT_ = 1, TF_INT32_ = 3, TF_INT64_ = 9 };

/* set_eager_tensor_api(type, handle, resolve, data, dtype, num_dims, dim, delete_tensor, new_status, code)
 * with the functions' addresses; set_eager_tensor_api(None) forgets them. */
static PyObject *set_eager_tensor_api(PyObject *self, PyObject *args) {
  PyObject *type;
  unsigned long long a[9] = {0};
  if (!PyArg_ParseTuple(args, "O|KKKKKKKKK", &type, &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6], &a[7],
                        &a[8]))
    return NULL;
  if (type != Py_None) {
    if (!PyType_Check(type)) return PyErr_Format(PyExc_TypeError, "set_eager_tensor_api: not a type");
    for (int i = 0; i < 9; i++)
      if (!a[i]) return PyErr_Format(PyExc_ValueError, "set_eager_tensor_api: function %d is missing", i);
  }
  /* The old status is kept (a few bytes, once per registration): a caller may still hold it. */
  Py_XDECREF((PyObject *)eager.type);
  memset(&eager, 0, sizeof(eager));
  if (type == Py_None) Py_RETURN_NONE;
  void *(*new_status)(void) = (void *(*)(void))(uintptr_t)a[7];
  eager.handle = (void *(*)(const PyObject *))(uintptr_t)a[0];
  eager.resolve = (void *(*)(void *, void *))(uintptr_t)a[1];
  eager.data = (void *(*)(const void *))(uintptr_t)a[2];
  eager.dtype = (int (*)(const void *))(uintptr_t)a[3];
  eager.num_dims = (int (*)(const void *))(uintptr_t)a[4];
  eager.dim = (int64_t (*)(const void *, int))(uintptr_t)a[5];
  eager.delete_tensor = (void (*)(void *))(uintptr_t)a[6];
  eager.code = (int (*)(const void *))(uintptr_t)a[8];
  eager.status = new_status();
  if (!eager.status) { memset(&eager, 0, sizeof(eager)); return PyErr_NoMemory(); }
  Py_INCREF(type);
  eager.type = (PyTypeObject *)type;
  Py_RETURN_NONE;
}

static char empty_tensor_data[8];

/* 0: `o`'s TF_Tensor in buf (held 2), of a TF element type the kernel reads (int32, int64, float32);
 * 1: not readable this way (the caller reports it back for conversion). */
static int get_eager(PyObject *o, Buf *buf) {
  void *t = eager.resolve(eager.handle(o), eager.status);
  if (eager.code(eager.status) != 0 || !t) {
    if (t) eager.delete_tensor(t);
    return 1;
  }
  buf->held = 2;
  buf->tf_tensor = t;
  buf->tf_delete = eager.delete_tensor;
  const int dt = eager.dtype(t), nd = eager.num_dims(t);
  buf->b.itemsize = dt == TF_FLOAT_ || dt == TF_INT32_ ? 4 : dt == TF_INT64_ ? 8 : 0;
  if (!buf->b.itemsize || nd < 0) return 1;
  Py_ssize_t n = 1;
  for (int d = 0; d < nd; d++) {
    const int64_t k = eager.dim(t, d);
    if (d < 2) buf->shape[d] = (Py_ssize_t)k;
    n *= (Py_ssize_t)k;
  }
  buf->b.ndim = nd;
  buf->b.shape = buf->shape;
  buf->b.len = n * buf->b.itemsize;
  buf->b.format = dt == TF_FLOAT_ ? "f" : dt == TF_INT32_ ? "i" : "q";
  buf->b.buf = eager.data(t);
  if (!buf->b.buf) {
    if (n) return 1;
    buf->b.buf = empty_tensor_data;  /* an empty tensor may have no data; the kernel wants a pointer */
  }
  return 0;
}

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
  if (buf->held == 1) PyBuffer_Release(&buf->b);
  else if (buf->held == 2) buf->tf_delete(buf->tf_tensor);
  buf->held = 0;
}

static PyObject *new_bytes(Py_ssize_t size, char **data) {
  PyObject *o = PyByteArray_FromStringAndSize(NULL, size > 0 ? size : 0);
  if (o) *data = PyByteArray_AS_STRING(o);
  return o;
}

/* ------------------------------------------------------------------ output buffers */

/* Memory handed to Python (wrapped with numpy.frombuffer).  Freed blocks go to a small cache
 * and are reused by the next call: a fresh block of this size comes from mmap and page-faults
 * on every page, which on this class of VM cost a quarter of the packing time.  The cache only
 * holds our own blocks, so the process's malloc settings are left alone. */
typedef struct {
  PyObject_HEAD
  void *data;
  Py_ssize_t size;
  size_t cap;
} NativeBuffer;

#define CACHE_SLOTS 32
#define CACHE_MAX_BYTES ((size_t)256 << 20)
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static void *cache_ptr[CACHE_SLOTS];
static size_t cache_cap[CACHE_SLOTS];
static size_t cache_bytes = 0;

static void *raw_alloc(Py_ssize_t size, size_t *cap) {
  size_t want = size > 0 ? (size_t)size : 1;
  int best = -1;
  pthread_mutex_lock(&cache_mu);
  for (int i = 0; i < CACHE_SLOTS; i++)
    if (cache_ptr[i] && cache_cap[i] >= want && cache_cap[i] <= 2 * want + 4096 &&
        (best < 0 || cache_cap[i] < cache_cap[best]))
      best = i;
  if (best >= 0) {
    void *p = cache_ptr[best];
    *cap = cache_cap[best];
    cache_bytes -= cache_cap[best];
    cache_ptr[best] = NULL;
    pthread_mutex_unlock(&cache_mu);
    return p;
  }
  pthread_mutex_unlock(&cache_mu);
  *cap = want + want / 8;
  return malloc(*cap);
}

static void raw_free(void *p, size_t cap) {
  if (!p) return;
  pthread_mutex_lock(&cache_mu);
  if (cache_bytes + cap <= CACHE_MAX_BYTES) {
    for (int i = 0; i < CACHE_SLOTS; i++) {
      if (!cache_ptr[i]) {
        cache_ptr[i] = p;
        cache_cap[i] = cap;
        cache_bytes += cap;
        pthread_mutex_unlock(&cache_mu);
        return;
      }
    }
  }
  pthread_mutex_unlock(&cache_mu);
  free(p);
}

static void NativeBuffer_dealloc(NativeBuffer *self) {
  raw_free(self->data, self->cap);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int NativeBuffer_getbuffer(NativeBuffer *self, Py_buffer *view, int flags) {
  return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->size, 0, flags);
}

static PyBufferProcs NativeBuffer_as_buffer = {(getbufferproc)NativeBuffer_getbuffer, NULL};

static PyTypeObject NativeBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tpu_embed.sparsecore._csr_native.NativeBuffer",
    .tp_basicsize = sizeof(NativeBuffer),
    .tp_dealloc = (destructor)NativeBuffer_dealloc,
    .tp_as_buffer = &NativeBuffer_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A block of memory filled by the native packer.",
};

/* Takes ownership of `data` (also on failure). */
static PyObject *wrap_raw(void *data, Py_ssize_t size, size_t cap) {
  NativeBuffer *o = PyObject_New(NativeBuffer, &NativeBufferType);
  if (!o) { raw_free(data, cap); return NULL; }
  o->data = data;
  o->size = size;
  o->cap = cap;
  return (PyObject *)o;
}

/* ------------------------------------------------------------------ scratch */

/* Grow-only buffers of one task slot. */
typedef struct {
  void *p[8];
  size_t cap[8];
} Scratch;

enum { S_ENTRY, S_KEYS, S_TMP, S_COUNT, S_HI, S_SROW, S_GAIN };

/* One id after adjacent duplicates merged: its sample id on the SparseCore and its weight. */
typedef struct {
  int32_t srow;
  float w;
} Entry;

static void *scratch_get(Scratch *sc, int which, size_t bytes) {
  if (bytes == 0) bytes = 8;
  if (sc->cap[which] < bytes) {
    free(sc->p[which]);
    size_t cap = bytes + bytes / 4;
    sc->p[which] = malloc(cap);
    sc->cap[which] = sc->p[which] ? cap : 0;
  }
  return sc->p[which];
}

static void scratch_free(Scratch *sc) {
  for (int i = 0; i < 8; i++) { free(sc->p[i]); sc->p[i] = NULL; sc->cap[i] = 0; }
}

/* ------------------------------------------------------------------ radix sort */

/* Stable LSD radix sort on bits [lo, lo + width) in `passes` digits; one histogram per pass,
 * all built by the caller in one read of the keys. */
typedef struct {
  int lo, passes, digit;
  Py_ssize_t buckets;
  uint64_t dmask;
  Py_ssize_t *count;
} Radix;

/* Digits of at most 12 bits for n >= 4096 keys, else 9: a 4096-bucket histogram pays for itself on a
 * few thousand keys (measured: 24-bit keys of 12k entries sort 11% faster in 2 passes of 12 bits
 * than in 3 of 8), 512 buckets stay in L1 for the small batches. */
static int radix_init(Radix *r, Scratch *s, int lo, int width, Py_ssize_t n) {
  const int maxd = n >= 4096 ? 12 : 9;
  r->lo = lo;
  r->passes = width <= 0 ? 0 : (width + maxd - 1) / maxd;
  r->digit = r->passes ? (width + r->passes - 1) / r->passes : 1;
  r->buckets = (Py_ssize_t)1 << r->digit;
  r->dmask = ((uint64_t)1 << r->digit) - 1;
  size_t bytes = (size_t)(r->passes ? r->passes : 1) * r->buckets * sizeof(Py_ssize_t);
  r->count = scratch_get(s, S_COUNT, bytes);
  if (!r->count) return -1;
  memset(r->count, 0, bytes);
  return 0;
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

/* ------------------------------------------------------------------ one local SparseCore */

typedef struct {
  Py_ssize_t F, R;
  const int64_t **rows, **ids, **splits; /* rows NULL: dense (row = position) or ragged (splits) */
  const Py_ssize_t *rstride;             /* rows[f][i * rstride[f]]: 2 reads a SparseTensor's [n, 2] indices */
  const float **weights;
  const int64_t *offsets, *shift, *ctok, *vocab;
  const int8_t *row_code;
  int nsc, log2s, tbits, any_combiner;
  int mixed;       /* weighted ids, and sum samples beside mean or sqrtn ones */
  int8_t *code_of; /* R, as scale: each sample's combiner code (read in mixed stacks) */
  const Py_ssize_t *bounds; /* F x (nsc + 1): first element of local SC s in feature f */
  float *scale;             /* R: combiner sums, then scales; SC s owns R / nsc of them, by sample id on it */
  Scratch *scratch;         /* nsc slots */
  int64_t **out_hi;         /* per SC, sorted and merged: (destination SC, token) */
  int32_t **out_srow;
  float **out_gain;
  Py_ssize_t *out_k;
  int64_t *ids_pp, *uniq_pp; /* nsc x S */
  int *err_kind;             /* per SC: 0 ok, 1 bad id, 2 bad weight, 3 bad row, 7 bad row_splits, 9 no memory */
  Py_ssize_t *err_f, *err_i;
  int64_t *err_v;            /* the bad id or row */
  float *err_w;              /* the bad weight */
  int nthreads;
  int next_task; /* the next local SC to claim (atomic) */
  int phase;     /* 1: sort and merge; 2: fill the CSR outputs */
  /* phase 2 */
  const int64_t *start, *kept;
  int64_t total, rp_block;
  int32_t *rp, *out_s, *out_t;
  float *out_g;
  int32_t ipad;
  float fpad;
} Job;

static void sc_task(Job *J, int s) {
  const int log2s = J->log2s, tbits = J->tbits;
  const int64_t S = (int64_t)1 << log2s, mask = S - 1;
  const Py_ssize_t F = J->F, nb = J->nsc + 1;
  Scratch *scr = &J->scratch[s];
  Py_ssize_t n = 0;
  for (Py_ssize_t f = 0; f < F; f++) n += J->bounds[f * nb + s + 1] - J->bounds[f * nb + s];
  int ibits = 1;
  while (((Py_ssize_t)1 << ibits) <= n) ibits++;
  Entry *P = scratch_get(scr, S_ENTRY, sizeof(Entry) * (n + 1));
  uint64_t *keys = scratch_get(scr, S_KEYS, sizeof(uint64_t) * (n + 1));
  uint64_t *tmp = scratch_get(scr, S_TMP, sizeof(uint64_t) * (n + 1));
  int64_t *out_hi = scratch_get(scr, S_HI, sizeof(int64_t) * (n + 1));
  int32_t *out_srow = scratch_get(scr, S_SROW, sizeof(int32_t) * (n + 1));
  float *out_gain = scratch_get(scr, S_GAIN, sizeof(float) * (n + 1));
  Radix radix;
  if (!P || !keys || !tmp || !out_hi || !out_srow || !out_gain ||
      radix_init(&radix, scr, ibits, log2s + tbits, n) < 0) {
    J->err_kind[s] = 9;
    return;
  }
  Py_ssize_t *const hist0 = radix.count, *const hist1 = radix.count + radix.buckets,
                   *const hist2 = radix.count + 2 * radix.buckets;
  const int rlo = radix.lo, rdig = radix.digit, rpasses = radix.passes;
  const uint64_t rmask = radix.dmask;
  /* This SC's samples, by their sample id on it: feature f's rows of SC s are its samples
   * off_f / nsc ... off_f / nsc + per_sc - 1 there. */
  float *scale = J->scale + s * (J->R / J->nsc);

  /* 1. Validate, rewrite columns, merge adjacent duplicates, accumulate combiner sums
   *    (of weights for mean, of squared weights for sqrtn: TF's contribution functions). */
  Py_ssize_t m = 0;
  int64_t pid = -1;
  int32_t psr = -1;
/* Feature f's id at position i fails a check: report it and stop the task. */
#define FAIL(kind, i, what)                                                  \
  do {                                                                       \
    J->err_kind[s] = (kind); J->err_f[s] = f; J->err_i[s] = (i); what;       \
    return;                                                                  \
  } while (0)
/* The sort key of an id: (destination SC, token) above the entry's index m. */
#define KEY(id) \
  (((((uint64_t)(((id) + sh) & mask)) << tbits | (uint64_t)(((id) >> log2s) + ct)) << ibits) | (uint64_t)m)
/* One id of sample sr: checked, its combiner contribution added, merged into the previous entry when
 * it repeats it (same sample, same id), else a new entry. */
#define TAKE(i, sr)                                                          \
  do {                                                                       \
    const int64_t id = ids[i];                                               \
    if (id < 0 || id >= v) FAIL(1, i, J->err_v[s] = id);                     \
    const float w = weights ? weights[i] : 1.0f;                             \
    if (weights && !isfinite(w)) FAIL(2, i, J->err_w[s] = w);                \
    if (code == 1) scale[sr] = scale[sr] + w;                                \
    else if (code == 2) scale[sr] = scale[sr] + w * w;                       \
    if ((sr) == psr && id == pid) {                                          \
      P[m - 1].w = P[m - 1].w + w;                                           \
    } else {                                                                 \
      keys[m] = KEY(id); P[m].srow = (sr); P[m].w = w; m++;                  \
      psr = (sr); pid = id;                                                  \
    }                                                                        \
  } while (0)

  for (Py_ssize_t f = 0; f < F; f++) {
    const int64_t *rows = J->rows[f], *ids = J->ids[f], *splits = J->splits[f];
    const Py_ssize_t rs = J->rstride[f];
    const float *weights = J->weights[f];
    const int64_t off = J->offsets[f], sh = J->shift[f], ct = J->ctok[f], v = J->vocab[f];
    const int64_t per_sc = ((f + 1 < F ? J->offsets[f + 1] : J->R) - off) / J->nsc;
    const int64_t rlo_row = s * per_sc, rhi_row = (s + 1) * per_sc;
    const int code = J->row_code[off];
    const int64_t srow_base = off / J->nsc - s * per_sc; /* row r's sample id on the SC */
    const Py_ssize_t begin = J->bounds[f * nb + s], end = J->bounds[f * nb + s + 1];
    if (splits) {
      /* Ragged: the SC's samples in order, each one's ids from row_splits.  Its first and last split
       * were checked at entry (every SC's lie in order in [0, n]); those between, here. */
      for (int64_t r = rlo_row; r < rhi_row; r++) {
        const int64_t a = splits[r], b = splits[r + 1];
        if (b < a) FAIL(7, 0, (void)0);
        const int32_t sr = (int32_t)(r + srow_base);
        for (Py_ssize_t i = a; i < b; i++) TAKE(i, sr);
      }
    } else if (rows) {
      /* Rows given (a SparseTensor's): checked to be in the SC's range and non-decreasing. */
      int64_t prev_r = rlo_row;
      for (Py_ssize_t i = begin; i < end; i++) {
        const int64_t r = rows[i * rs];
        if (r < prev_r || r >= rhi_row) FAIL(3, i, J->err_v[s] = r);
        prev_r = r;
        const int32_t sr = (int32_t)(r + srow_base);
        TAKE(i, sr);
      }
    } else {
      /* Dense: sample = position, one id each.  No two entries share a sample, so none merges, and a
       * sample's combiner sum is its one contribution (added to 0, as TF adds it). */
      for (Py_ssize_t i = begin; i < end; i++) {
        const int64_t id = ids[i];
        if (id < 0 || id >= v) FAIL(1, i, J->err_v[s] = id);
        const float w = weights ? weights[i] : 1.0f;
        if (weights && !isfinite(w)) FAIL(2, i, J->err_w[s] = w);
        const int32_t sr = (int32_t)(i + srow_base);
        if (code == 1) scale[sr] = 0.0f + w;
        else if (code == 2) scale[sr] = 0.0f + w * w;
        keys[m] = KEY(id); P[m].srow = sr; P[m].w = w; m++;
      }
      psr = -1;
    }
  }
#undef TAKE
#undef KEY
#undef FAIL

  /* Radix histograms in one sequential read of the keys (measured cheaper than counting inside
   * the loop above, which runs short of registers). */
  if (rpasses == 3) {
    for (Py_ssize_t e = 0; e < m; e++) {
      const uint64_t key = keys[e];
      hist0[(key >> rlo) & rmask]++;
      hist1[(key >> (rlo + rdig)) & rmask]++;
      hist2[(key >> (rlo + 2 * rdig)) & rmask]++;
    }
  } else if (rpasses == 2) {
    for (Py_ssize_t e = 0; e < m; e++) {
      const uint64_t key = keys[e];
      hist0[(key >> rlo) & rmask]++;
      hist1[(key >> (rlo + rdig)) & rmask]++;
    }
  } else {
    for (Py_ssize_t e = 0; e < m; e++) radix_count(&radix, keys[e]);
  }

  /* 2. Combiner scale per sample, applied per entry in step 4 before merges add (TF's order).
   *    TF computes (float)(1.0 / x) in double; float32 division (and sqrtf) round to the same
   *    value, double rounding being innocuous for / and sqrt.  'sum' samples get 1.0f, and
   *    x * 1.0f == x for every finite x. */
  if (J->any_combiner) {
    int8_t *code_of = J->code_of + s * (J->R / J->nsc);
    for (Py_ssize_t f = 0; f < F; f++) {
      const int64_t off = J->offsets[f];
      const int64_t per_sc = ((f + 1 < F ? J->offsets[f + 1] : J->R) - off) / J->nsc;
      const int code = J->row_code[off];
      for (int64_t q = off / J->nsc, qe = q + per_sc; q < qe; q++) {
        const float x = scale[q];
        code_of[q] = (int8_t)code;
        scale[q] = code == 0 ? 1.0f : x == 0.0f ? 0.0f : code == 1 ? 1.0f / x : 1.0f / sqrtf(x);
      }
    }
  }

  /* 3. Stable sort by (destination SC, token): entries start in TF's order (features in
   *    order, positions in order), so sorting only the high bits keeps ties by position. */
  uint64_t *sorted = radix_sort(&radix, keys, tmp, m);

  /* 4. Merge equal (sample, column) pairs, now adjacent; count ids and unique ids. */
  int64_t *ids_pp = J->ids_pp + s * S, *uniq_pp = J->uniq_pp + s * S;
  const uint64_t imask = ((uint64_t)1 << ibits) - 1;
  const int any_combiner = J->any_combiner, mixed = J->mixed;
  const int8_t *code_of = J->code_of + s * (J->R / J->nsc);
  Py_ssize_t k = 0;
  int64_t ph = -1;
  int32_t prow = -1;
  for (Py_ssize_t j = 0; j < m; j++) {
    const uint64_t key = sorted[j];
    const Entry p = P[key & imask];
    const int64_t h = (int64_t)(key >> ibits);
    float gain = any_combiner ? p.w * scale[p.srow] : p.w;
    /* A sum sample's scale is 1.0f, so its product is p.w but where p.w is subnormal (zero then): TF copies. */
    if (mixed && gain == 0.0f && !code_of[p.srow]) gain = p.w;
    if (h == ph && p.srow == prow) { out_gain[k - 1] = out_gain[k - 1] + gain; continue; }
    const int64_t dest = h >> tbits;
    ids_pp[dest]++;
    uniq_pp[dest] += h != ph; /* branch-free: a new token is a coin flip on skewed ids */
    out_hi[k] = h;
    out_srow[k] = p.srow;
    out_gain[k] = gain;
    k++;
    ph = h; prow = p.srow;
  }
  J->out_hi[s] = out_hi;
  J->out_srow[s] = out_srow;
  J->out_gain[s] = out_gain;
  J->out_k[s] = k;
}

/* sc_task with the float mode of TF's kernels: TF runs them with flush-to-zero and
 * denormals-are-zero set, so a subnormal operand of a gain's arithmetic reads as zero of its sign and a
 * result below 2**-126 becomes zero of its sign (a gain only copied keeps its bits).  The mode is this
 * thread's: the caller's is restored.  Elsewhere than x86 the kernel computes with gradual underflow. */
static void sc_task_flushed(Job *J, int s) {
#if defined(__x86_64__) || defined(__i386__)
  const unsigned int mode = _mm_getcsr();
  _mm_setcsr(mode | _MM_FLUSH_ZERO_ON | 0x0040u /* denormals are zero */);
  /* Compiler barriers: sc_task's float operations read and write memory, so none moves across the mode
   * changes (the compiler does not model the float mode; keeping sc_task out of line would cost more). */
  __asm__ __volatile__("" ::: "memory");
  sc_task(J, s);
  __asm__ __volatile__("" ::: "memory");
  _mm_setcsr(mode);
#else
  sc_task(J, s);
#endif
}

/* Phase 2 for local SC s: its entries go to start[q] + rank (q = s * S + destination) while the
 * rank is below kept[q]; the rest of each 8-aligned segment is padding. */
static void sc_fill(Job *J, int s) {
  const int64_t S = (int64_t)1 << J->log2s, tmask = ((int64_t)1 << J->tbits) - 1;
  const int64_t *hi = J->out_hi[s];
  const int32_t *srow = J->out_srow[s];
  const float *gain = J->out_gain[s];
  int32_t *out_s = J->out_s, *out_t = J->out_t, *rp = J->rp;
  float *out_g = J->out_g;
  Py_ssize_t j = 0;
  int64_t end = 0;
  for (int64_t d = 0; d < S; d++) {
    const int64_t q = s * S + d, c = J->ids_pp[q], kq = J->kept[q];
    int64_t pos = J->start[q];
    for (int64_t r = 0; r < kq; r++, j++, pos++) {
      out_s[pos] = srow[j];
      out_t[pos] = (int32_t)(hi[j] & tmask);
      out_g[pos] = gain[j];
    }
    j += c - kq;
    end = (pos + XLA_PAD - 1) / XLA_PAD * XLA_PAD;
    if (end > J->total) end = J->total;
    for (; pos < end; pos++) { out_s[pos] = J->ipad; out_t[pos] = J->ipad; out_g[pos] = J->fpad; }
    rp[s * J->rp_block + d] = (int32_t)(J->start[q] + kq);
  }
  for (int64_t d = S; d < J->rp_block; d++) rp[s * J->rp_block + d] = (int32_t)end;
}

/* ------------------------------------------------------------------ thread pool */

/* Workers live for the life of the process; one call uses them at a time (call_mu).
 *
 * Tasks (local SparseCores) are claimed one at a time by whichever thread is free, so a worker
 * that starts late costs nothing but its start: the calling thread packs what is left.  A woken
 * worker can start late indeed: Linux tends to queue it on the waking thread's CPU, where it
 * waits until that thread sleeps (measured: two threads no faster than one on a 2-CPU VM).
 * So workers that finished a task wait for the next one spinning for a while (POOL_SPIN_NS,
 * yielding the CPU to anything runnable) before they sleep: back-to-back calls (a stream of
 * batches; the two phases of one call) find them running on their own CPU.
 *
 * A job has nthreads - 1 seats.  A worker that sees a new job enters (pool_busy), takes a seat if
 * one is left and only then reads the job; the calling thread, done with its share, takes the
 * seats away and waits for the workers inside.  A worker that arrives later never reads the job,
 * so the caller waits only for those that took part. */
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_go = PTHREAD_COND_INITIALIZER;
static int pool_size = 0;          /* worker threads started */
static unsigned long pool_gen = 0; /* one more per job; read by spinning workers */
static int pool_sleeping = 0;      /* workers blocked on pool_go (pool_mu) */
static int pool_seats = 0;         /* seats left in the current job (atomic) */
static int pool_busy = 0;          /* workers between entering a job and leaving it (atomic) */
static Job *pool_job = NULL;
static Scratch pool_scratch[MAX_THREADS * 4];
#define POOL_SPIN_NS 300000

/* A forked child has none of the parent's worker threads: start over (and re-create the locks,
 * which another thread may have held at the moment of the fork). */
static void pool_after_fork_in_child(void) {
  pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t c = PTHREAD_COND_INITIALIZER;
  call_mu = m; pool_mu = m; cache_mu = m;
  pool_go = c;
  pool_size = 0;
  pool_sleeping = 0;
  pool_seats = 0;
  pool_busy = 0;
  pool_job = NULL;
}

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void run_share(Job *J) {
  for (;;) {
    const int s = __atomic_fetch_add(&J->next_task, 1, __ATOMIC_RELAXED);
    if (s >= J->nsc) break;
    if (J->phase == 2) sc_fill(J, s); else sc_task_flushed(J, s);
  }
}

static void *worker_main(void *arg) {
  unsigned long seen = (unsigned long)(uintptr_t)arg;
  for (;;) {
    unsigned long gen = __atomic_load_n(&pool_gen, __ATOMIC_ACQUIRE);
    for (const int64_t until = now_ns() + POOL_SPIN_NS; gen == seen && now_ns() < until;
         gen = __atomic_load_n(&pool_gen, __ATOMIC_ACQUIRE))
      sched_yield();
    if (gen == seen) {
      pthread_mutex_lock(&pool_mu);
      pool_sleeping++;
      while (pool_gen == seen) pthread_cond_wait(&pool_go, &pool_mu);
      pool_sleeping--;
      gen = pool_gen;
      pthread_mutex_unlock(&pool_mu);
    }
    seen = gen;
    __atomic_fetch_add(&pool_busy, 1, __ATOMIC_SEQ_CST);
    if (__atomic_fetch_sub(&pool_seats, 1, __ATOMIC_SEQ_CST) > 0)
      run_share(__atomic_load_n(&pool_job, __ATOMIC_SEQ_CST));
    __atomic_fetch_sub(&pool_busy, 1, __ATOMIC_SEQ_CST);
  }
  return NULL;
}

/* Runs every task of J: on the pool when J->nthreads > 1 (call_mu held), else inline. */
static void run_job(Job *J) {
  J->next_task = 0;
  if (J->nthreads > 1) {
    while (pool_size < J->nthreads - 1) {
      pthread_t tid;
      pthread_attr_t attr;
      pthread_attr_init(&attr);
      pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
      int ok = pthread_create(&tid, &attr, worker_main, (void *)(uintptr_t)pool_gen) == 0;
      pthread_attr_destroy(&attr);
      if (!ok) break;
      pool_size++;
    }
    if (J->nthreads > pool_size + 1) J->nthreads = pool_size + 1;
  }
  if (J->nthreads <= 1) {
    J->nthreads = 1;
    run_share(J);
    return;
  }
  __atomic_store_n(&pool_job, J, __ATOMIC_SEQ_CST);
  __atomic_store_n(&pool_seats, J->nthreads - 1, __ATOMIC_SEQ_CST);
  pthread_mutex_lock(&pool_mu);
  __atomic_fetch_add(&pool_gen, 1, __ATOMIC_SEQ_CST);
  if (pool_sleeping) pthread_cond_broadcast(&pool_go);
  pthread_mutex_unlock(&pool_mu);
  run_share(J);
  __atomic_store_n(&pool_seats, 0, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&pool_busy, __ATOMIC_SEQ_CST) > 0) sched_yield();
}

/* eager_tensor_bytes(tensor) -> (dtype name, shape, bytes) as the kernel reads it through TF's C API,
 * None where it does not (no API registered, not an EagerTensor, another dtype): for the registration's
 * check and the tests. */
static PyObject *eager_tensor_bytes(PyObject *self, PyObject *o) {
  if (!eager.type || Py_TYPE(o) != eager.type) Py_RETURN_NONE;
  Buf buf;
  memset(&buf, 0, sizeof(buf));
  PyObject *result = NULL;
  if (get_eager(o, &buf)) {
    release(&buf);
    Py_RETURN_NONE;
  }
  int nd = buf.b.ndim;
  PyObject *shape = PyTuple_New(nd);
  if (!shape) goto done;
  for (int d = 0; d < nd; d++) {
    PyObject *k = PyLong_FromLongLong(d < 2 ? (long long)buf.shape[d] : (long long)eager.dim(buf.tf_tensor, d));
    if (!k) { Py_DECREF(shape); goto done; }
    PyTuple_SET_ITEM(shape, d, k);
  }
  const char *name = buf.b.format[0] == 'f' ? "float32" : buf.b.format[0] == 'i' ? "int32" : "int64";
  result = Py_BuildValue("(sNy#)", name, shape, (const char *)buf.b.buf, buf.b.len);
done:
  release(&buf);
  return result;
}

/* ------------------------------------------------------------------ entry point */

/* What the kernel reads from a feature's buffers.  Any object with the buffer protocol is taken
 * as it is (numpy arrays, numpy views of TF tensors, ...) when it is C-contiguous and of one of
 * these element types, and so is a TF eager tensor once TF's C API is registered (get_eager);
 * anything else is reported back (status 10) for the caller to convert. */
enum { E_BAD = 0, E_I32, E_I64, E_F32 };

static int elem_type(const Py_buffer *b) {
  const char *f = b->format ? b->format : "B";
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  if (*f == '@' || *f == '=' || *f == '<') f++;
#else
  if (*f == '@' || *f == '=') f++;
#endif
  if (!f[0] || f[1]) return E_BAD;
  if (strchr("bhilqn", f[0])) return b->itemsize == 8 ? E_I64 : b->itemsize == 4 ? E_I32 : E_BAD;
  return f[0] == 'f' && b->itemsize == 4 ? E_F32 : E_BAD;
}

/* 0: `o` is None (absent) or a usable buffer of `want` (E_F32, or E_I64 for any integer type),
 * its element type in *type; 1: not usable as it is. */
static int get_input(PyObject *o, Buf *buf, int want, int *type) {
  buf->held = 0;
  *type = E_BAD;
  if (o == Py_None) return 0;
  if (eager.type && Py_TYPE(o) == eager.type) {
    if (get_eager(o, buf)) return 1;
  } else {
    if (PyObject_GetBuffer(o, &buf->b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
      PyErr_Clear();
      return 1;
    }
    buf->held = 1;
  }
  *type = elem_type(&buf->b);
  if (want == E_F32 ? *type != E_F32 : (*type != E_I32 && *type != E_I64)) return 1;
  return 0;
}

/* An int64 view of an integer buffer of `n` elements read every `stride` elements: the buffer itself,
 * or (int32) a converted copy kept in *copy for the caller to free. */
static const int64_t *as_int64(const Buf *buf, int type, Py_ssize_t n, Py_ssize_t stride, int64_t **copy) {
  if (type == E_I64) return buf->b.buf;
  const int32_t *src = buf->b.buf;
  int64_t *dst = malloc(sizeof(int64_t) * (n + 1));
  if (!dst) return NULL;
  for (Py_ssize_t i = 0; i < n; i++) dst[i] = src[i * stride];
  *copy = dst;
  return dst;
}

/* pack_stack(features, offsets, shift, col_token_offset, vocab, srow_of, row_code,
 *            num_sc_per_chip, log2s, tbits, num_threads, parallel_min_ids, counts_only,
 *            max_ids, max_unique_ids, id_buffer, allow_id_dropping, pad)
 *   features  list of (rows or None, ids, weights or None, row_splits or None), in stack order:
 *             ids of any shape, int32 or int64; weights float32, as many as ids; rows int32/int64,
 *             [n] or a SparseTensor's [n, 2] indices (the row is the first column), non-decreasing
 *             in [0, samples of the feature); row_splits int32/int64 [samples + 1]; no rows and no
 *             splits: dense, one id per sample.  Every buffer C-contiguous.
 *   offsets, shift, col_token_offset, vocab: int64[F] per feature
 *   srow_of int32[R] (its length is R, the stack's samples), row_code int8[R] (0 sum, 1 mean, 2 sqrtn)
 *   num_threads: at most this many threads, one when the stack has fewer than parallel_min_ids ids
 * Returns one of
 *   (0, ids_pp, uniq_pp)                                 counts_only: int64[nsc*S] each
 *   (0, ids_pp, uniq_pp, row_pointers int32, sample_ids int32, token_ids int32, gains float32,
 *    ids_unpadded_size, dropped)                         TF's meaningful prefixes
 *   (1, feature, position, id)      id out of [0, vocab)
 *   (2, feature, position, weight)  non-finite weight
 *   (3, feature, position, row)     row out of range or out of order
 *   (4, sc, dest, count, ids_pp, uniq_pp)  ids over max_ids (TF checks SC by SC, ids first)
 *   (5, sc, dest, count, ids_pp, uniq_pp)  unique ids over max_unique_ids
 *   (6, needed)             the id buffer overflows and dropping is off
 *   (7, feature, 0 | 1[, 0]) bad row_splits (0) / dense input without one id per sample (1)
 *   (8, feature, 0 | 2)     rows (0) / weights (2) and ids of a feature differ in length
 *   (10, [feature, ...])    features with a buffer the kernel does not read as it is (no buffer
 *                           protocol, not C-contiguous, another dtype, indices of rank > 2) */
static PyObject *pack_stack(PyObject *self, PyObject *args) {
  PyObject *features, *o[6];
  int nsc, log2s, tbits, nthreads, counts_only, allow_dropping;
  long long max_ids, max_uniq, cap, pad, parallel_min;
  if (!PyArg_ParseTuple(args, "O!OOOOOOiiiiLiLLLiL", &PyList_Type, &features, &o[0], &o[1], &o[2], &o[3],
                        &o[4], &o[5], &nsc, &log2s, &tbits, &nthreads, &parallel_min, &counts_only, &max_ids,
                        &max_uniq, &cap, &allow_dropping, &pad))
    return NULL;
  if (nsc < 1 || nsc > 4 * MAX_THREADS || log2s < 0 || log2s > 20 || tbits < 1 || log2s + tbits > 60) {
    PyErr_SetString(PyExc_ValueError, "bad SparseCore geometry");
    return NULL;
  }
  Buf b[6];
  static const Py_ssize_t sizes[6] = {8, 8, 8, 8, 4, 1};
  static const char *names[6] = {"offsets", "shift", "col_token_offset", "vocab", "srow_of", "row_code"};
  for (int i = 0; i < 6; i++) b[i].held = 0;
  const Py_ssize_t F = PyList_GET_SIZE(features);
  const int64_t S = (int64_t)1 << log2s;
  Buf *fb = calloc(4 * (F + 1), sizeof(Buf));
  int64_t **copies = calloc(3 * (F + 1), sizeof(int64_t *)); /* int32 inputs widened */
  Job J;
  int weighted = 0;
  memset(&J, 0, sizeof(J));
  PyObject *result = NULL, *convert = NULL;
  int own_scratch = 0, locked = 0;
  Py_ssize_t *bounds = NULL, *rstride = NULL;
  if (!fb || !copies) { free(fb); free(copies); return PyErr_NoMemory(); }
  for (int i = 0; i < 6; i++)
    if (get_buf(o[i], &b[i], sizes[i], names[i]) < 0) goto done;
  J.F = F;
  J.R = b[4].b.len / 4;
  J.offsets = b[0].b.buf; J.shift = b[1].b.buf; J.ctok = b[2].b.buf; J.vocab = b[3].b.buf;
  J.row_code = b[5].b.buf;
  J.nsc = nsc; J.log2s = log2s; J.tbits = tbits;
  if (b[0].b.len / 8 != F || b[1].b.len / 8 != F || b[2].b.len / 8 != F || b[3].b.len / 8 != F ||
      b[5].b.len != J.R) {
    PyErr_SetString(PyExc_ValueError, "per-feature or per-sample tables have the wrong length");
    goto done;
  }
  J.rows = calloc(F + 1, sizeof(int64_t *));
  J.ids = calloc(F + 1, sizeof(int64_t *));
  J.weights = calloc(F + 1, sizeof(float *));
  J.splits = calloc(F + 1, sizeof(int64_t *));
  rstride = calloc(F + 1, sizeof(Py_ssize_t));
  J.rstride = rstride;
  bounds = calloc((F + 1) * (nsc + 1), sizeof(Py_ssize_t));
  J.bounds = bounds;
  J.scale = calloc(J.R + 1, sizeof(float));
  J.code_of = calloc(J.R + 1, 1);
  J.out_hi = calloc(nsc, sizeof(int64_t *));
  J.out_srow = calloc(nsc, sizeof(int32_t *));
  J.out_gain = calloc(nsc, sizeof(float *));
  J.out_k = calloc(nsc, sizeof(Py_ssize_t));
  J.ids_pp = calloc(nsc * S, sizeof(int64_t));
  J.uniq_pp = calloc(nsc * S, sizeof(int64_t));
  J.err_kind = calloc(nsc, sizeof(int));
  J.err_f = calloc(nsc, sizeof(Py_ssize_t));
  J.err_i = calloc(nsc, sizeof(Py_ssize_t));
  J.err_v = calloc(nsc, sizeof(int64_t));
  J.err_w = calloc(nsc, sizeof(float));
  convert = PyList_New(0);
  if (!J.rows || !J.ids || !J.weights || !J.splits || !rstride || !bounds || !J.scale || !J.code_of || !J.out_hi ||
      !J.out_srow || !J.out_gain || !J.out_k || !J.ids_pp || !J.uniq_pp || !J.err_kind || !J.err_f || !J.err_i ||
      !J.err_v || !J.err_w || !convert) {
    if (!PyErr_Occurred()) PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t r = 0; r < J.R; r++) if (J.row_code[r]) { J.any_combiner = 1; break; }
  for (Py_ssize_t f = 0; f < F; f++) {
    PyObject *t = PyList_GET_ITEM(features, f);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 4) {
      PyErr_SetString(PyExc_TypeError, "features must be (rows, ids, weights, row_splits) tuples");
      goto done;
    }
    Buf *rb = &fb[4 * f], *ib = &fb[4 * f + 1], *wb = &fb[4 * f + 2], *sb = &fb[4 * f + 3];
    int rt, it, wt, st;
    if (get_input(PyTuple_GET_ITEM(t, 1), ib, E_I64, &it) || !ib->held ||
        get_input(PyTuple_GET_ITEM(t, 0), rb, E_I64, &rt) || get_input(PyTuple_GET_ITEM(t, 2), wb, E_F32, &wt) ||
        get_input(PyTuple_GET_ITEM(t, 3), sb, E_I64, &st) ||
        (rb->held && !(rb->b.ndim == 1 || (rb->b.ndim == 2 && rb->b.shape[1] == 2))) ||
        (sb->held && sb->b.ndim != 1)) {
      PyObject *fi = PyLong_FromSsize_t(f);
      if (!fi || PyList_Append(convert, fi) < 0) { Py_XDECREF(fi); goto done; }
      Py_DECREF(fi);
      continue;
    }
    const Py_ssize_t nf = ib->b.len / ib->b.itemsize;
    const int64_t per_sc = ((f + 1 < F ? J.offsets[f + 1] : J.R) - J.offsets[f]) / nsc;
    const int64_t samples = (int64_t)nsc * per_sc;
    const Py_ssize_t rs = rb->held && rb->b.ndim == 2 ? 2 : 1;
    if (rb->held && rb->b.len / rb->b.itemsize / rs != nf) {
      result = Py_BuildValue("(inn)", 8, f, (Py_ssize_t)0);
      goto done;
    }
    if (wb->held && wb->b.len / 4 != nf) {
      result = Py_BuildValue("(inn)", 8, f, (Py_ssize_t)2);
      goto done;
    }
    J.ids[f] = as_int64(ib, it, nf, 1, &copies[3 * f]);
    J.weights[f] = wb->held ? wb->b.buf : NULL;
    if (J.weights[f]) weighted = 1;
    J.rows[f] = rb->held ? as_int64(rb, rt, nf, rs, &copies[3 * f + 1]) : NULL;
    rstride[f] = rb->held && rt == E_I64 ? rs : 1;
    J.splits[f] = sb->held ? as_int64(sb, st, sb->b.len / sb->b.itemsize, 1, &copies[3 * f + 2]) : NULL;
    if (!J.ids[f] || (rb->held && !J.rows[f]) || (sb->held && !J.splits[f])) { PyErr_NoMemory(); goto done; }
    if (J.splits[f]) {
      /* Ragged: row_splits must start at 0, never decrease and end at the number of ids. */
      /* Ragged: row_splits must start at 0, never decrease and end at the number of ids; here the
       * splits that bound each SC's rows, the SC's task checks those between (in parallel). */
      const int64_t *sp = J.splits[f];
      int bad = sb->b.len / sb->b.itemsize != samples + 1 || sp[0] != 0 || sp[samples] != nf;
      for (int sc = 0; !bad && sc < nsc; sc++) bad = sp[(int64_t)(sc + 1) * per_sc] < sp[(int64_t)sc * per_sc];
      if (bad) { result = Py_BuildValue("(inn)", 7, f, (Py_ssize_t)0); goto done; }
      for (int sc = 0; sc <= nsc; sc++) bounds[f * (nsc + 1) + sc] = sp[(int64_t)sc * per_sc];
      continue;
    }
    if (!J.rows[f]) {
      /* Dense: one id per sample, row = position. */
      if (nf != samples) { result = Py_BuildValue("(inn)", 7, f, (Py_ssize_t)1); goto done; }
      for (int sc = 0; sc <= nsc; sc++) bounds[f * (nsc + 1) + sc] = (Py_ssize_t)sc * per_sc;
      continue;
    }
    /* Where each local SC's block starts (rows are sorted; the tasks re-check the order). */
    const int64_t *rows = J.rows[f];
    const Py_ssize_t st_ = rstride[f];
    if (nf && (rows[0] < 0 || rows[(nf - 1) * st_] >= samples)) {
      const Py_ssize_t at = rows[0] < 0 ? 0 : nf - 1;
      result = Py_BuildValue("(innL)", 3, f, at, (long long)rows[at * st_]);
      goto done;
    }
    Py_ssize_t lo = 0;
    for (int sc = 0; sc <= nsc; sc++) {
      const int64_t target = (int64_t)sc * per_sc;
      Py_ssize_t a = lo, z = nf;
      if (sc == nsc) a = nf;
      while (a < z) {
        const Py_ssize_t mid = a + (z - a) / 2;
        if (rows[mid * st_] < target) a = mid + 1; else z = mid;
      }
      bounds[f * (nsc + 1) + sc] = a;
      lo = a;
    }
  }
  if (PyList_GET_SIZE(convert)) {
    result = Py_BuildValue("(iO)", 10, convert);
    goto done;
  }

  /* Only a weight can be subnormal: unweighted ids need no copy of a sum sample's gains. */
  for (Py_ssize_t r = 0; weighted && J.any_combiner && r < J.R; r++) if (!J.row_code[r]) { J.mixed = 1; break; }
  Py_ssize_t total_ids = 0;
  for (Py_ssize_t f = 0; f < F; f++) total_ids += fb[4 * f + 1].b.len / fb[4 * f + 1].b.itemsize;
  if (total_ids < parallel_min) nthreads = 1;
  J.nthreads = nthreads < 1 ? 1 : nthreads > nsc ? nsc : nthreads;
  if (J.nthreads > MAX_THREADS) J.nthreads = MAX_THREADS;
  Py_BEGIN_ALLOW_THREADS
  /* The pool and its scratch serve one call at a time; a concurrent call runs inline. */
  if (pthread_mutex_trylock(&call_mu) == 0) {
    locked = 1;
    J.scratch = pool_scratch;
  } else {
    J.nthreads = 1;
    J.scratch = calloc(nsc, sizeof(Scratch));
    own_scratch = 1;
  }
  J.phase = 1;
  if (J.scratch) run_job(&J);
  Py_END_ALLOW_THREADS
  if (!J.scratch) { PyErr_NoMemory(); goto done; }

  for (int sc = 0; sc < nsc; sc++) {
    if (J.err_kind[sc] == 9) { PyErr_NoMemory(); goto done; }
    if (J.err_kind[sc]) {
      const int k = J.err_kind[sc];
      result = k == 2 ? Py_BuildValue("(innd)", k, J.err_f[sc], J.err_i[sc], (double)J.err_w[sc])
                      : Py_BuildValue("(innL)", k, J.err_f[sc], J.err_i[sc], (long long)J.err_v[sc]);
      goto done;
    }
  }
  char *p_ids, *p_uniq;
  PyObject *o_ids = new_bytes(8 * nsc * S, &p_ids), *o_uniq = new_bytes(8 * nsc * S, &p_uniq);
  if (!o_ids || !o_uniq) { Py_XDECREF(o_ids); Py_XDECREF(o_uniq); goto done; }
  memcpy(p_ids, J.ids_pp, 8 * nsc * S);
  memcpy(p_uniq, J.uniq_pp, 8 * nsc * S);
  if (counts_only) {
    result = Py_BuildValue("(iNN)", 0, o_ids, o_uniq);
    goto done;
  }

  /* Limits, as SortListOfSparseCoreCooTensors checks them: SC by SC, ids then unique ids. */
  for (int sc = 0; sc < nsc; sc++) {
    for (int64_t d = 0; d < S; d++) {
      if (J.ids_pp[sc * S + d] > max_ids) {
        result = Py_BuildValue("(iiLLNN)", 4, sc, (long long)d, (long long)J.ids_pp[sc * S + d], o_ids, o_uniq);
        goto done;
      }
      if (J.uniq_pp[sc * S + d] > max_uniq) {
        result = Py_BuildValue("(iiLLNN)", 5, sc, (long long)d, (long long)J.uniq_pp[sc * S + d], o_ids, o_uniq);
        goto done;
      }
    }
  }

  /* CSR layout (ConvertToSparseCoreCsrWrappedCooTensor): per local SC, per destination SC, the
   * ids, then padding to a multiple of 8; each SC's row pointers padded to roundup(S, 8).  With
   * dropping, ids past the buffer are cut off (and counted). */
  const int64_t nseg = nsc * S, rp_block = (S + XLA_PAD - 1) / XLA_PAD * XLA_PAD;
  int64_t g = 0, dropped = 0, needed = 0;
  int64_t *start = malloc(sizeof(int64_t) * (nseg + 1)), *kept = malloc(sizeof(int64_t) * (nseg + 1));
  if (!start || !kept) { free(start); free(kept); Py_DECREF(o_ids); Py_DECREF(o_uniq); PyErr_NoMemory(); goto done; }
  for (int64_t q = 0; q < nseg; q++) {
    const int64_t c = J.ids_pp[q];
    const int64_t kq = g + c > cap ? (cap - g > 0 ? cap - g : 0) : c;
    start[q] = g;
    kept[q] = kq;
    dropped += c - kq;
    needed += (c + XLA_PAD - 1) / XLA_PAD * XLA_PAD;
    g += kq;
    g = (g + XLA_PAD - 1) / XLA_PAD * XLA_PAD;
    if (g > cap) g = cap;
  }
  if (dropped && !allow_dropping) {
    free(start); free(kept); Py_DECREF(o_ids); Py_DECREF(o_uniq);
    result = Py_BuildValue("(iL)", 6, (long long)needed);
    goto done;
  }
  const Py_ssize_t total = (Py_ssize_t)g;
  void *m_rp = NULL, *m_s = NULL, *m_t = NULL, *m_g = NULL;
  size_t mm_rp = 0, mm_s = 0, mm_t = 0, mm_g = 0;
  Py_BEGIN_ALLOW_THREADS
  m_rp = raw_alloc(4 * nsc * rp_block, &mm_rp);
  m_s = raw_alloc(4 * total, &mm_s);
  m_t = raw_alloc(4 * total, &mm_t);
  m_g = raw_alloc(4 * total, &mm_g);
  if (m_rp && m_s && m_t && m_g) {
    J.phase = 2;
    J.start = start; J.kept = kept; J.total = total; J.rp_block = rp_block;
    J.rp = m_rp; J.out_s = m_s; J.out_t = m_t; J.out_g = m_g;
    J.ipad = (int32_t)pad; J.fpad = (float)pad;
    run_job(&J);
  }
  Py_END_ALLOW_THREADS
  free(start); free(kept);
  if (!m_rp || !m_s || !m_t || !m_g) {
    raw_free(m_rp, mm_rp); raw_free(m_s, mm_s);
    raw_free(m_t, mm_t); raw_free(m_g, mm_g);
    Py_DECREF(o_ids); Py_DECREF(o_uniq); PyErr_NoMemory();
    goto done;
  }
  PyObject *o_rp = wrap_raw(m_rp, 4 * nsc * rp_block, mm_rp), *o_s = wrap_raw(m_s, 4 * total, mm_s),
           *o_t = wrap_raw(m_t, 4 * total, mm_t), *o_g = wrap_raw(m_g, 4 * total, mm_g);
  if (!o_rp || !o_s || !o_t || !o_g) {
    Py_XDECREF(o_rp); Py_XDECREF(o_s); Py_XDECREF(o_t); Py_XDECREF(o_g);
    Py_DECREF(o_ids); Py_DECREF(o_uniq);
    goto done;
  }
  result = Py_BuildValue("(iNNNNNNnL)", 0, o_ids, o_uniq, o_rp, o_s, o_t, o_g, total, (long long)dropped);

done:
  if (locked) pthread_mutex_unlock(&call_mu);
  if (own_scratch && J.scratch) { for (int sc = 0; sc < nsc; sc++) scratch_free(&J.scratch[sc]); free(J.scratch); }
  for (int q = 0; q < 6; q++) release(&b[q]);
  for (Py_ssize_t q = 0; q < 4 * F; q++) release(&fb[q]);
  for (Py_ssize_t q = 0; q < 3 * F; q++) free(copies[q]);
  free(fb); free(copies);
  Py_XDECREF(convert);
  free(J.out_hi); free(J.out_srow); free(J.out_gain); free(J.out_k);
  free(J.rows); free(J.ids); free(J.weights); free(J.splits); free(bounds); free(J.scale); free(J.code_of);
  free(J.ids_pp); free(J.uniq_pp); free(J.err_kind); free(J.err_f); free(J.err_i);
  free(J.err_v); free(J.err_w); free(rstride);
  return result;
}

/* ------------------------------------------------------------------ shard record arrays */

/* narrow_stack(sample_ids, token_ids, gains, sample_width, token_width, want_unit, check_padding)
 *   -> (status, sample bytes | None, token bytes | None, unit)
 *
 * One chip's CSR prefix (int32 ids, float32 gains, n entries) as a shard record stores it, in one pass without
 * the GIL: the readable rule is `tpu_embed.artifact.shard_records` (`narrow_ids`, `unit_gains`, the padding
 * check of `_stack_features`), which this is tested against.  Ids of width 1 or 2 are written little-endian
 * with PAD_VALUE as the type's maximum (their low bits), width 4: None (the int32 array is stored as it is).
 * `unit`: every gain is 1.0, and float32(PAD_VALUE) where the sample id is PAD_VALUE (want_unit 0: False).
 * status: 0, or 1 where `check_padding` and a sample id and its token id are not PAD_VALUE together, 2 / 3
 * where a sample / token id other than PAD_VALUE does not fit below its width's maximum (the caller raises
 * the reference's error). */
#define REC_PAD 2147483647

/* The checks of one prefix, branch-free so that the loop vectorises: any padding mismatch, any sample / token id
 * that does not fit its width (PAD_VALUE aside), any gain other than the unit one. */
typedef struct {
  uint32_t pad, sample, token, gain;
} RecChecks;

static RecChecks rec_checks(const int32_t *sid, const int32_t *tid, const uint32_t *g, Py_ssize_t n, uint32_t stop,
                            uint32_t ttop, uint32_t pad_bits, uint32_t one_bits) {
  uint32_t pad = 0, bs = 0, bt = 0, bg = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    const uint32_t s = (uint32_t)sid[i], t = (uint32_t)tid[i];
    const uint32_t spad = s == (uint32_t)REC_PAD, tpad = t == (uint32_t)REC_PAD;
    pad |= spad ^ tpad;
    bs |= (s >= stop) & !spad;
    bt |= (t >= ttop) & !tpad;
    bg |= g[i] ^ (spad ? pad_bits : one_bits);
  }
  RecChecks r = {pad, bs, bt, bg};
  return r;
}

/* Ids to `width` bytes each (1 or 2), little-endian: the low bits (PAD_VALUE: the type's maximum). */
static void rec_narrow(const int32_t *ids, Py_ssize_t n, int width, unsigned char *out) {
  if (width == 1) {
    for (Py_ssize_t i = 0; i < n; i++) out[i] = (unsigned char)(uint32_t)ids[i];
    return;
  }
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  uint16_t *o16 = (uint16_t *)out; /* a bytes object's data is aligned for any type */
  for (Py_ssize_t i = 0; i < n; i++) o16[i] = (uint16_t)(uint32_t)ids[i];
#else
  for (Py_ssize_t i = 0; i < n; i++) {
    out[2 * i] = (unsigned char)(uint32_t)ids[i];
    out[2 * i + 1] = (unsigned char)((uint32_t)ids[i] >> 8);
  }
#endif
}

static PyObject *narrow_stack(PyObject *self, PyObject *args) {
  PyObject *so, *to, *go;
  int sw, tw, want_unit, check_padding;
  if (!PyArg_ParseTuple(args, "OOOiiii", &so, &to, &go, &sw, &tw, &want_unit, &check_padding)) return NULL;
  if ((sw != 1 && sw != 2 && sw != 4) || (tw != 1 && tw != 2 && tw != 4)) {
    PyErr_SetString(PyExc_ValueError, "narrow_stack: widths must be 1, 2 or 4 bytes");
    return NULL;
  }
  Buf bs, bt, bg;
  bs.held = bt.held = bg.held = 0;
  PyObject *outs = NULL, *outt = NULL, *result = NULL;
  if (get_buf(so, &bs, 4, "sample_ids") < 0 || get_buf(to, &bt, 4, "token_ids") < 0 || get_buf(go, &bg, 4, "gains") < 0)
    goto done;
  if (!bs.held || !bt.held || !bg.held) {
    PyErr_SetString(PyExc_TypeError, "narrow_stack: sample_ids, token_ids and gains are required");
    goto done;
  }
  Py_ssize_t n = bs.b.len / 4;
  if (bt.b.len / 4 != n || bg.b.len / 4 != n) {
    PyErr_SetString(PyExc_ValueError, "narrow_stack: sample_ids, token_ids and gains differ in length");
    goto done;
  }
  if (sw < 4 && !(outs = PyBytes_FromStringAndSize(NULL, n * sw))) goto done;
  if (tw < 4 && !(outt = PyBytes_FromStringAndSize(NULL, n * tw))) goto done;
  const int32_t *sid = (const int32_t *)bs.b.buf, *tid = (const int32_t *)bt.b.buf;
  const uint32_t *gbits = (const uint32_t *)bg.b.buf;
  unsigned char *os_ = outs ? (unsigned char *)PyBytes_AS_STRING(outs) : NULL;
  unsigned char *ot = outt ? (unsigned char *)PyBytes_AS_STRING(outt) : NULL;
  const uint32_t stop = sw == 1 ? 0xFFu : sw == 2 ? 0xFFFFu : 0xFFFFFFFFu;
  const uint32_t ttop = tw == 1 ? 0xFFu : tw == 2 ? 0xFFFFu : 0xFFFFFFFFu;
  float fpad = (float)REC_PAD, fone = 1.0f;
  uint32_t pad_bits, one_bits;
  memcpy(&pad_bits, &fpad, 4);
  memcpy(&one_bits, &fone, 4);
  int status = 0, unit = want_unit != 0;
  Py_BEGIN_ALLOW_THREADS
  RecChecks c = rec_checks(sid, tid, gbits, n, stop, ttop, pad_bits, one_bits);
  status = (check_padding && c.pad) ? 1 : (sw < 4 && c.sample) ? 2 : (tw < 4 && c.token) ? 3 : 0;
  unit = unit && !c.gain;
  if (!status) {
    if (sw < 4) rec_narrow(sid, n, sw, os_);
    if (tw < 4) rec_narrow(tid, n, tw, ot);
  }
  Py_END_ALLOW_THREADS
  if (status) {
    result = Py_BuildValue("(iOOO)", status, Py_None, Py_None, Py_False);
  } else {
    result = Py_BuildValue("(iOOO)", 0, outs ? outs : Py_None, outt ? outt : Py_None, unit ? Py_True : Py_False);
  }
done:
  Py_XDECREF(outs);
  Py_XDECREF(outt);
  release(&bs);
  release(&bt);
  release(&bg);
  return result;
}

static PyMethodDef methods[] = {
    {"pack_stack", pack_stack, METH_VARARGS, "Pack one stacked table's ids for one chip into SparseCore CSR."},
    {"set_eager_tensor_api", set_eager_tensor_api, METH_VARARGS,
     "Read TF eager tensors through TF's C API: (type, function addresses...), or None to stop."},
    {"eager_tensor_bytes", eager_tensor_bytes, METH_O, "(dtype, shape, bytes) of a TF eager tensor as the kernel reads it."},
    {"narrow_stack", narrow_stack, METH_VARARGS,
     "One chip's CSR prefix as a shard record stores it: (status, sample bytes, token bytes, unit gains)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_csr_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__csr_native(void) {
  if (PyType_Ready(&NativeBufferType) < 0) return NULL;
  pthread_atfork(NULL, NULL, pool_after_fork_in_child);
  PyObject *m = PyModule_Create(&module);
  if (!m) return NULL;
  Py_INCREF(&NativeBufferType);
  if (PyModule_AddObject(m, "NativeBuffer", (PyObject *)&NativeBufferType) < 0) {
    Py_DECREF(&NativeBufferType);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
