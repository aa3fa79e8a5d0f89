/* Native CSV framing scan: which line breaks of a byte range end a record, and the quote state at its end.
 *
 * The same rule as `pipelines.read.csv_scan._scan`'s numpy way (the reference; tests/test_splits.py checks the two
 * agree on random bytes, and the readers against a byte model of pyarrow's framing):
 *   - a quote character at the start of a field (after a delimiter, a line break, or at the file's
 *     first field `bof`) opens a quoted value; elsewhere outside a quoted value it is text;
 *   - inside a quoted value "" is a quote and a lone " closes it;
 *   - a line break is \n, or \r not followed by \n; it ends a record unless a quoted value is open.
 * The numpy way needs the positions of all quote characters (dozens per record when a writer quotes
 * every string, as pyarrow and pandas can); this is one pass over the bytes: a branch-free parity count
 * where the range allows it (`parity_scan`, for both start states at once), else the state machine.
 *
 * The module also holds the readers' other native helpers: `tfrecord_frames` (TFRecord framing and CRC32C
 * checks, the fast path of pipelines.read.tfrecord_reader), `is_ascii` and `room_after`.
 *
 * Only the buffer protocol is used (no numpy headers).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "token_table.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

enum { FIELD_START, FIELD, QUOTED, QUOTED_QUOTE };

/* Bit i of x, xor-ed with every bit below it: the parity of the set bits up to and including i. */
static inline uint64_t prefix_xor(uint64_t x) {
  x ^= x << 1;
  x ^= x << 2;
  x ^= x << 4;
  x ^= x << 8;
  x ^= x << 16;
  x ^= x << 32;
  return x;
}

/* For b[0..63]: bit i set where b[i] is a quote / a \n / a byte after which a quote opens a value (a \n,
 * the delimiter or a quote). SSE2 (every x86-64) where available, else byte by byte. */
static inline void block_masks(const uint8_t *b, int delim, uint64_t *quote, uint64_t *brk, uint64_t *opener) {
  uint64_t q = 0, n = 0, d = 0;
#if defined(__SSE2__)
  const __m128i vq = _mm_set1_epi8('"'), vn = _mm_set1_epi8('\n'), vd = _mm_set1_epi8((char)delim);
  for (int j = 0; j < 4; j++) {
    __m128i x = _mm_loadu_si128((const __m128i *)(b + 16 * j));
    q |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(x, vq)) << (16 * j);
    n |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(x, vn)) << (16 * j);
    d |= (uint64_t)(uint32_t)_mm_movemask_epi8(_mm_cmpeq_epi8(x, vd)) << (16 * j);
  }
  if (delim < 0) d = 0;
#else
  for (int i = 0; i < 64; i++) {
    q |= (uint64_t)(b[i] == '"') << i;
    n |= (uint64_t)(b[i] == '\n') << i;
    d |= (uint64_t)(delim >= 0 && b[i] == (uint8_t)delim) << i;
  }
#endif
  *quote = q;
  *brk = n;
  *opener = q | n | d;
}

/* The fast way, for ranges with no \r, no file start and no quote character inside an unquoted value
 * (what CSV writers produce): the quote state is then the parity of the quote characters before a byte,
 * since every quote met outside a quoted value opens one. The loop has one branch per line break, none
 * per quote (the state machine below mispredicts on most quotes of a file whose strings are all quoted).
 * The other start state's parity is this one's flipped, so one pass checks both: *other_ok says whether
 * the range is such a range had it started with 1 - q.
 * Returns the state at hi for q (for 1 - q: flipped), with *ok / *other_ok 0 when the range is not such
 * a range for q / 1 - q (or has more than nflags line breaks): the caller then runs the state machine,
 * which decides every case.
 */
static int parity_scan(const uint8_t *b, Py_ssize_t lo, Py_ssize_t hi, int q, int delim, uint8_t *out,
                       Py_ssize_t nflags, Py_ssize_t *nbreaks, int *ok, int *other_ok) {
  *ok = *other_ok = 0;
  if (lo >= hi) {
    *nbreaks = 0;
    *ok = *other_ok = 1;
    return q;
  }
  /* A quote opening a value must follow a delimiter or a line break; inside the range also a quote
   * (the second of a pair "" in a quoted value: it met parity 0 only because the first one closed). */
  uint8_t opens_after[256] = {0};
  opens_after['\n'] = 1;
  if (delim >= 0) opens_after[(uint8_t)delim] = 1;
  unsigned par = (unsigned)q, bad0 = 0, bad1 = 0;  /* bad0 / bad1: a stray quote at parity 0 / 1 */
  Py_ssize_t k = 0;
  /* The byte before p opens a value: a quote may follow it. Before lo also a \r; not a quote there (a
   * run of quotes is never cut at lo, so a quote at lo after one is not the second of a pair). */
  uint64_t prev_open = lo > 0 && (opens_after[b[lo - 1]] || b[lo - 1] == '\r');
  opens_after['"'] = 1;
  if (memchr(b + lo, '\r', (size_t)(hi - lo))) return -1;
  /* 64-byte blocks as bit masks, then the last bytes one by one. */
  Py_ssize_t p = lo;
  for (; p + 64 <= hi; p += 64) {
    uint64_t quote, brk, opener;
    block_masks(b + p, delim, &quote, &brk, &opener);
    uint64_t stray = quote & ~((opener << 1) | prev_open);  /* a quote not after a delimiter, break or quote */
    uint64_t after = prefix_xor(quote) ^ (par ? ~(uint64_t)0 : 0);  /* parity through each byte */
    uint64_t before = after ^ quote;  /* parity before each byte */
    bad0 |= (stray & ~before) != 0;
    bad1 |= (stray & before) != 0;
    if (brk) {
      Py_ssize_t n = (Py_ssize_t)__builtin_popcountll(brk);
      if (k + n > nflags) return -1;
      if (out) {
        for (uint64_t m = brk; m; m &= m - 1) out[k++] = (uint8_t)(((after >> __builtin_ctzll(m)) & 1) == 0);
      } else {
        k += n;
      }
      if (bad0 & bad1) return -1;  /* neither start can pass: stop early */
    }
    par = (unsigned)(after >> 63);
    prev_open = opener >> 63;
  }
  for (; p < hi; p++) {
    uint8_t c = b[p];
    unsigned stray = (c == '"') & !prev_open;
    bad0 |= stray & (par ^ 1);
    bad1 |= stray & par;
    par ^= c == '"';
    if (c == '\n') {
      if (k >= nflags) return -1;
      if (out) out[k] = (uint8_t)(par == 0);
      k++;
      if (bad0 & bad1) return -1;
    }
    prev_open = opens_after[c];
  }
  *nbreaks = k;
  /* par starts at q, so parity 0 is outside a quoted value for this start and inside one for the other. */
  *ok = !bad0;
  *other_ok = !bad1;
  return (int)par;
}

