/* Native kernel for the lookup statistics of one table in one training step (profiles/step_counts.py).
 *
 * One pass over the table's ids, per SparseCore, gives what the numpy reference in profiles/counting.py
 * (core_table_counts, hottest_per_table_steps, relabelled_stack_counts) and profiles/collector.py
 * (the valency histogram, the exact id counts) compute with several sorts each:
 *   - per (SparseCore, destination) cell, the ids after equal (sample, id) pairs of a feature are merged
 *     and the distinct ids (the core's `partition_counts` of the table laid out alone, rotation 0);
 *   - the same with every id i < len(perm) relabelled perm[i] (a balanced table counted in frequency order);
 *   - the lookups of the step's hottest id after that merge (the balance floor);
 *   - every raw lookup added to a dense per-id count;
 *   - per feature, how many examples hold k ids, for each k.
 *
 * Equal pairs and distinct ids are found with stamps in a scratch array of one slot per id (four uint32:
 * the last sample, SparseCore and step that saw the id, and its lookups this step), so nothing is sorted
 * and the scratch is never cleared between calls: every call takes fresh stamps from a counter kept in the
 * scratch's first slot, and clears the scratch only when the counter would wrap.
 *
 * Only the buffer protocol is used (no numpy headers); the GIL is released for the counting.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
  uint32_t sample, sc, step, lookups;
} Slot;

#define PREFETCH 16 /* ids ahead whose slot and count are prefetched */

typedef struct {
  const int64_t *rows, *ids;
  Py_ssize_t n;
  int64_t samples_per_sc, samples_per_example, examples;
  int64_t *hist; /* hist_cap counts, or NULL */
} Feature;

static int get(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, int writable, const char *name) {
  if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
  if (b->len % itemsize) {
    PyErr_Format(PyExc_ValueError, "%s: buffer length is not a multiple of %zd", name, itemsize);
    PyBuffer_Release(b);
    return -1;
  }
  return 0;
}

/* Error codes of the counting (set without the GIL, raised after). */
enum { OK = 0, BAD_ID = 1, BAD_ROW = 2, UNSORTED = 3 };

/* count_table(features, vocabulary_size, S, num_scs, scratch, totals, perm, ids_cells, uniq_cells,
 *             perm_ids_cells, perm_uniq_cells, hist, hist_cap) -> (hottest, [features whose histogram overflowed])
 *
 * features: [(rows int64, ids int64, samples_per_sc, samples_per_example, examples)], rows non-decreasing
 *   global sample rows (SparseCore k holds rows [k * samples_per_sc, (k + 1) * samples_per_sc)), ids in
 *   [0, vocabulary_size); or [(lengths int64, ids int64, ..., examples, sequence_length)]: the ids per
 *   example, each id's row e (sequence_length 0) or e * sequence_length + k (its k-th id), as
 *   pipelines/sharding/batches.py's global rows.
 * scratch: uint32, at least 4 * (vocabulary_size + 1), zeroed before its first use.
 * totals: int64 [vocabulary_size] (raw lookups added), or None.  perm: int64 frequency ids, or None (then
 *   perm_* are None).  *_cells: int64 [num_scs * S], added to.  hist: int64 [len(features) * hist_cap], written:
 *   hist[f * hist_cap + k] the examples of feature f with k ids; a feature with an example of hist_cap ids or
 *   more is left zero and listed. */
