/* Native CSV framing scan: which line breaks of a byte range end a record, and the quote state at its end.
 *
 * The same rule as `pipelines.io._scan`'s numpy way (the reference; tests/test_splits.py checks the two
 * agree on random bytes, and the readers against a byte model of pyarrow's framing):
 *   - a quote character at the start of a field (after a delimiter, a line break, or at the file's
 *     first field `bof`) opens a quoted value; elsewhere outside a quoted value it is text;
 *   - inside a quoted value "" is a quote and a lone " closes it;
 *   - a line break is \n, or \r not followed by \n; it ends a record unless a quoted value is open.
 * The numpy way needs the positions of all quote characters (dozens per record when a writer quotes
 * every string, as pyarrow and pandas can); this is one pass over the bytes.
 *
 * Only the buffer protocol is used (no numpy headers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

enum { FIELD_START, FIELD, QUOTED, QUOTED_QUOTE };

/* quote_states(data, lo, hi, q, bof, delim, after, flags) -> quote state at hi (0 or 1)
 *
 * data: uint8 buffer; the range [lo, hi) is scanned with a quoted value open at lo iff q; data[lo - 1] is
 * the byte before lo (lo > 0). bof: index in data of the file's first field (-1 if not in data). delim: the
 * delimiter byte (-1: none). after: data[hi] as the file goes on (-1 at its end). flags: None, or a
 * writable uint8 buffer with one byte per line break in [lo, hi): 1 if it ends a record, else 0.
 */
static PyObject *quote_states(PyObject *self, PyObject *args) {
  Py_buffer data, flags;
  Py_ssize_t lo, hi, bof;
  int q, delim, after;
  PyObject *flags_obj;
  if (!PyArg_ParseTuple(args, "y*nniniiO", &data, &lo, &hi, &q, &bof, &delim, &after, &flags_obj)) return NULL;
  int have_flags = flags_obj != Py_None;
  if (have_flags && PyObject_GetBuffer(flags_obj, &flags, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
    PyBuffer_Release(&data);
    return NULL;
  }
  if (lo < 0 || hi > data.len || lo > hi) {
    PyErr_Format(PyExc_ValueError, "range [%zd, %zd) outside a buffer of %zd bytes", lo, hi, data.len);
    goto fail;
  }
  const uint8_t *b = (const uint8_t *)data.buf;
  uint8_t *out = have_flags ? (uint8_t *)flags.buf : NULL;
  Py_ssize_t nflags = have_flags ? flags.len : 0, k = 0;
  int state;
  if (q) {
    state = QUOTED;
  } else if (lo > 0) {
    uint8_t prev = b[lo - 1];
    state = (prev == '\n' || prev == '\r' || (delim >= 0 && prev == (uint8_t)delim)) ? FIELD_START : FIELD;
  } else {
    state = FIELD;
  }
  int lf_after_hi = after == '\n';
  for (Py_ssize_t p = lo; p < hi; p++) {
    uint8_t c = b[p];
    if (p == bof && (state == FIELD_START || state == FIELD)) state = FIELD_START;
    if (state == QUOTED) {
      if (c == '"') state = QUOTED_QUOTE;
      else if (c == '\n' || (c == '\r' && !(p + 1 < hi ? b[p + 1] == '\n' : lf_after_hi))) {
        if (out) {
          if (k >= nflags) goto too_many;
          out[k] = 0;
        }
        k++;
      }
      continue;
    }
    if (state == QUOTED_QUOTE) {
      if (c == '"') {
        state = QUOTED;
        continue;
      }
      state = FIELD;
    }
    if (c == '\n' || (c == '\r' && !(p + 1 < hi ? b[p + 1] == '\n' : lf_after_hi))) {
      if (out) {
        if (k >= nflags) goto too_many;
        out[k] = 1;
      }
      k++;
      state = FIELD_START;
    } else if (delim >= 0 && c == (uint8_t)delim) {
      state = FIELD_START;
    } else if (c == '"' && state == FIELD_START) {
      state = QUOTED;
    } else {
      state = FIELD;
    }
  }
  if (out && k != nflags) goto too_many;
  PyBuffer_Release(&data);
  if (have_flags) PyBuffer_Release(&flags);
  return PyLong_FromLong(state == QUOTED);
too_many:
  PyErr_Format(PyExc_ValueError, "flags has %zd entries; the range has a different number of line breaks", nflags);
fail:
  PyBuffer_Release(&data);
  if (have_flags) PyBuffer_Release(&flags);
  return NULL;
}

static PyMethodDef methods[] = {
    {"quote_states", quote_states, METH_VARARGS,
     "Which line breaks of data[lo:hi] end a CSV record, and the quote state at hi."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_csv_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__csv_native(void) { return PyModule_Create(&module); }
