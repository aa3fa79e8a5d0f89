"""CSV files -> `RawBatch`es: the header, the records that start in a split, parsed in batches.

Record boundaries come from the vectorised scan (`pipelines.read.csv_scan`); each batch's bytes are parsed by
the native splitter when the records are plain, else by pyarrow's reader. Records the parser cannot read, and
records with bytes that are not UTF-8 in a column the spec reads, become dead letters.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from pipelines.read import source
from pipelines.read.csv_scan import (
    CR,
    CR_BYTE,
    LF,
    LF_BYTE,
    Scanner,
    csv_bof,
    csv_native,
    delimiter_byte,
    range_summary,
    run_end,
)
from pipelines.read.records import (
    DeadLetter,
    Deferred,
    InputFile,
    InputSplit,
    RawBatch,
    missing_columns_letter,
    one_array,
)
from pipelines.read.source import Source
from pipelines.token_index import encoded_from_buffers

CSV_BATCH_BYTES = 32 << 20  # a CSV batch is at most chunk_rows records or about this many bytes
HEAD_SCAN_BYTES = 64 << 10  # the first part of a file scanned for its header


@dataclasses.dataclass
class _CsvHead:
    names: List[str]  # the header's fields
    end: int  # offset after the header record (its line break included)
    lines: int  # line breaks before `end`
    bof: int  # 0, or 3 after a UTF-8 byte order mark


def _csv_head(src: Source, f: InputFile, columns: List[str], delimiter: str
              ) -> Tuple[Optional[_CsvHead], Optional[DeadLetter]]:
    """The header record (the first line, or the first record if a quoted value in it holds line breaks),
    or the whole-file letter (empty, bad header, missing columns) / the letter of an unterminated header."""
    bof = csv_bof(src)
    sc = Scanner(src, 0, 0, delimiter_byte(delimiter), bof)
    first_break = header_break = None
    lines = 0
    limit = 0  # scanned in growing parts from 64 KiB: the header is one line of a file of any size
    while True:
        if sc.pos >= limit:
            limit = run_end(src, min(src.size, max(2 * limit, HEAD_SCAN_BYTES)))
        got = sc.step(limit)
        if got is None:
            break
        breaks, record = got
        if first_break is None and breaks.size:
            first_break = int(breaks[0])
        if record.any():
            k = int(np.argmax(record))
            header_break, lines = int(breaks[k]), sc.lines - breaks.size + k + 1
            break
        sc.release(sc.pos - 1)
    unterminated = header_break is None and sc.q == 1
    if header_break is not None:
        text = sc.get(0, header_break)
    elif unterminated:  # every line is lost with the open quote; the fields of the first line are checked
        text = sc.get(0, src.size if first_break is None else first_break)
    else:
        text = sc.get(0, src.size)
    if not text.strip() and not _has_content(src):
        return None, DeadLetter(f.path, -1, "empty_file", "the file has no header and no records", f.index)
    text = text.rstrip(b"\r")
    try:
        decoded = text.decode("utf-8")
        rows = csv.reader(io.StringIO(decoded, newline="") if ("\n" in decoded or "\r" in decoded) else [decoded],
                          delimiter=delimiter)
        header = next(iter(rows))
    except (UnicodeDecodeError, StopIteration, csv.Error):
        return None, DeadLetter(f.path, -1, "bad_header", "the header line (line 1) is not UTF-8 CSV; every record "
                                "of the file is sent to the dead letters. Fix: save the file as UTF-8 with a header "
                                "row", f.index)
    missing = [c for c in columns if c not in header]
    if missing:
        return None, missing_columns_letter(f, missing, header)
    if unterminated:
        return None, _unterminated_letter(f, 1, sc.lines + 1 - _ends_with_break(src), src.size)
    if header_break is None:  # a header and no line break after it: no records
        return _CsvHead(header, src.size, sc.lines, bof), None
    return _CsvHead(header, header_break + 1, lines, bof), None


def _ends_with_break(src: Source) -> int:
    return int(src.read(src.size - 1, 1) in (b"\n", b"\r"))


def _has_content(src: Source) -> bool:
    """Whether the file has a byte that is not ASCII white space."""
    for off in range(0, src.size, source.READ_BYTES):
        if src.read(off, source.READ_BYTES).strip():
            return True
    return False


def _unterminated_letter(f: InputFile, line: int, last: int, nbytes: int) -> DeadLetter:
    return DeadLetter(f.path, line, "framing_lost",
                      f"unterminated quote: a quoted value opened in the record at line {line} is never closed, so "
                      f"lines {line}..{max(last, line)} ({nbytes} bytes, the rest of the file) cannot be split into "
                      "records. Fix: close the quote (a literal quote inside a quoted value is written \"\")", f.index)


def _blank_invalid_utf8(data: bytes) -> Tuple[bytes, np.ndarray]:
    """(`data` with every byte that is not UTF-8 replaced by `?`, the offsets of those bytes).

    pyarrow decodes a malformed row's text as UTF-8 before it calls the invalid-row handler; a row
    that is both malformed and not UTF-8 makes that fail (an "Exception ignored" on stderr) and
    stops the reader.  Only bytes >= 0x80 are replaced, one byte for one byte, so the framing and
    every offset stay; the records that had such bytes are dead-lettered by the reader
    (`_utf8_letter`) when a column the spec reads has them, so no value is changed silently.
    """
    original = np.frombuffer(data, np.uint8)
    cleaned = np.frombuffer(data.decode("utf-8", "surrogateescape").encode("utf-8", "replace"), np.uint8)
    invalid = np.flatnonzero(original != cleaned)
    out = original.copy()
    out[invalid] = ord("?")
    return out.tobytes(), invalid


def _utf8_letter(f: InputFile, record: bytes, line: int, header: List[str], columns: List[str],
                 delimiter: str) -> Optional[DeadLetter]:
    """The invalid_utf8 dead letter of a record (its original bytes), or None when the bytes that are not
    UTF-8 are only in columns the spec does not read."""
    fields = next(csv.reader(io.StringIO(record.decode("latin-1"), newline=""), delimiter=delimiter), [])
    for name, value in zip(header, fields):
        raw = value.encode("latin-1")
        if name in columns:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return DeadLetter(f.path, line, "invalid_utf8", f"column {name!r}: {raw[:80]!r} is not UTF-8. Fix: "
                                  "save the file as UTF-8 (CSV is read as UTF-8 text)", f.index)
    return None


def _pyarrow_csv(data: bytes, names: List[str], columns: List[str], delimiter: str, on_invalid,
                 records: Optional[int] = None):
    """`records`: how many records (framed by the scan) `data` holds, if known. When its line breaks are
    exactly their ends (no line break inside a value, no empty line, no \r), pyarrow is told values have
    no newlines, which parses about twice as fast; the table is the same."""
    data = bytes(data)  # a view of the scanner's buffer: the checks below are bytes methods
    newlines = records is None or CR_BYTE in data or \
        data.count(LF_BYTE) != records - (0 if data.endswith(LF_BYTE) else 1)
    # The caller made `data` valid UTF-8, and values split at ASCII bytes stay valid: no second check.
    return pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(use_threads=False, block_size=max(1 << 20, len(data) + 1),
                                       column_names=names),
        parse_options=pacsv.ParseOptions(delimiter=delimiter, invalid_row_handler=on_invalid,
                                         newlines_in_values=newlines),
        convert_options=pacsv.ConvertOptions(include_columns=columns,
                                             column_types={c: pa.large_string() for c in columns},
                                             strings_can_be_null=False, quoted_strings_can_be_null=False,
                                             check_utf8=False))


def _plain_table(data: bytes, names: List[str], columns: List[str], delimiter: str, records: int,
                 encode: Optional[Dict[str, Optional[str]]] = None):
    """(the table `_pyarrow_csv` reads from `records` records, the `encode` columns dictionary-encoded) by
    the native splitter, when their bytes need no parser's judgement (no quote character inside a value,
    no \r, one line per record, each of len(names) fields: see native/_csv_native.c `plain_fields`);
    else None. The same table (tests/pipelines/read/test_csv_plain.py), read faster than pyarrow's reader reads it
    (benchmarks/read_parse.py times both).

    `encode`: {column: token delimiter or None}; those columns (with a delimiter of one byte or none) come
    out as `RawBatch.encoded` entries instead of table columns: (delimiter, int64 tokens per record, the
    non-blank tokens as token_index.DICTIONARY_TYPE in first-seen order), what the parser makes of the
    strings (`pipelines.read.parse._categorical`), here in the read's thread without the GIL."""
    native, delim = csv_native(), delimiter_byte(delimiter)
    if native is None or delim < 0 or len(set(names)) != len(names) or not set(columns) <= set(names):
        return None
    split = {c: (256 if t is None else t.encode("utf-8")[0]) for c, t in (encode or {}).items()
             if c in columns and (t is None or len(t.encode("utf-8")) == 1)}
    slot = {c: i for i, c in enumerate(columns)}
    want = np.array([slot.get(n, -1) for n in names], np.int32)
    got = native.plain_fields(data, len(names), delim, want.tobytes(), records,
                              np.array([split.get(c, -1) for c in columns], np.int32).tobytes())
    if got is None:
        return None
    table, encoded = {}, {}
    for c, parts in zip(columns, got):
        if c in split:
            offsets, codes, d_offsets, d_data = parts
            lengths = np.diff(np.frombuffer(offsets, np.int64))
            tokens = encoded_from_buffers(np.frombuffer(codes, np.int32), d_offsets, d_data)
            encoded[c] = (encode[c], lengths, tokens)  # type: ignore[index]  # split: columns of encode
        else:
            table[c] = pa.Array.from_buffers(pa.large_string(), records, [
                None, pa.py_buffer(parts[0]), pa.py_buffer(parts[1])])
    return pa.table(table) if table else pa.table({"": pa.nulls(records)}).drop_columns([""]), encoded


