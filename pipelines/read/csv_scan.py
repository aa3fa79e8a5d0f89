"""CSV record boundaries, vectorised: where each record starts and ends, for any split of a file.

Records are found as pyarrow's parser finds them (quoting on, "" escapes, values may hold line breaks):
a line break (\\n, \\r\\n or a lone \\r) ends a record unless a quoted value is open there. Only the
quote characters change that state, and they come in runs (maximal stretches of quote characters).
A run of length L changes "a quoted value is open" (q) as follows:
  q = 1:                     q' = (L even)             ("" pairs are quotes, an odd one closes)
  q = 0 at a field start:    q' = (L odd)              (the first opens, the rest are pairs)
  q = 0 inside a field:      q' = 0                    (quote characters inside an unquoted value are text)
"At a field start" is: the byte before the run is the delimiter, \\n or \\r, or the run starts the file
(after a UTF-8 byte order mark, which pyarrow skips). With q = 1 the byte before does not matter, so each
run is one of three functions of q (identity, not, zero), known from the bytes alone: their composition is
a cumulative sum, and so is the line count. That makes a byte range's effect a (q at its end for q = 0 at
its start, same for q = 1, line breaks) triple, and a split can start reading anywhere once the triples of
the ranges before it are known (`csv_split_summary`, `csv_split_states`).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np

from pipelines.read import source
from pipelines.read.records import InputSplit
from pipelines.read.source import Source

QUOTE, LF, CR = 0x22, 0x0A, 0x0D
LF_BYTE, CR_BYTE = b"\n", b"\r"
BOM = b"\xef\xbb\xbf"

_csv_native: Any = None  # the native scanner (native/_csv_native.c, built in place by the install), else numpy
if os.environ.get("TPU_EMBED_NATIVE", "1") != "0":
    try:
        from pipelines import _csv_native  # type: ignore[attr-defined,no-redef]  # a C extension
    except ImportError:  # pragma: no cover - installed with TPU_EMBED_NATIVE=optional, the build failed
        pass


def csv_native():
    """The native CSV module (native/_csv_native.c), or None (not built, or TPU_EMBED_NATIVE=0)."""
    return _csv_native


def delimiter_byte(delimiter: str) -> int:
    b = delimiter.encode("utf-8")
    return b[0] if len(b) == 1 else -1


def _scan(b: np.ndarray, lo: int, hi: int, q: int, bof: int, delim: int, after: int, both: bool = False,
          records: bool = True):
    """Line breaks and quote state of b[lo:hi] (uint8), with a quoted value open at lo iff q.

    b[lo - 1] must be the byte before lo (or lo = 0 the file start), every run of quote characters that
    starts in [lo, hi) must end before hi, and `after` is b[hi] (-1 at the end of the file; only looked at
    when b[hi - 1] is \\r). `bof` is the index in b of the file's first field, if b holds it.
    Returns (positions in b of the line breaks, which of them end a record, q at hi for q = 0 at lo,
    q at hi for q = 1 at lo); with both=False only the one for the given q is right. records=False: the
    caller does not need which breaks end a record (the native way then returns None for them, and can
    skip rescanning a range read from the wrong quote state).
    """
    if _csv_native is not None:
        breaks = np.frombuffer(_csv_native.line_breaks(b, lo, hi, after), np.int64)
        flags = np.empty(breaks.size, np.uint8) if records else None
        if both:  # one pass for both start states when the quotes allow (native/_csv_native.c)
            end, other = _csv_native.quote_states(b, lo, hi, q, bof, delim, after, flags, True)
        else:
            end = _csv_native.quote_states(b, lo, hi, q, bof, delim, after, flags)
            other = end ^ 1
        return (breaks + lo, (flags.view(bool) if records else None),  # type: ignore[union-attr]  # set with records
                (other if q else end), (end if q else other))
    seg = b[lo:hi]
    brk = seg == LF
    cr = seg == CR
    if cr.any():
        nxt = np.empty_like(seg)
        nxt[:-1] = seg[1:]
        nxt[-1] = after if after >= 0 else 0
        brk |= cr & (nxt != LF)
    breaks = np.flatnonzero(brk)
    quotes = np.flatnonzero(seg == QUOTE)
    if not quotes.size:
        return breaks + lo, np.full(breaks.size, q == 0), 0, 1
    quotes += lo
    fixes = _parity_fixes(b, quotes, q, bof, delim)
    if fixes is None:
        return _scan_runs(b, quotes, breaks + lo, q, bof, delim)
    before = np.searchsorted(quotes, breaks + lo)  # quote characters before each break
    state = (q + before + np.searchsorted(fixes, before, side="right")) & 1
    end = (q + quotes.size + fixes.size) & 1
    other = end ^ 1
    if both:
        fixes1 = _parity_fixes(b, quotes, 1 - q, bof, delim)
        other = (1 - q + quotes.size + fixes1.size) & 1 if fixes1 is not None else \
            _scan_runs(b, quotes, breaks[:0] + lo, 1 - q, bof, delim)[3 - q]
    return breaks + lo, state == 0, (other if q else end), (end if q else other)


def _parity_fixes(b: np.ndarray, quotes: np.ndarray, q: int, bof: int, delim: int, most: int = 16):
    """The quote state as a parity: q at a position is (q + quote characters before it + fixes before them) % 2.

    That holds as long as every quote character met outside a quoted value starts a field (or is the second
    of a pair); a run of an odd number of them inside an unquoted value (text, not a quote) adds a fix after
    it. Returns the fixes (quote counts after which one more flip applies), None after `most` of them (the
    caller then takes the run-by-run way, `_scan_runs`).
    """
    fixes: List[int] = []
    k0 = 0
    nq = quotes.size
    ok_byte = np.zeros(256, bool)
    ok_byte[[QUOTE, LF, CR] + ([delim] if delim >= 0 else [])] = True
    while k0 < nq:
        pos = quotes[k0 + ((q + k0 + len(fixes)) & 1)::2]  # quote characters met with no quoted value open
        ok = ok_byte[b[pos - 1]]
        if pos.size and pos[0] == 0:
            ok[0] = bof == 0
        if 0 < bof < b.size and b[bof] == QUOTE:
            ok[pos == bof] = True
        stray = np.flatnonzero(~ok)
        if not stray.size:
            break
        if len(fixes) >= most:
            return None
        k = k0 + ((q + k0 + len(fixes)) & 1) + 2 * int(stray[0])
        gaps = np.flatnonzero(np.diff(quotes[k:]) != 1)
        run = int(gaps[0]) + 1 if gaps.size else nq - k
        if run & 1:
            fixes.append(k + run)
        k0 = k + run
    return np.asarray(fixes, np.int64)


def _scan_runs(b: np.ndarray, quotes: np.ndarray, breaks: np.ndarray, q: int, bof: int, delim: int):
    """`_scan` run by run (any number of quote characters inside unquoted values); quotes and breaks are
    positions in b."""
    cut = np.flatnonzero(np.diff(quotes) != 1) + 1
    first = np.concatenate(([0], cut))
    pos = quotes[first]
    odd = (np.diff(np.concatenate((first, [quotes.size]))) & 1).astype(bool)
    prev = b[np.maximum(pos - 1, 0)]
    at_start = (prev == LF) | (prev == CR) | (prev == delim) | (pos == bof)
    if pos[0] == 0:
        at_start[0] = bof == 0
    flip = at_start & odd
    zero = ~at_start & odd
    flips = np.cumsum(flip, dtype=np.int64)
    last_zero = np.maximum.accumulate(np.where(zero, np.arange(zero.size), -1))
    since_zero = (flips - flips[np.maximum(last_zero, 0)]) & 1
    reset = last_zero >= 0
    after_run = np.where(reset, since_zero, (q + flips) & 1)
    k = np.searchsorted(pos, breaks) - 1
    state = np.where(k >= 0, after_run[np.maximum(k, 0)], q)
    end0 = int(since_zero[-1]) if reset[-1] else int(flips[-1] & 1)
    end1 = end0 if reset[-1] else end0 ^ 1
    return breaks, state == 0, end0, end1


class Scanner:
    """Streams a file's bytes forward from `pos` and scans them (`_scan`): line breaks, record ends, quote state.

    The buffer holds [base, base + len(buf)). `release` marks what the caller no longer needs and the next
    read leaves it behind: a read copies only the bytes kept into a new buffer and reads the file's next
    bytes into it after them (appending to the old buffer would copy all of it and the read again: ~3 copies
    of every byte, most of them into freshly mapped pages). Memory is what the caller keeps plus one read.
    """

    def __init__(self, src: Source, pos: int, q: int, delim: int, bof: int, both: bool = False,
                 records: bool = True):
        self.src, self.delim, self.bof, self.both, self.records = src, delim, bof, both, records
        self.base = max(pos - 1, 0)
        self.buf: Union[bytes, bytearray] = src.read(self.base, source.READ_BYTES + (pos - self.base) + 1)
        self.kept = self.base  # bytes before this offset are released
        self.pos, self.q = pos, q
        self.f0, self.f1 = 0, 1  # with both: the quote state now, had it been 0 / 1 where the scan started
        self.lines = 0  # line breaks scanned

    def _more(self) -> bool:
        end = self.base + len(self.buf)
        n = min(source.READ_BYTES, self.src.size - end)
        if n <= 0:
            return False
        keep = memoryview(self.buf)[self.kept - self.base:]
        if _csv_native is not None:  # copied without the GIL, the rest not zero-filled first
            buf = _csv_native.room_after(keep, n)
            view = memoryview(buf)
        else:
            buf = bytearray(len(keep) + n)
            view = memoryview(buf)
            view[:len(keep)] = keep
        self.src.read_into(end, view[len(keep):])
        self.buf, self.base = buf, self.kept
        return True

    def byte(self, p: int) -> int:
        """The byte at offset p (>= base), -1 past the end of the file."""
        while p - self.base >= len(self.buf):
            if not self._more():
                return -1
        return self.buf[p - self.base]

    def skip_run(self) -> None:
        """Skip quote characters at pos that go on a run started before it (the scan before counted them)."""
        if self.pos > 0 and self.byte(self.pos - 1) == QUOTE:
            while self.byte(self.pos) == QUOTE:
                self.pos += 1

    def step(self, limit: Optional[int] = None):
        """Scan the next part [pos, stop), stop <= limit (which must not cut a quote run); None at the end.

        Returns (offsets of the line breaks, which of them end a record, or None if `records` is False)
        and advances pos, q, lines.
        """
        size = self.src.size
        while True:
            end = self.base + len(self.buf)
            if self.pos >= size or (limit is not None and self.pos >= limit):
                return None
            eof = end >= size
            if limit is not None and (limit < end or (limit == end and eof)):
                stop = limit
            else:
                stop = self.base + _scan_end(self.buf, self.pos - self.base, eof)
            if stop > self.pos:
                break
            self._more()
        arr = np.frombuffer(self.buf, np.uint8)
        after = int(arr[stop - self.base]) if stop - self.base < arr.size else -1
        breaks, record, e0, e1 = _scan(arr, self.pos - self.base, stop - self.base, self.q, self.bof - self.base,
                                       self.delim, after, self.both, self.records)
        self.q = e1 if self.q else e0
        self.f0, self.f1 = (e1 if self.f0 else e0), (e1 if self.f1 else e0)
        self.lines += int(breaks.size)
        self.pos = stop
        return breaks + self.base, record

    def get(self, lo: int, hi: int) -> bytes:
        """Bytes [lo, hi) (from the buffer, or read again if released)."""
        if lo >= self.base and hi <= self.base + len(self.buf):
            return bytes(memoryview(self.buf)[lo - self.base:hi - self.base])
        return self.src.read(lo, hi - lo)

    def view(self, lo: int, hi: int) -> memoryview:
        """Bytes [lo, hi) as a read-only view of the buffer, without a copy (a buffer is never written once
        `_more` made it: the next read makes a new one), or read again if released."""
        if lo >= self.base and hi <= self.base + len(self.buf):
            return memoryview(self.buf).toreadonly()[lo - self.base:hi - self.base]
        return memoryview(self.src.read(lo, hi - lo))

    def release(self, keep_from: int) -> None:
        self.kept = max(self.kept, min(keep_from, self.pos - 1))


def _scan_end(b: Union[bytes, bytearray], lo: int, eof: bool) -> int:
    """The end of the part of b[lo:] that can be scanned now: all of it at the end of the file, else
    without a trailing run of quote characters (it may go on) or a trailing \\r (it may be a \\r\\n)."""
    hi = len(b)
    if eof or hi <= lo or b[hi - 1] not in (QUOTE, CR):
        return hi
    a = max(lo, hi - 4096)
    kept = b[a:hi].rstrip(b'"\r')
    if kept or a == lo:
        return a + len(kept)
    ends = np.flatnonzero(~np.isin(np.frombuffer(b, np.uint8)[lo:hi], (QUOTE, CR)))
    return lo + int(ends[-1]) + 1 if ends.size else lo


def csv_bof(src: Source) -> int:
    return 3 if src.read(0, 3) == BOM else 0


def run_end(src: Source, p: int) -> int:
    """p, or the end of the run of quote characters that goes on at p (small reads from p - 1 on)."""
    if p <= 0 or src.read(p - 1, 1) != b'"':
        return p
    while p < src.size:
        chunk = src.read(p, min(4096, source.READ_BYTES))
        rest = chunk.lstrip(b'"')
        p += len(chunk) - len(rest)
        if rest:
            break
    return p


def range_summary(src: Source, lo: int, hi: int, delim: int, bof: int) -> Tuple[int, int, int]:
    """(q at hi for q = 0 at lo, q at hi for q = 1 at lo, line breaks in [lo, hi)) of a file's bytes.

    The quote runs counted are those that start in [lo, hi), to their end; a run going on at lo belongs
    to the range before.
    """
    limit = run_end(src, hi)
    sc = Scanner(src, lo, 0, delim, bof, both=True, records=False)
    sc.skip_run()
    while sc.step(limit) is not None:
        sc.release(sc.pos - 1)
    return sc.f0, sc.f1, sc.lines


def csv_split_summary(split: InputSplit, delimiter: str) -> Tuple[int, int, int]:
    """The quote-state function and line-break count of a CSV split's bytes (see `_scan`): one pass over
    them, for the splits after it to start reading at their first record (`csv_split_states`)."""
    with source.open_input(split.file.path) as fh:
        src = Source(fh)
        hi = src.size if split.last else min(split.end, src.size)
        return range_summary(src, split.start, hi, delimiter_byte(delimiter), csv_bof(src))


def csv_split_states(summaries: Iterable[Tuple[int, Tuple[int, int, int]]]) -> Dict[int, Tuple[int, int]]:
    """{split index: (quote state, line breaks before it)} for splits 1.. of a file from the summaries of
    splits 0.. (index, `csv_split_summary`), which must all be there."""
    out: Dict[int, Tuple[int, int]] = {}
    q, lines = 0, 0
    for expect, (index, (e0, e1, nbreaks)) in enumerate(sorted(summaries)):
        if index != expect:
            raise ValueError(f"CSV split summaries: split {expect} is missing")
        q, lines = (e1 if q else e0), lines + nbreaks
        out[index + 1] = (q, lines)
    return out
