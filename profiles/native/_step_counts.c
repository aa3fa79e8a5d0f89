/* Native kernel for the lookup statistics of one training step (profiles/step_counts.py).
 *
 * One pass over each table's ids, per SparseCore, gives what the numpy reference in profiles/counting.py
 * (core_table_counts, hottest_per_table_steps, relabelled_stack_counts) and profiles/step_counts.py (the
 * valency histogram, the exact id counts) compute with several sorts each:
 *   - per (SparseCore, destination) cell, the ids after equal (sample, id) pairs of a feature are merged
 *     and the distinct ids (the core's `partition_counts` of the table laid out alone, rotation 0);
 *   - the same with every id i < len(perm) relabelled perm[i] (a balanced table counted in frequency order);
 *   - the lookups of the step's hottest id after that merge (the balance floor);
 *   - every raw lookup added to a dense per-id count;
 *   - per feature, how many examples hold k ids, for each k.
 *
 * Equal pairs and distinct ids are found with stamps in a scratch array of one slot per id (four uint32:
 * the last sample, SparseCore and step that saw the id, and its lookups this step), so nothing is sorted
 * and the scratch is never cleared between calls: every table takes fresh stamps from a counter kept in
 * the scratch's first slot, and the scratch is cleared only when the counter would wrap.
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

#define PREFETCH 16 /* ids ahead whose slot and count are prefetched: ids are scattered over a table */

typedef struct {
  const int64_t *rows, *ids;
  int64_t *made_rows; /* rows made from lengths (freed after the call), else NULL */
  const int64_t *lengths; /* ids per example, the rows made from them without the GIL; else NULL */
  Py_ssize_t num_lengths;
  int64_t sequence_length;
  Py_ssize_t table, index; /* the table and the feature's position in it (for the error) */
  Py_ssize_t n;
  int64_t samples_per_sc, samples_per_example, examples;
  int64_t *hist; /* hist_cap counts */
} Feature;

typedef struct {
  Py_ssize_t first_feature, num_features;
  int64_t vocab;
  int64_t *totals;      /* or NULL */
  const int64_t *perm;  /* or NULL */
  int64_t perm_n;
  int64_t hottest;
} Table;

/* Error codes of the counting (set without the GIL, raised after). */
enum { OK = 0, BAD_ID = 1, BAD_ROW = 2, UNSORTED = 3, BAD_LENGTHS = 4 };

typedef struct {
  int kind;
  Py_ssize_t table, feature, position;
  int64_t value;
} Error;

static int get(PyObject *o, Py_buffer *b, Py_ssize_t itemsize, int writable, const char *name) {
  if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
  if (b->len % itemsize) {
    PyErr_Format(PyExc_ValueError, "%s: buffer length is not a multiple of %zd", name, itemsize);
    PyBuffer_Release(b);
    return -1;
  }
  return 0;
}