static PyObject *count_table(PyObject *self, PyObject *args) {
  PyObject *features, *o_scratch, *o_totals, *o_perm, *o_ic, *o_uc, *o_pic, *o_puc, *o_hist;
  long long vocab, S, num_scs, hist_cap;
  if (!PyArg_ParseTuple(args, "O!LLLOOOOOOOOL", &PyList_Type, &features, &vocab, &S, &num_scs, &o_scratch,
                        &o_totals, &o_perm, &o_ic, &o_uc, &o_pic, &o_puc, &o_hist, &hist_cap))
    return NULL;
  if (vocab < 1 || S < 1 || num_scs < 1 || hist_cap < 1 || vocab > ((int64_t)1 << 40)) {
    PyErr_SetString(PyExc_ValueError, "count_table: bad vocabulary size, S, SparseCores or histogram size");
    return NULL;
  }
  const Py_ssize_t F = PyList_GET_SIZE(features);
  enum { SCRATCH, TOTALS, PERM, IC, UC, PIC, PUC, HIST, NB };
  PyObject *objs[NB] = {o_scratch, o_totals, o_perm, o_ic, o_uc, o_pic, o_puc, o_hist};
  static const Py_ssize_t item[NB] = {4, 8, 8, 8, 8, 8, 8, 8};
  static const int writable[NB] = {1, 1, 0, 1, 1, 1, 1, 1};
  static const char *names[NB] = {"scratch", "totals", "perm", "ids_cells", "uniq_cells", "perm_ids_cells",
                                  "perm_uniq_cells", "hist"};
  Py_buffer b[NB];
  int held[NB] = {0};
  Py_buffer *fb = PyMem_Calloc(2 * (F + 1), sizeof(Py_buffer));
  char *fheld = PyMem_Calloc(2 * (F + 1), 1);
  Feature *fs = PyMem_Calloc(F + 1, sizeof(Feature));
  int64_t **owned = PyMem_Calloc(F + 1, sizeof(int64_t *)); /* rows made from lengths */
  PyObject *result = NULL;
  if (!fb || !fheld || !fs || !owned) { PyErr_NoMemory(); goto done; }
  for (int i = 0; i < NB; i++) {
    if (objs[i] == Py_None) {
      if (i == SCRATCH || i == IC || i == UC || i == HIST) {
        PyErr_Format(PyExc_TypeError, "count_table: %s is required", names[i]);
        goto done;
      }
      continue;
    }
    if (get(objs[i], &b[i], item[i], writable[i], names[i]) < 0) goto done;
    held[i] = 1;
  }
  const int has_perm = held[PERM];
  if (has_perm != held[PIC] || has_perm != held[PUC]) {
    PyErr_SetString(PyExc_ValueError, "count_table: perm and its two cell arrays go together");
    goto done;
  }
  const Py_ssize_t cells = (Py_ssize_t)(num_scs * S);
  if (b[SCRATCH].len / 4 < 4 * (vocab + 1) || (held[TOTALS] && b[TOTALS].len / 8 < vocab) ||
      b[IC].len / 8 != cells || b[UC].len / 8 != cells || (has_perm && (b[PIC].len / 8 != cells ||
      b[PUC].len / 8 != cells)) || b[HIST].len / 8 != F * hist_cap) {
    PyErr_SetString(PyExc_ValueError, "count_table: an output or scratch array has the wrong length");
    goto done;
  }
  int64_t total_ids = 0;
  for (Py_ssize_t f = 0; f < F; f++) {
    PyObject *t = PyList_GET_ITEM(features, f);
    PyObject *r, *d;
    long long spsc, spe, examples, seq = -1;
    if (!PyTuple_Check(t) || !PyArg_ParseTuple(t, "OOLLL|L", &r, &d, &spsc, &spe, &examples, &seq)) {
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "count_table: features are (rows, ids, samples_per_sc, "
                                         "samples_per_example, examples[, sequence_length]) tuples");
      goto done;
    }
    if (get(r, &fb[2 * f], 8, 0, "rows") < 0) goto done;
    fheld[2 * f] = 1;
    if (get(d, &fb[2 * f + 1], 8, 0, "ids") < 0) goto done;
    fheld[2 * f + 1] = 1;
    const Py_ssize_t n = fb[2 * f + 1].len / 8;
    if ((seq < 0 && fb[2 * f].len != fb[2 * f + 1].len) || spsc < 1 || spe < 1 || examples < 0) {
      PyErr_SetString(PyExc_ValueError, "count_table: rows and ids differ in length, or a bad sample count");
      goto done;
    }
    fs[f].ids = fb[2 * f + 1].buf;
    fs[f].n = n;
    if (seq < 0) {
      fs[f].rows = fb[2 * f].buf;
    } else {  /* ids per example: each id's row made here (example e's k-th id: row e, or e * seq + k) */
      const int64_t *len = fb[2 * f].buf;
      const Py_ssize_t E = fb[2 * f].len / 8;
      int64_t *rows = PyMem_Malloc((size_t)(n + 1) * sizeof(int64_t));
      if (!rows) { PyErr_NoMemory(); goto done; }
      owned[f] = rows;
      Py_ssize_t i = 0;
      for (Py_ssize_t e = 0; e < E; e++) {
        if (len[e] < 0 || len[e] > n - i) {
          PyErr_Format(PyExc_ValueError, "count_table: feature %zd: the lengths do not add up to its %zd ids", f, n);
          goto done;
        }
        for (int64_t k = 0; k < len[e]; k++) rows[i++] = seq > 0 ? e * seq + k : e;
      }
      if (i != n) {
        PyErr_Format(PyExc_ValueError, "count_table: feature %zd: the lengths do not add up to its %zd ids", f, n);
        goto done;
      }
      fs[f].rows = rows;
    }
    fs[f].samples_per_sc = spsc;
    fs[f].samples_per_example = spe;
    fs[f].examples = examples;
    fs[f].hist = (int64_t *)b[HIST].buf + f * hist_cap;
    total_ids += fs[f].n;
  }

  Slot *slots = (Slot *)b[SCRATCH].buf + 1; /* slot 0 holds the stamp counter */
  uint64_t *counter = (uint64_t *)b[SCRATCH].buf;
  int64_t *totals = held[TOTALS] ? b[TOTALS].buf : NULL;
  const int64_t *perm = has_perm ? b[PERM].buf : NULL;
  const int64_t perm_n = has_perm ? b[PERM].len / 8 : 0;
  int64_t *ic = b[IC].buf, *uc = b[UC].buf, *pic = has_perm ? b[PIC].buf : NULL, *puc = has_perm ? b[PUC].buf : NULL;
  int64_t hottest = 0;
  int err = OK;
  Py_ssize_t err_f = 0, err_i = 0;
  int64_t err_v = 0;
  char *overflow = PyMem_Calloc(F + 1, 1);
  if (!overflow) { PyErr_NoMemory(); goto done; }

  Py_BEGIN_ALLOW_THREADS
  /* Stamps this call may take: one per sample at most, one per SparseCore, one for the step. */
  const uint64_t need = (uint64_t)total_ids + (uint64_t)num_scs + 2;
  if (*counter + need >= UINT32_MAX) {
    memset(slots, 0, (size_t)vocab * sizeof(Slot));
    *counter = 0;
  }
  uint32_t stamp = (uint32_t)*counter;
  const uint32_t step = ++stamp;
  const int pow2 = (S & (S - 1)) == 0; /* always, for SparseCores: a mask instead of a division per id */
  Py_ssize_t *pos = calloc(F + 1, sizeof(Py_ssize_t));
  if (!pos) err = -1;
  for (int64_t sc = 0; sc < num_scs && err == OK; sc++) {
    const uint32_t sc_stamp = ++stamp;
    int64_t *ic_sc = ic + sc * S, *uc_sc = uc + sc * S;
    for (Py_ssize_t f = 0; f < F && err == OK; f++) {
      const Feature *ft = &fs[f];
      const int64_t end_row = (sc + 1) * ft->samples_per_sc;
      Py_ssize_t i = pos[f];
      int64_t prev_row = -1;
      uint32_t sample = 0;
      for (; i < ft->n; i++) {
        const int64_t row = ft->rows[i];
        if (row >= end_row) break;
        const int64_t id = ft->ids[i];
        if (i + PREFETCH < ft->n) {  /* ids are scattered over the table: fetch their slots ahead */
          const int64_t ahead = ft->ids[i + PREFETCH];
          if (ahead >= 0 && ahead < vocab) {
            __builtin_prefetch(&slots[ahead], 1);
            if (totals) __builtin_prefetch(&totals[ahead], 1);
          }
        }
        if (row < sc * ft->samples_per_sc || row < prev_row) {
          err = row >= 0 && row < prev_row ? UNSORTED : BAD_ROW;
          err_f = f; err_i = i; err_v = row;
          break;
        }
        if (id < 0 || id >= vocab) { err = BAD_ID; err_f = f; err_i = i; err_v = id; break; }
        if (totals) totals[id]++;
        if (row != prev_row) { sample = ++stamp; prev_row = row; }
        Slot *s = &slots[id];
        if (s->sample == sample) continue; /* an equal (sample, id) pair of this feature: merged */
        s->sample = sample;
        if (s->step != step) { s->step = step; s->lookups = 0; }
        if (++s->lookups > hottest) hottest = s->lookups;
        const int first_on_sc = s->sc != sc_stamp;
        s->sc = sc_stamp;
        const int64_t dest = pow2 ? id & (S - 1) : id % S;
        ic_sc[dest]++;
        uc_sc[dest] += first_on_sc;
        if (perm) {
          const int64_t pid = id < perm_n ? perm[id] : id;
          const int64_t pdest = pow2 ? pid & (S - 1) : (pid % S + S) % S;
          pic[sc * S + pdest]++;
          puc[sc * S + pdest] += first_on_sc; /* a relabelling keeps which ids are equal */
        }
      }
      pos[f] = i;
    }
  }
  for (Py_ssize_t f = 0; f < F && err == OK; f++) {
    const Feature *ft = &fs[f];
    if (pos[f] != ft->n) { err = BAD_ROW; err_f = f; err_i = pos[f]; err_v = ft->rows[pos[f]]; break; }
    /* Valency: runs of equal examples (rows are sorted, so an example's rows are consecutive). */
    int64_t with_ids = 0;
    Py_ssize_t i = 0;
    memset(ft->hist, 0, (size_t)hist_cap * sizeof(int64_t));
    const int64_t spe = ft->samples_per_example;
    while (i < ft->n) {
      Py_ssize_t j = i + 1;
      if (spe == 1) {
        while (j < ft->n && ft->rows[j] == ft->rows[i]) j++;
      } else {
        const int64_t ex = ft->rows[i] / spe;
        while (j < ft->n && ft->rows[j] / spe == ex) j++;
      }
      if (j - i >= hist_cap) { overflow[f] = 1; break; }
      ft->hist[j - i]++;
      with_ids++;
      i = j;
    }
    if (overflow[f]) memset(ft->hist, 0, (size_t)hist_cap * sizeof(int64_t)); /* the caller counts it */
    else ft->hist[0] = ft->examples - with_ids;
  }
  *counter = stamp;
  free(pos);
  Py_END_ALLOW_THREADS

  if (err == -1) { PyErr_NoMemory(); }
  else if (err == BAD_ID) {
    PyErr_Format(PyExc_ValueError, "count_table: feature %zd: id %lld (position %zd) is outside [0, %lld)",
                 err_f, (long long)err_v, err_i, vocab);
  } else if (err == BAD_ROW || err == UNSORTED) {
    PyErr_Format(PyExc_ValueError, "count_table: feature %zd: row %lld (position %zd) is %s", err_f,
                 (long long)err_v, err_i, err == UNSORTED ? "out of order" : "outside its SparseCores' samples");
  } else {
    PyObject *over = PyList_New(0);
    if (over) {
      for (Py_ssize_t f = 0; f < F; f++) {
        if (!overflow[f]) continue;
        PyObject *n = PyLong_FromSsize_t(f);
        if (!n || PyList_Append(over, n) < 0) { Py_XDECREF(n); Py_CLEAR(over); break; }
        Py_DECREF(n);
      }
    }
    if (over) result = Py_BuildValue("(LN)", (long long)hottest, over);
  }
  PyMem_Free(overflow);
done:
  for (int i = 0; i < NB; i++) if (held[i]) PyBuffer_Release(&b[i]);
  if (fb && fheld)
    for (Py_ssize_t i = 0; i < 2 * F; i++) if (fheld[i]) PyBuffer_Release(&fb[i]);
  PyMem_Free(fb);
  PyMem_Free(fheld);
  PyMem_Free(fs);
  if (owned)
    for (Py_ssize_t f = 0; f < F; f++) PyMem_Free(owned[f]);
  PyMem_Free(owned);
  return result;
}

static PyMethodDef methods[] = {
    {"count_table", count_table, METH_VARARGS,
     "One table's lookup statistics of one step: cells, frequency-order cells, hottest id, id counts, valency."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_step_counts", NULL, -1, methods};

PyMODINIT_FUNC PyInit__step_counts(void) { return PyModule_Create(&module); }