def _is_ascii(data) -> bool:
    """Whether every byte is below 0x80 (natively without the GIL, for a view too)."""
    native = csv_native()
    return native.is_ascii(data) if native is not None else bytes(data).isascii()


def _parse_records(f: InputFile, head: _CsvHead, columns: List[str], delimiter: str, data,
                   starts: np.ndarray, ends: np.ndarray, lines: np.ndarray, batch_index: int,
                   encode: Optional[Dict[str, Optional[str]]] = None):
    """(RawBatch or None, letters) for consecutive records: data[starts[i]:ends[i]] is record i (at line
    lines[i]); only empty lines are between them. `data`: bytes or a view of them."""
    m = int(starts.size)
    original = data
    data, not_utf8 = _utf8_data(data, starts)
    bad: Dict[int, DeadLetter] = {}
    lost = []

    def on_invalid(row):
        k = -1 if row.number is None else int(row.number) - 1  # rows are numbered from 1, empty lines skipped
        if 0 <= k < m and k not in bad:
            bad[k] = DeadLetter(f.path, int(lines[k]), "malformed_record",
                                f"expected {row.expected_columns} columns, got {row.actual_columns}: "
                                f"{row.text[:200]!r}", f.index)
        else:
            lost.append(row)
        return "skip"

    encoded: Dict[str, Tuple[Optional[str], np.ndarray, pa.Array]] = {}
    try:
        # Dictionary-encoded columns only where every record is kept as it is (no UTF-8 letters to filter).
        plain = _plain_table(data, head.names, columns, delimiter, m, {} if not_utf8.size else encode)
        if plain is not None:
            table, encoded = plain
        else:
            table = _pyarrow_csv(data, head.names, columns, delimiter, on_invalid, m)
        together = not lost and table.num_rows + len(bad) == m
    except (pa.ArrowException, UnicodeDecodeError, ValueError):
        together = False
    if not together:  # the parser and the record boundaries disagree: each record alone (not seen in practice)
        table, bad = _parse_one_by_one(f, head, columns, delimiter, data, starts, ends, lines)
        encoded = {}  # every column is in the table then
    keep = np.ones(m, bool)
    keep[list(bad)] = False
    letters = [bad[k] for k in sorted(bad)]
    rows = np.flatnonzero(keep)
    if not_utf8.size:
        ok = np.ones(rows.size, bool)
        for i in np.flatnonzero(np.isin(rows, not_utf8)):
            k = int(rows[i])
            letter = _utf8_letter(f, bytes(original[starts[k]:ends[k]]), int(lines[k]), head.names, columns,
                                  delimiter)
            if letter is not None:
                ok[i] = False
                letters.append(letter)
        if not ok.all():
            table = table.filter(pa.array(ok))
            rows = rows[ok]
    if not rows.size:
        return None, letters
    cols = {c: one_array(table.column(c)) for c in table.column_names}
    return RawBatch(f.index, f.path, batch_index, lines[rows].astype(np.int64), cols, encoded), letters