/* One table: its cells (row `t` of the cell arrays), hottest id, id counts and its features' histograms. */
static void count_one(Table *tab, Feature *fs, Slot *slots, uint64_t *counter, int64_t S, int64_t num_scs,
                      int64_t *ic, int64_t *uc, int64_t *pic, int64_t *puc, int64_t hist_cap, char *overflow,
                      Error *err) {
  const Py_ssize_t F = tab->num_features;
  Feature *ft0 = fs + tab->first_feature;
  int64_t total_ids = 0;
  for (Py_ssize_t f = 0; f < F; f++) total_ids += ft0[f].n;
  /* Stamps this table may take: one per sample at most, one per SparseCore, one for the step. */
  if (*counter + (uint64_t)total_ids + (uint64_t)num_scs + 2 >= UINT32_MAX) {
    memset(slots, 0, (size_t)tab->vocab * sizeof(Slot));
    *counter = 0;
  }
  uint32_t stamp = (uint32_t)*counter;
  const uint32_t step = ++stamp;
  const int pow2 = (S & (S - 1)) == 0; /* always, for SparseCores: a mask instead of a division per id */
  const int64_t vocab = tab->vocab;
  int64_t *totals = tab->totals;
  const int64_t *perm = tab->perm;
  const int64_t perm_n = tab->perm_n;
  int64_t hottest = 0;
  Py_ssize_t pos_small[16];
  Py_ssize_t *pos = F <= 16 ? pos_small : calloc((size_t)F, sizeof(Py_ssize_t));
  if (!pos) { err->kind = -1; return; }
  memset(pos, 0, (size_t)(F <= 16 ? 16 : F) * sizeof(Py_ssize_t));
  for (int64_t sc = 0; sc < num_scs && err->kind == OK; sc++) {
    const uint32_t sc_stamp = ++stamp;
    int64_t *ic_sc = ic + sc * S, *uc_sc = uc + sc * S;
    for (Py_ssize_t f = 0; f < F && err->kind == OK; f++) {
      const Feature *ft = &ft0[f];
      const int64_t end_row = (sc + 1) * ft->samples_per_sc;
      Py_ssize_t i = pos[f];
      int64_t prev_row = -1;
      uint32_t sample = 0;
      for (; i < ft->n; i++) {
        const int64_t row = ft->rows[i];
        if (row >= end_row) break;
        const int64_t id = ft->ids[i];
        if (i + PREFETCH < ft->n) {
          const int64_t ahead = ft->ids[i + PREFETCH];
          if (ahead >= 0 && ahead < vocab) {
            __builtin_prefetch(&slots[ahead], 1);
            if (totals) __builtin_prefetch(&totals[ahead], 1);
          }
        }
        if (row < sc * ft->samples_per_sc || row < prev_row) {
          err->kind = row >= 0 && row < prev_row ? UNSORTED : BAD_ROW;
          err->feature = f; err->position = i; err->value = row;
          break;
        }
        if (id < 0 || id >= vocab) { err->kind = BAD_ID; err->feature = f; err->position = i; err->value = id; break; }
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
  for (Py_ssize_t f = 0; f < F && err->kind == OK; f++) {
    const Feature *ft = &ft0[f];
    if (pos[f] != ft->n) {
      err->kind = BAD_ROW; err->feature = f; err->position = pos[f]; err->value = ft->rows[pos[f]];
      break;
    }
    /* Valency: runs of equal examples (rows are sorted, so an example's rows are consecutive). */
    int64_t with_ids = 0;
    Py_ssize_t i = 0;
    const int64_t spe = ft->samples_per_example;
    while (i < ft->n) {
      Py_ssize_t j = i + 1;
      if (spe == 1) {
        while (j < ft->n && ft->rows[j] == ft->rows[i]) j++;
      } else {
        const int64_t ex = ft->rows[i] / spe;
        while (j < ft->n && ft->rows[j] / spe == ex) j++;
      }
      if (j - i >= hist_cap) { overflow[tab->first_feature + f] = 1; break; }
      ft->hist[j - i]++;
      with_ids++;
      i = j;
    }
    if (overflow[tab->first_feature + f]) memset(ft->hist, 0, (size_t)hist_cap * sizeof(int64_t));
    else ft->hist[0] = ft->examples - with_ids;
  }
  if (!perm && pic) { /* a table whose ids are not relabelled counts the same in frequency order */
    memcpy(pic, ic, (size_t)(num_scs * S) * sizeof(int64_t));
    memcpy(puc, uc, (size_t)(num_scs * S) * sizeof(int64_t));
  }
  if (pos != pos_small) free(pos);
  tab->hottest = hottest;
  *counter = stamp;
}

/* A feature given as ids per example: each id's row (example e's k-th id: row e, or e * sequence_length + k).
 * 0, or BAD_LENGTHS where the lengths do not add up to the ids. */
static int make_rows(Feature *ft) {
  const int64_t *len = ft->lengths, seq = ft->sequence_length;
  const Py_ssize_t E = ft->num_lengths, n = ft->n;
  int64_t *rows = ft->made_rows;
  Py_ssize_t i = 0;
  for (Py_ssize_t e = 0; e < E; e++) {
    if (len[e] < 0 || len[e] > n - i) return BAD_LENGTHS;
    if (seq > 0) {
      for (int64_t j = 0; j < len[e]; j++) rows[i++] = e * seq + j;
    } else {
      for (int64_t j = 0; j < len[e]; j++) rows[i++] = e;
    }
  }
  return i == n ? OK : BAD_LENGTHS;
}

/* count_step(tables, S, num_scs, scratch, ids_cells, uniq_cells, perm_ids_cells, perm_uniq_cells, hist, hist_cap)
 *   -> ([hottest of each table], [features whose histogram overflowed])
 *
 * tables: [(features, vocabulary_size, totals, perm)], each table's features
 *   [(rows int64, ids int64, samples_per_sc, samples_per_example, examples)]: rows non-decreasing global sample
 *   rows (SparseCore k holds rows [k * samples_per_sc, (k + 1) * samples_per_sc)), ids in [0, vocabulary_size);
 *   or [(lengths int64, ids int64, ..., examples, sequence_length)]: the ids per example, each id's row e
 *   (sequence_length 0) or e * sequence_length + k (its k-th id), as pipelines/sharding/batches.py's global rows.
 *   totals: int64 [vocabulary_size], every raw lookup added, or None.  perm: int64 frequency ids, or None.
 * scratch: uint32, at least 4 * (the largest vocabulary_size + 1), zeroed before its first use.
 * ids_cells, uniq_cells: int64 [tables, num_scs * S], zeros, written (table t's row t); perm_ids_cells,
 *   perm_uniq_cells: the same in frequency order (a table without perm: its own counts), or both None.
 * hist: int64 [features, hist_cap] (the features of all tables in order), written: examples with k ids; a feature
 *   with an example of hist_cap ids or more is left zero and listed (by its index in that order). */
static PyObject *count_step(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *tables, *o_scratch, *o_ic, *o_uc, *o_pic, *o_puc, *o_hist;
  long long S, num_scs, hist_cap;
  if (!PyArg_ParseTuple(args, "O!LLOOOOOOL", &PyList_Type, &tables, &S, &num_scs, &o_scratch, &o_ic, &o_uc,
                        &o_pic, &o_puc, &o_hist, &hist_cap))
    return NULL;
  if (S < 1 || num_scs < 1 || hist_cap < 1) {
    PyErr_SetString(PyExc_ValueError, "count_step: bad S, SparseCores or histogram size");
    return NULL;
  }
  const Py_ssize_t T = PyList_GET_SIZE(tables);
  Py_ssize_t F = 0;
  for (Py_ssize_t t = 0; t < T; t++) {
    PyObject *tt = PyList_GET_ITEM(tables, t);
    if (!PyTuple_Check(tt) || PyTuple_GET_SIZE(tt) != 4 || !PyList_Check(PyTuple_GET_ITEM(tt, 0))) {
      PyErr_SetString(PyExc_TypeError, "count_step: tables are (features list, vocabulary_size, totals, perm)");
      return NULL;
    }
    F += PyList_GET_SIZE(PyTuple_GET_ITEM(tt, 0));
  }
  enum { SCRATCH, IC, UC, PIC, PUC, HIST, NB };
  PyObject *objs[NB] = {o_scratch, o_ic, o_uc, o_pic, o_puc, o_hist};
  static const Py_ssize_t item[NB] = {4, 8, 8, 8, 8, 8};
  static const char *names[NB] = {"scratch", "ids_cells", "uniq_cells", "perm_ids_cells", "perm_uniq_cells", "hist"};
  Py_buffer b[NB];
  int held[NB] = {0};
  /* Per table: totals and perm; per feature: rows (or lengths) and ids. */
  Py_buffer *tb = PyMem_Calloc(2 * (T + 1), sizeof(Py_buffer));
  char *tbh = PyMem_Calloc(2 * (T + 1), 1);
  Py_buffer *fb = PyMem_Calloc(2 * (F + 1), sizeof(Py_buffer));
  char *fbh = PyMem_Calloc(2 * (F + 1), 1);
  Feature *fs = PyMem_Calloc(F + 1, sizeof(Feature));
  Table *ts = PyMem_Calloc(T + 1, sizeof(Table));
  char *overflow = PyMem_Calloc(F + 1, 1);
  PyObject *result = NULL;
  if (!tb || !tbh || !fb || !fbh || !fs || !ts || !overflow) { PyErr_NoMemory(); goto done; }
  for (int i = 0; i < NB; i++) {
    if (objs[i] == Py_None) {
      if (i != PIC && i != PUC) {
        PyErr_Format(PyExc_TypeError, "count_step: %s is required", names[i]);
        goto done;
      }
      continue;
    }
    if (get(objs[i], &b[i], item[i], 1, names[i]) < 0) goto done;
    held[i] = 1;
  }
  const int has_perm = held[PIC];
  const Py_ssize_t cells = (Py_ssize_t)(num_scs * S);
  if (held[PIC] != held[PUC] || b[IC].len / 8 != T * cells || b[UC].len / 8 != T * cells ||
      (has_perm && (b[PIC].len / 8 != T * cells || b[PUC].len / 8 != T * cells)) ||
      b[HIST].len / 8 != F * hist_cap) {
    PyErr_SetString(PyExc_ValueError, "count_step: a cell or histogram array has the wrong length");
    goto done;
  }
  int64_t max_vocab = 0;
  Py_ssize_t f = 0;
  for (Py_ssize_t t = 0; t < T; t++) {
    PyObject *tt = PyList_GET_ITEM(tables, t);
    PyObject *feats = PyTuple_GET_ITEM(tt, 0), *o_tot = PyTuple_GET_ITEM(tt, 2), *o_perm = PyTuple_GET_ITEM(tt, 3);
    long long vocab = PyLong_AsLongLong(PyTuple_GET_ITEM(tt, 1));
    if (vocab == -1 && PyErr_Occurred()) goto done;
    if (vocab < 1 || vocab > ((int64_t)1 << 40)) {
      PyErr_Format(PyExc_ValueError, "count_step: table %zd: bad vocabulary size %lld", t, vocab);
      goto done;
    }
    Table *tab = &ts[t];
    tab->vocab = vocab;
    if (vocab > max_vocab) max_vocab = vocab;
    if (o_tot != Py_None) {
      if (get(o_tot, &tb[2 * t], 8, 1, "totals") < 0) goto done;
      tbh[2 * t] = 1;
      if (tb[2 * t].len / 8 < vocab) {
        PyErr_Format(PyExc_ValueError, "count_step: table %zd: totals shorter than the vocabulary", t);
        goto done;
      }
      tab->totals = tb[2 * t].buf;
    }
    if (o_perm != Py_None) {
      if (!has_perm) {
        PyErr_SetString(PyExc_ValueError, "count_step: frequency ids without frequency-order cell arrays");
        goto done;
      }
      if (get(o_perm, &tb[2 * t + 1], 8, 0, "perm") < 0) goto done;
      tbh[2 * t + 1] = 1;
      tab->perm = tb[2 * t + 1].buf;
      tab->perm_n = tb[2 * t + 1].len / 8;
    }
    tab->first_feature = f;
    tab->num_features = PyList_GET_SIZE(feats);
    for (Py_ssize_t k = 0; k < tab->num_features; k++, f++) {
      PyObject *ftuple = PyList_GET_ITEM(feats, k);
      PyObject *r, *d;
      long long spsc, spe, examples, seq = -1;
      if (!PyTuple_Check(ftuple) || !PyArg_ParseTuple(ftuple, "OOLLL|L", &r, &d, &spsc, &spe, &examples, &seq)) {
        if (!PyErr_Occurred())
          PyErr_SetString(PyExc_TypeError, "count_step: features are (rows, ids, samples_per_sc, "
                                           "samples_per_example, examples[, sequence_length]) tuples");
        goto done;
      }
      if (get(r, &fb[2 * f], 8, 0, "rows") < 0) goto done;
      fbh[2 * f] = 1;
      if (get(d, &fb[2 * f + 1], 8, 0, "ids") < 0) goto done;
      fbh[2 * f + 1] = 1;
      const Py_ssize_t n = fb[2 * f + 1].len / 8;
      if ((seq < 0 && fb[2 * f].len != fb[2 * f + 1].len) || spsc < 1 || spe < 1 || examples < 0) {
        PyErr_SetString(PyExc_ValueError, "count_step: rows and ids differ in length, or a bad sample count");
        goto done;
      }
      Feature *ft = &fs[f];
      ft->ids = fb[2 * f + 1].buf;
      ft->n = n;
      ft->samples_per_sc = spsc;
      ft->samples_per_example = spe;
      ft->examples = examples;
      ft->hist = (int64_t *)b[HIST].buf + f * hist_cap;
      if (seq < 0) {
        ft->rows = fb[2 * f].buf;
        continue;
      }
      /* ids per example: each id's row is made without the GIL (`make_rows`) */
      int64_t *rows = malloc((size_t)(n + 1) * sizeof(int64_t));
      if (!rows) { PyErr_NoMemory(); goto done; }
      ft->made_rows = rows;
      ft->lengths = fb[2 * f].buf;
      ft->num_lengths = fb[2 * f].len / 8;
      ft->sequence_length = seq;
      ft->table = t;
      ft->index = k;
      ft->rows = rows;
    }
  }
  if (b[SCRATCH].len / 4 < 4 * (max_vocab + 1)) {
    PyErr_SetString(PyExc_ValueError, "count_step: the scratch is smaller than 4 x (the largest vocabulary + 1)");
    goto done;
  }

  Error err = {OK, 0, 0, 0, 0};
  Py_BEGIN_ALLOW_THREADS
  for (Py_ssize_t k = 0; k < F && err.kind == OK; k++) {
    if (fs[k].lengths && make_rows(&fs[k]) != OK) {
      err.kind = BAD_LENGTHS; err.table = fs[k].table; err.feature = fs[k].index; err.value = fs[k].n;
    }
  }
  Slot *slots = (Slot *)b[SCRATCH].buf + 1; /* slot 0 holds the stamp counter */
  uint64_t *counter = (uint64_t *)b[SCRATCH].buf;
  for (Py_ssize_t t = 0; t < T && err.kind == OK; t++) {
    err.table = t;
    count_one(&ts[t], fs, slots, counter, S, num_scs, (int64_t *)b[IC].buf + t * cells,
              (int64_t *)b[UC].buf + t * cells, has_perm ? (int64_t *)b[PIC].buf + t * cells : NULL,
              has_perm ? (int64_t *)b[PUC].buf + t * cells : NULL, hist_cap, overflow, &err);
  }
  Py_END_ALLOW_THREADS

  if (err.kind == -1) {
    PyErr_NoMemory();
  } else if (err.kind == BAD_LENGTHS) {
    PyErr_Format(PyExc_ValueError, "count_step: table %zd: the lengths of feature %zd do not add up to its %lld ids",
                 err.table, err.feature, (long long)err.value);
  } else if (err.kind == BAD_ID) {
    PyErr_Format(PyExc_ValueError, "count_step: table %zd, feature %zd: id %lld (position %zd) is outside [0, %lld)",
                 err.table, err.feature, (long long)err.value, err.position, (long long)ts[err.table].vocab);
  } else if (err.kind == BAD_ROW || err.kind == UNSORTED) {
    PyErr_Format(PyExc_ValueError, "count_step: table %zd, feature %zd: row %lld (position %zd) is %s", err.table,
                 err.feature, (long long)err.value, err.position,
                 err.kind == UNSORTED ? "out of order" : "outside its SparseCores' samples");
  } else {
    PyObject *hot = PyList_New(T), *over = PyList_New(0);
    if (hot && over) {
      for (Py_ssize_t t = 0; t < T; t++) {
        PyObject *h = PyLong_FromLongLong(ts[t].hottest);
        if (!h) { Py_CLEAR(hot); break; }
        PyList_SET_ITEM(hot, t, h);
      }
      for (Py_ssize_t k = 0; hot && k < F; k++) {
        if (!overflow[k]) continue;
        PyObject *n = PyLong_FromSsize_t(k);
        if (!n || PyList_Append(over, n) < 0) { Py_XDECREF(n); Py_CLEAR(over); break; }
        Py_DECREF(n);
      }
    }
    if (hot && over) result = PyTuple_Pack(2, hot, over);
    Py_XDECREF(hot);
    Py_XDECREF(over);
  }
done:
  for (int i = 0; i < NB; i++) if (held[i]) PyBuffer_Release(&b[i]);
  if (tb && tbh)
    for (Py_ssize_t i = 0; i < 2 * T; i++) if (tbh[i]) PyBuffer_Release(&tb[i]);
  if (fb && fbh)
    for (Py_ssize_t i = 0; i < 2 * F; i++) if (fbh[i]) PyBuffer_Release(&fb[i]);
  if (fs)
    for (Py_ssize_t i = 0; i < F; i++) free(fs[i].made_rows);
  PyMem_Free(tb); PyMem_Free(tbh); PyMem_Free(fb); PyMem_Free(fbh); PyMem_Free(fs); PyMem_Free(ts);
  PyMem_Free(overflow);
  return result;
}

static PyMethodDef methods[] = {
    {"count_step", count_step, METH_VARARGS,
     "One step's lookup statistics of every table: cells, frequency-order cells, hottest ids, id counts, valency."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_step_counts", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__step_counts(void) { return PyModule_Create(&module); }