/* The state machine: every case. Returns the state at hi (0 or 1), or -1 when the range has more line
 * breaks than out has entries (out: NULL, or nflags entries, 1 where a line break ends a record).
 *
 * other_end >= 0 (then out is NULL): the other start state, 1 - q, passed the parity scan and ends in
 * other_end. The machine then stops where the two starts agree, a line break ending a record for both
 * (both machines are then at a field start and go on alike), and returns other_end. A range that starts
 * inside a quoted value read as outside (the split summaries' usual case) meets such a break within a
 * record or two.
 */
static int machine_scan(const uint8_t *b, Py_ssize_t lo, Py_ssize_t hi, int q, Py_ssize_t bof, int delim, int after,
                        uint8_t *out, Py_ssize_t nflags, Py_ssize_t *nbreaks, int other_end) {
  Py_ssize_t k = 0;
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
  unsigned other_par = (unsigned)(1 - q);  /* with other_end: the other start's state, its parity */
  for (Py_ssize_t p = lo; p < hi; p++) {
    uint8_t c = b[p];
    other_par ^= c == '"';
    if (p == bof && (state == FIELD_START || state == FIELD)) state = FIELD_START;
    if (state == QUOTED) {
      if (c == '"') state = QUOTED_QUOTE;
      else if (c == '\n' || (c == '\r' && !(p + 1 < hi ? b[p + 1] == '\n' : lf_after_hi))) {
        if (out) {
          if (k >= nflags) return -1;
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
      if (other_end >= 0 && !other_par) return other_end;  /* both end a record here */
      if (out) {
        if (k >= nflags) return -1;
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
  *nbreaks = k;
  return state == QUOTED;
}

/* quote_states(data, lo, hi, q, bof, delim, after, flags, both=False) -> quote state at hi (0 or 1), or with
 * both the pair (state at hi for q at lo, state at hi for 1 - q at lo)
 *
 * data: uint8 buffer; the range [lo, hi) is scanned with a quoted value open at lo iff q; data[lo - 1] is
 * the byte before lo (lo > 0). bof: index in data of the file's first field (-1 if not in data). delim: the
 * delimiter byte (-1: none). after: data[hi] as the file goes on (-1 at its end). flags: None, or a
 * writable uint8 buffer with one byte per line break in [lo, hi): 1 if it ends a record (for q), else 0.
 */
static PyObject *quote_states(PyObject *self, PyObject *args) {
  Py_buffer data, flags;
  Py_ssize_t lo, hi, bof;
  int q, delim, after, both = 0;
  PyObject *flags_obj, *result = NULL;
  if (!PyArg_ParseTuple(args, "y*nniniiO|p", &data, &lo, &hi, &q, &bof, &delim, &after, &flags_obj, &both))
    return NULL;
  int have_flags = flags_obj != Py_None;
  if (have_flags && PyObject_GetBuffer(flags_obj, &flags, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
    PyBuffer_Release(&data);
    return NULL;
  }
  if (lo < 0 || hi > data.len || lo > hi) {
    PyErr_Format(PyExc_ValueError, "range [%zd, %zd) outside a buffer of %zd bytes", lo, hi, data.len);
    goto done;
  }
  const uint8_t *b = (const uint8_t *)data.buf;
  uint8_t *out = have_flags ? (uint8_t *)flags.buf : NULL;
  Py_ssize_t nflags = have_flags ? flags.len : PY_SSIZE_T_MAX, nbreaks = -1;
  int end = -1, other = -1;
  /* Without the GIL: the reader's framing thread scans while other threads split and count. */
  Py_BEGIN_ALLOW_THREADS
  if (!(lo <= bof && bof < hi)) {
    int ok, other_ok;
    int par = parity_scan(b, lo, hi, q, delim, out, nflags, &nbreaks, &ok, &other_ok);
    if (ok) end = par;
    if (other_ok) other = par ^ 1;
    Py_ssize_t unused;
    if (!ok && other_ok && !have_flags) end = machine_scan(b, lo, hi, q, bof, delim, after, NULL, 0, &unused, other);
    if (ok && !other_ok && both) other = machine_scan(b, lo, hi, 1 - q, bof, delim, after, NULL, 0, &unused, end);
  }
  if (end < 0) end = machine_scan(b, lo, hi, q, bof, delim, after, out, nflags, &nbreaks, -1);
  if (end >= 0 && !(have_flags && nbreaks != nflags) && both && other < 0) {
    Py_ssize_t unused;
    other = machine_scan(b, lo, hi, 1 - q, bof, delim, after, NULL, 0, &unused, -1);
  }
  Py_END_ALLOW_THREADS
  if (end < 0 || (have_flags && nbreaks != nflags)) {
    PyErr_Format(PyExc_ValueError, "flags has %zd entries; the range has a different number of line breaks",
                 nflags);
    goto done;
  }
  if (!both) {
    result = PyLong_FromLong(end);
    goto done;
  }
  result = Py_BuildValue("(ii)", end, other);
done:
  PyBuffer_Release(&data);
  if (have_flags) PyBuffer_Release(&flags);
  return result;
}

/* line_breaks(data, lo, hi, after) -> bytes: the offsets from lo (int64, native order) of the line breaks of
 * data[lo:hi]: every \n, and every \r not followed by \n (after: data[hi] as the file goes on, -1 at its end).
 * The numpy way (`pipelines.read.csv_scan._scan`) compares every byte twice and allocates two masks; this is memchr. */
static PyObject *line_breaks(PyObject *self, PyObject *args) {
  Py_buffer data;
  Py_ssize_t lo, hi;
  int after;
  if (!PyArg_ParseTuple(args, "y*nni", &data, &lo, &hi, &after)) return NULL;
  PyObject *result = NULL;
  int64_t *pos = NULL;
  if (lo < 0 || hi > data.len || lo > hi) {
    PyErr_Format(PyExc_ValueError, "range [%zd, %zd) outside a buffer of %zd bytes", lo, hi, data.len);
    goto done;
  }
  const uint8_t *b = (const uint8_t *)data.buf;
  Py_ssize_t cap = 1024, k = 0;
  int nomem = 0;
  pos = (int64_t *)malloc((size_t)cap * sizeof(int64_t));  /* no PyMem_*: filled without the GIL */
  if (!pos) {
    PyErr_NoMemory();
    goto done;
  }
  Py_BEGIN_ALLOW_THREADS
  int cr = memchr(b + lo, '\r', (size_t)(hi - lo)) != NULL;
  for (Py_ssize_t p = lo; p < hi;) {
    const uint8_t *hit;
    if (cr) {
      hit = b + p;
      while (hit < b + hi && *hit != '\n' && *hit != '\r') hit++;
      if (hit == b + hi) break;
    } else {
      hit = (const uint8_t *)memchr(b + p, '\n', (size_t)(hi - p));
      if (!hit) break;
    }
    Py_ssize_t at = hit - b;
    p = at + 1;
    if (*hit == '\r' && (at + 1 < hi ? b[at + 1] == '\n' : after == '\n')) continue;  /* \r\n: the \n breaks */
    if (k == cap) {
      cap *= 2;
      int64_t *grown = (int64_t *)realloc(pos, (size_t)cap * sizeof(int64_t));
      if (!grown) {
        nomem = 1;
        break;
      }
      pos = grown;
    }
    pos[k++] = (int64_t)(at - lo);
  }
  Py_END_ALLOW_THREADS
  if (nomem) {
    PyErr_NoMemory();
    goto done;
  }
  result = PyBytes_FromStringAndSize((const char *)pos, (Py_ssize_t)(k * (Py_ssize_t)sizeof(int64_t)));
done:
  free(pos);
  PyBuffer_Release(&data);
  return result;
}

/* plain_decimals(offsets, data, offset, n) -> (float64 bytes [n], uint8 bytes [n]: 1 where blank), or None
 *
 * The values of a large_string array (offsets: its int64 offsets buffer, data: its bytes, offset: the array's
 * offset) when every one is blank ("") or a plain decimal integer [+-]?[0-9]{1,15}: below 2^53, so the
 * double is exact and equals what any correct parser gives (pyarrow's cast, Python's float). Anything else
 * (a point, an exponent, white space, more digits) returns None at once: the caller's general way decides.
 * Dense Criteo-like columns are such integers; the general way makes five Arrow passes per column. */
static PyObject *plain_decimals(PyObject *self, PyObject *args) {
  Py_buffer offs, data;
  Py_ssize_t offset, n;
  if (!PyArg_ParseTuple(args, "y*y*nn", &offs, &data, &offset, &n)) return NULL;
  PyObject *values = NULL, *blank = NULL, *result = NULL;
  if (offset < 0 || n < 0 || (offset + n + 1) * (Py_ssize_t)sizeof(int64_t) > offs.len) {
    PyErr_SetString(PyExc_ValueError, "offsets buffer too short for the array");
    goto done;
  }
  const int64_t *o = (const int64_t *)offs.buf + offset;
  const uint8_t *d = (const uint8_t *)data.buf;
  if (n && (o[0] < 0 || o[n] > data.len)) {
    PyErr_SetString(PyExc_ValueError, "offsets outside the data buffer");
    goto done;
  }
  values = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(double));
  blank = PyBytes_FromStringAndSize(NULL, n);
  if (!values || !blank) goto done;
  double *out = (double *)PyBytes_AS_STRING(values);
  uint8_t *bl = (uint8_t *)PyBytes_AS_STRING(blank);
  int plain = 1;
  Py_BEGIN_ALLOW_THREADS  /* the new bytes objects are this call's alone until it returns */
  for (Py_ssize_t i = 0; i < n && plain; i++) {
    int64_t a = o[i], b = o[i + 1];
    if (b < a) {
      plain = 0;
      break;
    }
    bl[i] = a == b;
    if (a == b) {
      out[i] = 0.0;
      continue;
    }
    int neg = d[a] == '-';
    if (d[a] == '-' || d[a] == '+') a++;
    if (a == b || b - a > 15) {
      plain = 0;
      break;
    }
    uint64_t u = 0;
    for (int64_t p = a; p < b; p++) {
      unsigned digit = (unsigned)d[p] - '0';
      if (digit > 9) {
        plain = 0;
        break;
      }
      u = u * 10 + digit;
    }
    out[i] = neg ? -(double)u : (double)u;
  }
  Py_END_ALLOW_THREADS
  result = plain ? PyTuple_Pack(2, values, blank) : Py_NewRef(Py_None);
done:
  Py_XDECREF(values);
  Py_XDECREF(blank);
  PyBuffer_Release(&offs);
  PyBuffer_Release(&data);
  return result;
}


/* room_after(data, extra) -> bytearray of len(data) + extra bytes: data's bytes, then `extra` bytes left as
 * they are (the caller fills them: the CSV scanner's next read). Python's bytearray(n) zero-fills, and a
 * slice assignment copies, with the GIL held; here the copy runs without it and nothing is zero-filled. */
static PyObject *room_after(PyObject *self, PyObject *args) {
  Py_buffer data;
  Py_ssize_t extra;
  if (!PyArg_ParseTuple(args, "y*n", &data, &extra)) return NULL;
  PyObject *out = NULL;
  if (extra < 0 || data.len > PY_SSIZE_T_MAX - extra) {
    PyErr_SetString(PyExc_ValueError, "room_after: extra must be >= 0");
    goto done;
  }
  out = PyByteArray_FromStringAndSize(NULL, data.len + extra);
  if (!out) goto done;
  char *dst = PyByteArray_AS_STRING(out);
  Py_BEGIN_ALLOW_THREADS  /* the new bytearray is this call's alone until it returns */
  memcpy(dst, data.buf, (size_t)data.len);
  Py_END_ALLOW_THREADS
done:
  PyBuffer_Release(&data);
  return out;
}


/* CRC32C (Castagnoli), as TFRecord frames carry it (masked): the SSE4.2 instruction where the CPU has it,
 * else a table, byte by byte. */
static uint32_t crc_table[256];
static int crc_hw;

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    crc_table[i] = c;
  }
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(const uint8_t *p, size_t n) {
  uint64_t c = 0xFFFFFFFFu;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    c = __builtin_ia32_crc32di(c, w);
  }
  uint32_t c32 = (uint32_t)c;
  for (; n; p++, n--) c32 = __builtin_ia32_crc32qi(c32, *p);
  return c32 ^ 0xFFFFFFFFu;
}
#endif

static uint32_t crc32c(const uint8_t *p, size_t n) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (crc_hw) return crc32c_hw(p, n);
#endif
  uint32_t c = 0xFFFFFFFFu;
  for (; n; p++, n--) c = crc_table[(c ^ *p) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

static uint32_t masked_crc32c(const uint8_t *p, size_t n) {
  uint32_t c = crc32c(p, n);
  return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

static uint64_t load_u64(const uint8_t *p) {
  uint64_t v = 0;
  for (int k = 7; k >= 0; k--) v = (v << 8) | p[k];  /* little-endian, whatever the host */
  return v;
}

static uint32_t load_u32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* tfrecord_frames(data, pos, most) -> (payloads, end, bad)
 *
 * The TFRecord frames of data from offset pos on (uint64 length | uint32 masked CRC32C of the length bytes |
 * payload | uint32 masked CRC32C of the payload, little-endian), each frame's two CRCs checked, up to `most`
 * of them: a list of the payloads (bytes), the offset after the last one, and bad = 1 when the frame at `end`
 * is whole in data but a CRC does not match (else 0: `most` frames were read, or the frame at `end` is not
 * whole in data: the caller reads on, or at the end of the file decides). The checks run without the GIL;
 * the caller's careful way (`tpu_embed.artifact.tfrecord.scan_frames`) takes over at a bad frame. */
static PyObject *tfrecord_frames(PyObject *self, PyObject *args) {
  Py_buffer data;
  Py_ssize_t pos, most;
  if (!PyArg_ParseTuple(args, "y*nn", &data, &pos, &most)) return NULL;
  PyObject *result = NULL, *list = NULL;
  int64_t *at = NULL;
  if (pos < 0 || pos > data.len || most < 0) {
    PyErr_SetString(PyExc_ValueError, "tfrecord_frames: pos must be inside data, most >= 0");
    goto done;
  }
  at = malloc((size_t)(most ? most : 1) * 2 * sizeof(int64_t));  /* (payload offset, length) per frame */
  if (!at) {
    PyErr_NoMemory();
    goto done;
  }
  const uint8_t *b = (const uint8_t *)data.buf;
  Py_ssize_t n = data.len, p = pos, k = 0;
  int bad = 0;
  Py_BEGIN_ALLOW_THREADS
  while (k < most && n - p >= 12) {
    uint64_t len = load_u64(b + p);
    if (masked_crc32c(b + p, 8) != load_u32(b + p + 8)) {
      bad = 1;
      break;
    }
    if (n - p < 16 || len > (uint64_t)(n - p - 16)) break;  /* not whole in data (or longer than any buffer) */
    if (masked_crc32c(b + p + 12, (size_t)len) != load_u32(b + p + 12 + len)) {
      bad = 1;
      break;
    }
    at[2 * k] = p + 12;
    at[2 * k + 1] = (int64_t)len;
    k++;
    p += 16 + (Py_ssize_t)len;
  }
  Py_END_ALLOW_THREADS
  list = PyList_New(k);
  if (!list) goto done;
  for (Py_ssize_t i = 0; i < k; i++) {
    PyObject *payload = PyBytes_FromStringAndSize((const char *)b + at[2 * i], (Py_ssize_t)at[2 * i + 1]);
    if (!payload) goto done;
    PyList_SET_ITEM(list, i, payload);
  }
  result = Py_BuildValue("(Oni)", list, p, bad);
done:
  Py_XDECREF(list);
  free(at);
  PyBuffer_Release(&data);
  return result;
}


/* is_ascii(data) -> bool: every byte below 0x80 (bytes.isascii for any buffer), without the GIL. */
static PyObject *is_ascii(PyObject *self, PyObject *args) {
  Py_buffer data;
  if (!PyArg_ParseTuple(args, "y*", &data)) return NULL;
  const uint8_t *b = (const uint8_t *)data.buf;
  Py_ssize_t n = data.len, i = 0;
  uint64_t high = 0;
  Py_BEGIN_ALLOW_THREADS
  for (; i + 64 <= n && !high; i += 64) {
    uint64_t w[8];
    memcpy(w, b + i, 64);
    high = (w[0] | w[1] | w[2] | w[3] | w[4] | w[5] | w[6] | w[7]) & 0x8080808080808080ULL;
  }
  for (; i < n && !high; i++) high = b[i] & 0x80;
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&data);
  return PyBool_FromLong(!high);
}


/* A growable byte buffer of one output column. */
typedef struct {
  uint8_t *data;
  Py_ssize_t used, cap;
} column_bytes;

static int column_put(column_bytes *c, const uint8_t *p, Py_ssize_t n) {
  if (c->used + n > c->cap) {
    Py_ssize_t cap = c->cap ? c->cap : 4096;
    while (cap < c->used + n) cap *= 2;
    uint8_t *grown = realloc(c->data, (size_t)cap);  /* no PyMem_*: called without the GIL */
    if (!grown) return -1;
    c->data = grown;
    c->cap = cap;
  }
  memcpy(c->data + c->used, p, (size_t)n);
  c->used += n;
  return 0;
}



/* A dictionary-encoded output column: the distinct tokens in first-seen order (offsets + bytes, and their
 * hashes for growing the table), a token_table.h table over them and one int32 code per token. `split`
 * 0..255: a value's tokens are the non-empty runs between those bytes; 256: a non-empty value is one
 * token. Blank tokens are no token (the parser's "no value"). */
typedef struct {
  int split;
  token_slot *slots;
  uint64_t nslots;
  uint64_t *hashes;
  int64_t *doff, m, mcap;
  column_bytes ddata;
  int32_t *codes;
  int64_t ncodes, ccap;
} enc_column;

static int enc_rehash(enc_column *e) {
  uint64_t n = e->nslots ? e->nslots * 2 : 1024, mask = n - 1;
  token_slot *slots = calloc((size_t)n, sizeof(token_slot));
  if (!slots) return -1;
  for (int64_t i = 0; i < e->m; i++) {
    uint64_t s = e->hashes[i] & mask;
    while (slots[s].pos1) s = (s + 1) & mask;
    token_slot_set_in(&slots[s], e->ddata.data + e->doff[i], e->doff[i + 1] - e->doff[i],
                      e->ddata.data + e->ddata.cap, e->hashes[i], i);
  }
  free(e->slots);
  e->slots = slots;
  e->nslots = n;
  return 0;
}

static int enc_add(enc_column *e, const uint8_t *p, int64_t n, const uint8_t *end, uint64_t h) {
  if ((uint64_t)(e->m + 1) * 2 > e->nslots && enc_rehash(e) < 0) return -1;
  uint64_t s = 0;
  int64_t i = token_probe_in(e->slots, e->nslots - 1, e->doff, e->ddata.data, p, n, end, h, &s);
  if (i < 0) {
    if (e->m + 2 > e->mcap) {
      int64_t cap = e->mcap * 2;
      int64_t *doff = realloc(e->doff, (size_t)cap * sizeof(int64_t));
      if (doff) e->doff = doff;
      uint64_t *hashes = realloc(e->hashes, (size_t)cap * sizeof(uint64_t));
      if (hashes) e->hashes = hashes;
      if (!doff || !hashes) return -1;
      e->mcap = cap;
    }
    if (column_put(&e->ddata, p, n) < 0) return -1;
    e->hashes[e->m] = h;
    e->doff[e->m + 1] = e->ddata.used;
    token_slot_set_in(&e->slots[s], p, n, end, h, e->m);
    i = e->m++;
  }
  if (e->ncodes == e->ccap) {
    int64_t cap = e->ccap ? e->ccap * 2 : 4096;
    int32_t *codes = realloc(e->codes, (size_t)cap * sizeof(int32_t));
    if (!codes) return -1;
    e->codes = codes;
    e->ccap = cap;
  }
  e->codes[e->ncodes++] = (int32_t)i;
  return 0;
}

/* Where a field's value lies in the batch's bytes: [s, e) from its start. */
typedef struct {
  uint32_t s, e;
} field_span;

/* plain_fields splits ENC_BLOCK records (tens of kilobytes: in the cache still), then encodes their values
 * column by column. */
#define ENC_BLOCK 256

/* A column's tokens are hashed (their slots asked for) a batch of ENC_TOKENS at a time, then probed in order:
 * a probe of a table larger than the cache misses it, and asked for ahead the misses overlap. The values of
 * a block of records are encoded column by column (`enc_column_values`), so each table stays in the cache
 * between its tokens (a Criteo row's 26 tables in turn did not). */
#define ENC_TOKENS 256

typedef struct {
  const uint8_t *p;
  int64_t n;
  uint64_t h;
} enc_token;

typedef struct {
  enc_column *e;
  const uint8_t *end;  /* the end of the bytes the tokens are in */
  enc_token t[ENC_TOKENS];
  int n;
} enc_tokens;

static int enc_probe_all(enc_tokens *q) {
  for (int i = 0; i < q->n; i++)
    if (enc_add(q->e, q->t[i].p, q->t[i].n, q->end, q->t[i].h) < 0) return -1;
  q->n = 0;
  return 0;
}

static inline int enc_push(enc_tokens *q, const uint8_t *p, int64_t n) {
  if (q->n == ENC_TOKENS && enc_probe_all(q) < 0) return -1;
  uint64_t h = hash_bytes_in(p, n, q->end);
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(&q->e->slots[h & (q->e->nslots - 1)]);
#endif
  q->t[q->n++] = (enc_token){p, n, h};
  return 0;
}

/* Encodes the values b[spans[r].s, spans[r].e) of records r = 0..nrec-1 in order, their tokens as `split`
 * says (see enc_column); offs[r + 1]: offs[0] + the tokens of records 0..r. Returns -1 when out of memory. */
static int enc_column_values(enc_column *e, const uint8_t *b, const uint8_t *end, const field_span *spans,
                             Py_ssize_t nrec, int64_t *offs, enc_tokens *q) {
  q->e = e;
  q->end = end;
  q->n = 0;
  int64_t ntok = offs[0];
  for (Py_ssize_t r = 0; r < nrec; r++) {
    const uint8_t *s = b + spans[r].s, *v = b + spans[r].e;
    if (e->split > 255) {
      if (s < v) {
        if (enc_push(q, s, v - s) < 0) return -1;
        ntok++;
      }
    } else {
      const uint8_t *t = s;
      for (const uint8_t *c = s;; c++) {
        if (c == v || *c == (uint8_t)e->split) {
          if (c > t) {
            if (enc_push(q, t, c - t) < 0) return -1;
            ntok++;
          }
          if (c == v) break;
          t = c + 1;
        }
      }
    }
    offs[r + 1] = ntok;
  }
  return enc_probe_all(q);
}

static void enc_free(enc_column *e) {
  free(e->slots);
  free(e->hashes);
  free(e->doff);
  free(e->ddata.data);
  free(e->codes);
}

/* The first byte from p (before end) that `table` marks, or end; 16 bytes at a time where SSE2 is. The
 * marked bytes are `a`, `b`, `c` and `d` (repeats allowed), the same as the table's. */
static inline const uint8_t *find_marked(const uint8_t *p, const uint8_t *end, const uint8_t *table, uint8_t a,
                                         uint8_t b, uint8_t c, uint8_t d) {
#if defined(__SSE2__)
  const __m128i va = _mm_set1_epi8((char)a), vb = _mm_set1_epi8((char)b), vc = _mm_set1_epi8((char)c),
                vd = _mm_set1_epi8((char)d);
  while (end - p >= 16) {
    __m128i x = _mm_loadu_si128((const __m128i *)p);
    __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, va), _mm_cmpeq_epi8(x, vb)),
                             _mm_or_si128(_mm_cmpeq_epi8(x, vc), _mm_cmpeq_epi8(x, vd)));
    int bits = _mm_movemask_epi8(m);
    if (bits) return p + __builtin_ctz((unsigned)bits);
    p += 16;
  }
#else
  (void)a, (void)b, (void)c, (void)d;
#endif
  while (p < end && !table[*p]) p++;
  return p;
}

/* plain_fields(data, nfields, delim, want, nrec) -> [(int64 offsets bytes [nrec + 1], value bytes)] per output
 * column, or None
 *
 * The columns of `nrec` CSV records of `nfields` fields when the bytes need no parser's judgement: no \r
 * anywhere, each record one line ended by \n (the last one by \n or the end), no empty line, every record
 * exactly `nfields` fields split at the one-byte `delim`, a quote character only around a whole value
 * ("abc", as pyarrow and pandas write every string) with none inside it. Then a field's value is its bytes
 * (a quoted one's without the quotes), as pyarrow's reader gives it (strings_can_be_null and
 * quoted_strings_can_be_null False: "" stays ""), and this one pass replaces
 * the reader (500 k Criteo-like rows, 170 MB: 0.62 s with pyarrow's reader, 0.38-0.40 s here, one core,
 * benchmarks/read_parse.py). `want` (int32 [nfields]) gives each
 * field's output column, or -1 to skip it. Anything else returns None at once: the caller's pyarrow way
 * decides, malformed records and their letters included.
 *
 * `split` (optional, int32 per output column): -1 keeps a column's bytes as above; 0..255 or 256 gives it
 * dictionary-encoded instead (see enc_column: the tokens between that byte, or whole values; blank
 * tokens dropped), as (int64 token offsets per record [nrec + 1], int32 codes, int64 dictionary offsets,
 * dictionary bytes): the parser's `drop_empty(dictionary_encode(tokens))` of the same values, made
 * here without the GIL. */
static PyObject *plain_fields(PyObject *self, PyObject *args) {
  Py_buffer data, want, split;
  Py_ssize_t nfields, nrec;
  int delim;
  split.buf = NULL;
  split.len = 0;
  split.obj = NULL;
  if (!PyArg_ParseTuple(args, "y*niy*n|y*", &data, &nfields, &delim, &want, &nrec, &split)) return NULL;
  PyObject *result = NULL;
  column_bytes *cols = NULL;
  enc_column *encs = NULL;
  int64_t **offs = NULL;
  PyObject **offs_obj = NULL;
  field_span **spans = NULL;
  Py_ssize_t nout = 0;
  const int32_t *w = (const int32_t *)want.buf;
  if (nfields < 1 || want.len != nfields * (Py_ssize_t)sizeof(int32_t) || nrec < 0 || delim < 0 || delim > 255 ||
      delim == '"' || delim == '\n' || delim == '\r') {
    PyErr_SetString(PyExc_ValueError, "plain_fields: want must hold one int32 per field, delim one other byte");
    goto done;
  }
  for (Py_ssize_t j = 0; j < nfields; j++) {
    if (w[j] < -1 || w[j] >= nfields) {
      PyErr_SetString(PyExc_ValueError, "plain_fields: want's columns must be -1 or below nfields");
      goto done;
    }
    if (w[j] + 1 > nout) nout = w[j] + 1;
  }
  if (split.obj && split.len != nout * (Py_ssize_t)sizeof(int32_t)) {
    PyErr_SetString(PyExc_ValueError, "plain_fields: split must hold one int32 per output column");
    goto done;
  }
  if ((uint64_t)data.len > UINT32_MAX) {  /* field spans are 32-bit: the pyarrow way reads such a batch */
    result = Py_NewRef(Py_None);
    goto done;
  }
  cols = calloc((size_t)(nout ? nout : 1), sizeof(column_bytes));
  encs = calloc((size_t)(nout ? nout : 1), sizeof(enc_column));
  offs = calloc((size_t)(nout ? nout : 1), sizeof(int64_t *));
  spans = calloc((size_t)(nout ? nout : 1), sizeof(field_span *));
  if (!cols || !encs || !offs || !spans) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t c = 0; c < nout; c++) {
    int sp = split.obj ? ((const int32_t *)split.buf)[c] : -1;
    if (sp < -1 || sp > 256) {
      PyErr_SetString(PyExc_ValueError, "plain_fields: split values must be -1, a byte, or 256");
      goto done;
    }
    encs[c].split = sp;
    if (sp >= 0) {
      encs[c].mcap = 256;
      encs[c].doff = malloc(256 * sizeof(int64_t));
      encs[c].hashes = malloc(256 * sizeof(uint64_t));
      spans[c] = malloc(ENC_BLOCK * sizeof(field_span));
      if (!encs[c].doff || !encs[c].hashes || !spans[c] || enc_rehash(&encs[c]) < 0) {
        PyErr_NoMemory();
        goto done;
      }
      encs[c].doff[0] = 0;
    }
  }
  /* The offsets are filled in place in the bytes objects returned (no copy of them with the GIL held). */
  offs_obj = calloc((size_t)(nout ? nout : 1), sizeof(PyObject *));
  if (!offs_obj) {
    PyErr_NoMemory();
    goto done;
  }
  for (Py_ssize_t c = 0; c < nout; c++) {
    offs_obj[c] = PyBytes_FromStringAndSize(NULL, (nrec + 1) * (Py_ssize_t)sizeof(int64_t));
    if (!offs_obj[c]) goto done;
    offs[c] = (int64_t *)PyBytes_AS_STRING(offs_obj[c]);
    offs[c][0] = 0;
  }
  const uint8_t *b = (const uint8_t *)data.buf, *end = b + data.len;
  int plain = 1, nomem = 0;
  Py_ssize_t r = 0;
  Py_BEGIN_ALLOW_THREADS
  uint8_t stop[256] = {0};  /* bytes that end a field, or make the bytes not plain */
  stop[(uint8_t)delim] = 1;
  stop['\n'] = 2;
  stop['"'] = 3;
  stop['\r'] = 3;
  enc_tokens *tokens = malloc(sizeof(enc_tokens));  /* an encoded column's tokens, hashed, waiting for probes */
  if (!tokens) nomem = 1, plain = 0;
  uint8_t inquote[256] = {0};  /* bytes that end a quoted value, or make it not plain */
  inquote['"'] = inquote['\n'] = inquote['\r'] = 1;
  const uint8_t *p = b;
  while (p < end && plain) {
    if (r == nrec) {
      plain = 0;  /* more records than the framing found */
      break;
    }
    Py_ssize_t f = 0;
    for (;;) {
      const uint8_t *s = p, *e;
      int kind;
      if (p < end && *p == '"') {  /* a quoted value: plain when it has no quote, \r or \n inside */
        s = ++p;
        p = find_marked(p, end, inquote, '"', '\n', '\r', '\r');
        if (p == end || *p != '"') {
          plain = 0;
          break;
        }
        e = p++;
        kind = p < end ? stop[*p] : 2;
        if (kind != 1 && kind != 2) {  /* "a""b", "a"b: the parser's judgement */
          plain = 0;
          break;
        }
      } else {
        p = find_marked(p, end, stop, (uint8_t)delim, '\n', '"', '\r');
        e = p;
        kind = p < end ? stop[*p] : 2;
        if (kind == 3) {
          plain = 0;
          break;
        }
      }
      if (f < nfields && w[f] >= 0) {
        if (encs[w[f]].split >= 0) {  /* encoded column by column below */
          spans[w[f]][r % ENC_BLOCK] = (field_span){(uint32_t)(s - b), (uint32_t)(e - b)};
        } else if (column_put(&cols[w[f]], s, e - s) < 0) {
          nomem = 1;
          plain = 0;
          break;
        }
      }
      f++;
      if (kind == 2) break;
      p++;  /* past the delimiter */
    }
    if (!plain) break;
    if (f != nfields) {
      plain = 0;  /* a short or long record (an empty line is one field): pyarrow's letters */
      break;
    }
    r++;
    for (Py_ssize_t c = 0; c < nout; c++)
      if (encs[c].split < 0) offs[c][r] = cols[c].used;
    p++;  /* past the \n (or the end) */
    if (r % ENC_BLOCK == 0 || (r == nrec && p >= end)) {
      Py_ssize_t r0 = (r - 1) / ENC_BLOCK * ENC_BLOCK;
      for (Py_ssize_t c = 0; c < nout && !nomem; c++)
        if (encs[c].split >= 0 && enc_column_values(&encs[c], b, end, spans[c], r - r0, offs[c] + r0, tokens) < 0)
          nomem = 1;
      if (nomem) plain = 0;
    }
  }
  free(tokens);
  Py_END_ALLOW_THREADS
  if (nomem) {
    PyErr_NoMemory();
    goto done;
  }
  if (!plain || r != nrec) {
    result = Py_NewRef(Py_None);
    goto done;
  }
  result = PyList_New(nout);
  if (!result) goto done;
  for (Py_ssize_t c = 0; c < nout; c++) {
    PyObject *o = offs_obj[c];
    offs_obj[c] = NULL;
    PyObject *t = NULL;
    if (encs[c].split >= 0) {
      enc_column *e = &encs[c];
      PyObject *codes = PyBytes_FromStringAndSize((const char *)e->codes, e->ncodes * (Py_ssize_t)sizeof(int32_t));
      PyObject *doff = PyBytes_FromStringAndSize((const char *)e->doff, (e->m + 1) * (Py_ssize_t)sizeof(int64_t));
      PyObject *dd = PyBytes_FromStringAndSize((const char *)e->ddata.data, e->ddata.used);
      t = o && codes && doff && dd ? PyTuple_Pack(4, o, codes, doff, dd) : NULL;
      Py_XDECREF(codes);
      Py_XDECREF(doff);
      Py_XDECREF(dd);
    } else {
      PyObject *v = PyBytes_FromStringAndSize((const char *)cols[c].data, cols[c].used);
      t = o && v ? PyTuple_Pack(2, o, v) : NULL;
      Py_XDECREF(v);
    }
    Py_XDECREF(o);
    if (!t) {
      Py_CLEAR(result);
      goto done;
    }
    PyList_SET_ITEM(result, c, t);
  }
done:
  if (cols)
    for (Py_ssize_t c = 0; c < nout; c++) free(cols[c].data);
  if (encs)
    for (Py_ssize_t c = 0; c < nout; c++) enc_free(&encs[c]);
  free(encs);
  if (offs_obj)
    for (Py_ssize_t c = 0; c < nout; c++) Py_XDECREF(offs_obj[c]);
  free(offs_obj);
  if (spans)
    for (Py_ssize_t c = 0; c < nout; c++) free(spans[c]);
  free(spans);
  free(cols);
  free(offs);
  PyBuffer_Release(&data);
  PyBuffer_Release(&want);
  if (split.obj) PyBuffer_Release(&split);
  return result;
}

static PyMethodDef methods[] = {
    {"quote_states", quote_states, METH_VARARGS,
     "Which line breaks of data[lo:hi] end a CSV record, and the quote state at hi."},
    {"plain_decimals", plain_decimals, METH_VARARGS,
     "A large_string array's values as float64 when all are blank or plain decimal integers, else None."},
    {"plain_fields", plain_fields, METH_VARARGS,
     "The wanted columns of CSV records that need no parser (no quote, no \\r, one line each), else None."},
    {"line_breaks", line_breaks, METH_VARARGS, "Offsets from lo of the line breaks of data[lo:hi] (int64 bytes)."},
    {"is_ascii", is_ascii, METH_VARARGS, "Whether every byte of a buffer is below 0x80."},
    {"room_after", room_after, METH_VARARGS, "A bytearray of a buffer's bytes followed by n bytes to fill."},
    {"tfrecord_frames", tfrecord_frames, METH_VARARGS, "The checked TFRecord frames' payloads of data from pos on."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_csv_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__csv_native(void) {
  crc_init();
  return PyModule_Create(&module);
}