def _utf8_data(data, starts: np.ndarray) -> Tuple[object, np.ndarray]:
    """(`data` with its invalid UTF-8 bytes blanked, the records that held some): `data` itself and none when it
    is valid UTF-8."""
    try:
        if not _is_ascii(data):  # ASCII is UTF-8, and the check is ~10x faster than a decode
            str(data, "utf-8")
        return data, np.zeros(0, np.int64)
    except UnicodeDecodeError:
        data, invalid = _blank_invalid_utf8(bytes(data))
        return data, np.unique(np.searchsorted(starts, invalid, side="right") - 1)


def _parse_one_by_one(f, head, columns, delimiter, data, starts, ends, lines):
    tables, bad = [], {}
    for k in range(int(starts.size)):
        got: List[Any] = []
        try:
            t = _pyarrow_csv(data[starts[k]:ends[k]], head.names, columns, delimiter,
                             lambda row, got=got: got.append(row) or "skip")
        except (pa.ArrowException, UnicodeDecodeError, ValueError) as e:
            bad[k] = DeadLetter(f.path, int(lines[k]), "malformed_record",
                                f"the CSV parser cannot read it: {str(e)[:200]}", f.index)
            continue
        if t.num_rows == 1 and not got:
            tables.append(t)
            continue
        why = (f"expected {got[0].expected_columns} columns, got {got[0].actual_columns}: {got[0].text[:200]!r}"
               if len(got) == 1 and t.num_rows == 0 else f"the CSV parser reads it as {t.num_rows + len(got)} records")
        bad[k] = DeadLetter(f.path, int(lines[k]), "malformed_record", why, f.index)
    if tables:
        table = pa.concat_tables(tables)
    else:
        table = pa.table({c: pa.array([], pa.large_string()) for c in columns})
    return table, bad


def read_csv(split: InputSplit, columns: List[str], *, csv_delimiter: str, chunk_rows: int,
              csv_state: Optional[Tuple[int, int]] = None, encode: Optional[Dict[str, Optional[str]]] = None, **_):
    f = split.file
    with source.open_input(f.path) as fh:
        src = Source(fh)
        if src.size == 0:
            return
        head, letter = _csv_head(src, f, columns, csv_delimiter)
        if letter is not None and split.index == 0:
            yield letter
        if head is not None:
            yield from _csv_records(split, src, head, columns, csv_delimiter, chunk_rows, csv_state, encode or {})


# One unit: the scan loop carries the record boundaries (prev_rb, prev_line, lines, pending) from block to block.
def _csv_records(split: InputSplit, src: Source, head: _CsvHead, columns: List[str], delimiter: str,
                 chunk_rows: int, csv_state: Optional[Tuple[int, int]], encode: Dict[str, Optional[str]]):
    """The records that start in the split (after the header), in batches of at most chunk_rows.

    A record is the bytes after a record-ending line break (or the header) up to and including the next
    one (or the end of the file); empty lines are not records.
    """
    f = split.file
    size = src.size
    end = size if split.last else min(split.end, size)
    first = max(split.start, head.end)
    if first >= end:
        return
    sc, lines, prev_rb = _split_scanner(src, head, first, delimiter, csv_state)
    prev_line = lines + 1  # the line where the record after prev_rb starts
    pending: List[Tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # complete records: starts, ends, lines
    npend = 0
    batch_index = 0
    while True:
        got = sc.step()
        done = got is None
        if got is not None:
            breaks, record = got
            line_after = lines + 2 + np.arange(breaks.size, dtype=np.int64)  # the line after each break
            lines += int(breaks.size)
            rb = breaks[record]
            if rb.size:
                rb_line = line_after[record]
                starts = np.concatenate(([-1 if prev_rb is None else prev_rb], rb[:-1])) + 1
                start_lines = np.concatenate(([prev_line], rb_line[:-1]))
                cr_before = np.frombuffer(sc.buf, np.uint8)[rb - 1 - sc.base] == CR  # rb > pos - 1 >= base
                empty = (rb == starts) | ((rb == starts + 1) & cr_before)
                keep = (starts >= first) & (starts < end) & ~empty
                if prev_rb is None:
                    keep[0] = False  # it started before the split
                prev_rb, prev_line = int(rb[-1]), int(rb_line[-1])
                if keep.any():
                    pending.append((starts[keep], rb[keep] + 1, start_lines[keep]))
                    npend += int(np.count_nonzero(keep))
                done = prev_rb + 1 >= end
            elif prev_rb is None and sc.pos >= end:
                done = True  # no record starts in the split
        if got is None and prev_rb is not None and first <= prev_rb + 1 < min(end, size):
            # the end of the file, and the last record has no line break after it
            s0 = prev_rb + 1
            if sc.q:
                yield _unterminated_letter(f, prev_line, lines + 1 - _ends_with_break(src), size - s0)
            else:
                pending.append((np.array([s0], np.int64), np.array([size], np.int64),
                                np.array([prev_line], np.int64)))
                npend += 1
        batch_bytes = int(pending[-1][1][-1] - pending[0][0][0]) if npend else 0
        if npend and (done or npend >= chunk_rows or batch_bytes >= CSV_BATCH_BYTES):
            rest = yield from _csv_batches(f, head, columns, delimiter, encode, sc, pending, chunk_rows, batch_index,
                                           done or batch_bytes >= CSV_BATCH_BYTES)
            batch_index, pending = rest
            npend = sum(int(s.size) for s, _, _ in pending)
        if done:
            return
        # Keep the pending records and, up to a point, the record going on (else it is read again).
        keep_from = sc.pos - 1
        if npend:
            keep_from = min(keep_from, int(pending[0][0][0]))
        if prev_rb is not None and sc.pos - prev_rb <= CSV_BATCH_BYTES:
            keep_from = min(keep_from, prev_rb + 1)
        sc.release(keep_from)


def _split_scanner(src: Source, head: _CsvHead, first: int, delimiter: str, csv_state: Optional[Tuple[int, int]]
                   ) -> Tuple[Scanner, int, Optional[int]]:
    """A scanner at `first`, the split's first byte after the header: it, the lines before `first`, and the
    offset of the record-ending line break just before it (None: a record started before `first` goes on)."""
    delim = delimiter_byte(delimiter)
    prev_rb: Optional[int] = None  # offset of the last record-ending line break seen
    if first == head.end:
        q, lines = 0, head.lines
        prev_rb = first - 1
    else:
        q, lines = csv_state if csv_state is not None else range_summary(src, 0, first, delim, head.bof)[0::2]
    sc = Scanner(src, first, q, delim, head.bof)
    if prev_rb is None:
        before = sc.byte(first - 1)
        if q == 0 and (before == LF or (before == CR and sc.byte(first) != LF)):
            prev_rb = first - 1
        sc.skip_run()
    return sc, lines, prev_rb


def _csv_batches(f, head, columns, delimiter, encode, sc: Scanner, pending, chunk_rows: int, batch_index: int,
                 all_: bool):
    """The pending records in batches of chunk_rows (all of them, or only full batches), each a `Deferred`
    parse (`_parsed_records`: the native split or pyarrow's reader let go of the GIL, so batches can be
    parsed side by side); returns (next batch index, the records left pending)."""
    s, e, ln = (np.concatenate(x) for x in zip(*pending))
    n = s.size if all_ else s.size - s.size % chunk_rows
    for a in range(0, n, chunk_rows):
        b = min(a + chunk_rows, n)
        lo = int(s[a])
        yield Deferred(_parsed_records, (f, head, columns, delimiter, sc.view(lo, int(e[b - 1])), s[a:b] - lo,
                                         e[a:b] - lo, ln[a:b], batch_index, encode))
        batch_index += 1
    return batch_index, ([(s[n:], e[n:], ln[n:])] if n < s.size else [])


def _parsed_records(*args):
    """`_parse_records`' dead letters, then its batch if any record is left."""
    raw, letters = _parse_records(*args)
    yield from letters
    if raw is not None:
        yield raw
