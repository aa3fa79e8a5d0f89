"""Input files -> Arrow record batches, and atomic output files.

Readers work per file and yield `RawBatch`es (Arrow columns + the record
number of every row) plus `DeadLetter`s for what cannot be read; they never
drop anything silently.  All file access goes through `tpu_embed.io`
(local paths and object stores alike: gs://, s3://, ...), on the launcher and
on the workers of any runner.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from pipelines import progress
from tpu_embed import io as tio
from tpu_embed.shards import iter_tfrecords, tfrecord_frame  # noqa: F401  (one TFRecord codec)

DEFAULT_CHUNK_ROWS = 32768


class StrictModeError(RuntimeError):
    """--strict: the first bad record stops the job; the message names file and record."""


@dataclasses.dataclass(frozen=True)
class InputFile:
    index: int  # position in the sorted list of all matched files
    path: str
    size: int


@dataclasses.dataclass
class DeadLetter:
    file: str
    record: int  # csv: line where the record starts (1 = header); tfrecord / parquet: 0-based record index;
    # -1: the whole file (reasons in FILE_REASONS)
    reason: str  # short machine-readable category, e.g. "unparsable_number"
    detail: str  # what and where, for a person
    file_index: int = -1

    def to_json(self) -> dict:
        return {"file": self.file, "record": self.record, "reason": self.reason, "detail": self.detail}


@dataclasses.dataclass
class RawBatch:
    file_index: int
    path: str
    batch_index: int
    record_numbers: np.ndarray  # int64, per row
    columns: Dict[str, pa.Array]

    @property
    def num_rows(self) -> int:
        return int(self.record_numbers.size)


# ---------------------------------------------------------------- listing

def list_input_files(patterns: Sequence[str]) -> List[InputFile]:
    """Every file matching the patterns, sorted by path (the order global batches follow)."""
    found: Dict[str, int] = {}
    for pattern in patterns:
        results = tio.list_files(pattern)
        if not results:
            raise FileNotFoundError(
                f"input pattern {pattern!r} matches no file. Check inputs.patterns in the spec (relative "
                "patterns are resolved against the spec file's directory) or pass --input.")
        for m in results:
            found[m.path] = int(m.size)
    return [InputFile(i, p, found[p]) for i, p in enumerate(sorted(found))]


# ---------------------------------------------------------------- readers

def read_file(fmt: str, f: InputFile, columns: Sequence[str], *, csv_delimiter: str = ",",
              chunk_rows: int = DEFAULT_CHUNK_ROWS, strict: bool = False
              ) -> Iterator[object]:
    """Yield `RawBatch` and `DeadLetter` objects for one input file."""
    reader = {"csv": _read_csv, "tfrecord": _read_tfrecord, "parquet": _read_parquet}[fmt]
    any_rows = False
    for item in reader(f, list(columns), csv_delimiter=csv_delimiter, chunk_rows=chunk_rows, strict=strict):
        if isinstance(item, DeadLetter):
            item.file_index = f.index
            if strict and item.record < 0:  # record-level letters: the caller raises on the first one
                raise StrictModeError(f"--strict: {item.file} record {item.record}: {item.reason}: {item.detail}")
        elif item.num_rows:
            any_rows = True
            progress.advance(item.num_rows)
        yield item
    if not any_rows and f.size == 0:
        dl = DeadLetter(f.path, -1, "empty_file", "the file is empty (0 bytes)", f.index)
        if strict:
            raise StrictModeError(f"--strict: {f.path}: empty file")
        yield dl


def _open(path: str):
    return tio.open_read(path)


def _missing_columns_letter(f: InputFile, missing: List[str], have: List[str]) -> DeadLetter:
    return DeadLetter(f.path, -1, "missing_columns",
                      f"columns {missing} are missing (the file has {have[:50]}); every record of the "
                      "file is sent to the dead letters", f.index)


class DataError(RuntimeError):
    """The input cannot be turned into examples as the spec and its policies say (names file, record, fix)."""


# Dead-letter reasons after which the rest of a file could not be split into records (TFRecord framing,
# an unterminated CSV quote, a CSV parse error): `policies.lost_framing` decides (error | dead_letter).
FRAMING_REASONS = ("framing_lost", "after_framing_loss")
# Dead letters that stand for a whole file (record -1); every other letter is one record.
FILE_REASONS = ("empty_file", "missing_columns", "bad_header", "not_parquet", "unreadable_file")


def _csv_record_lines(data: bytes, delimiter: str):
    """(start line of every data record, unterminated-quote start line or None) of a CSV file's bytes.

    Line numbers are 1-based (the header is line 1) and count every line break, also those inside
    quoted values, so a record's number is the line it starts on.  Empty lines are not records
    (as in pyarrow's reader).  A quote left open at the end of the file is reported with the line of
    the record it opens in.
    """
    text = data.decode("latin-1")  # one char per byte: line breaks are where they are in the bytes
    old = csv.field_size_limit()
    csv.field_size_limit(1 << 30)
    try:
        reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter, strict=False)
        lines: List[int] = []
        prev = 0
        for row in reader:
            if row:
                lines.append(prev + 1)
            prev = reader.line_num
    finally:
        csv.field_size_limit(old)
    unterminated = None
    if lines and '"' in text:
        last = lines[-1]
        tail = "\n".join(text.split("\n")[last - 1:]) if last > 1 else text
        try:
            for _ in csv.reader(io.StringIO(tail, newline=""), delimiter=delimiter, strict=True):
                pass
        except csv.Error as e:
            if "unexpected end of data" in str(e):
                unterminated = last
    return np.asarray(lines[1:], dtype=np.int64), unterminated


def _line_offset(data: bytes, line: int) -> int:
    """Byte offset where 1-based `line` starts (\\n line breaks)."""
    pos = 0
    for _ in range(line - 1):
        pos = data.find(b"\n", pos) + 1
        if pos == 0:
            return len(data)
    return pos


def _blank_invalid_utf8(data: bytes, record_lines: np.ndarray) -> Tuple[bytes, np.ndarray]:
    """(`data` with every byte that is not UTF-8 replaced by `?`, the lines of the records that had such bytes).

    pyarrow decodes a malformed row's text as UTF-8 before it calls the invalid-row handler; a row
    that is both malformed and not UTF-8 makes that fail (an "Exception ignored" on stderr) and
    stops the reader.  Blanking one byte for one byte keeps the framing and every offset; the
    records that had such bytes are dead-lettered by the reader (`_utf8_letter`), so no value is
    changed silently.
    """
    try:
        data.decode("utf-8")
        return data, np.zeros(0, np.int64)
    except UnicodeDecodeError:
        pass
    original = np.frombuffer(data, np.uint8)
    cleaned = np.frombuffer(data.decode("utf-8", "surrogateescape").encode("utf-8", "replace"), np.uint8)
    invalid = np.flatnonzero(original != cleaned)
    line_starts = np.concatenate([[0], np.flatnonzero(original == ord("\n")) + 1])
    line = np.searchsorted(line_starts, invalid, side="right")  # 1-based line of each invalid byte
    record = np.searchsorted(record_lines, line, side="right") - 1  # the header (line 1) was checked before
    out = original.copy()
    out[invalid] = ord("?")
    return out.tobytes(), np.unique(record_lines[record[record >= 0]])


def _utf8_letter(f: InputFile, data: bytes, line: int, record_lines: np.ndarray, header: List[str],
                 columns: List[str], delimiter: str) -> Optional[DeadLetter]:
    """The invalid_utf8 dead letter of the record at `line` (original bytes), or None when the bytes
    that are not UTF-8 are only in columns the spec does not read."""
    start = _line_offset(data, line)
    nxt = record_lines[np.searchsorted(record_lines, line, side="right"):]
    end = _line_offset(data, int(nxt[0])) if nxt.size else len(data)
    fields = next(csv.reader(io.StringIO(data[start:end].decode("latin-1"), newline=""), delimiter=delimiter), [])
    for name, value in zip(header, fields):
        raw = value.encode("latin-1")
        if name in columns:
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return DeadLetter(f.path, line, "invalid_utf8", f"column {name!r}: {raw[:80]!r} is not UTF-8. Fix: "
                                  "save the file as UTF-8 (CSV is read as UTF-8 text)", f.index)
    return None


def _open_csv(pacsv, data: bytes, columns, csv_delimiter, on_invalid):
    # Values are read as bytes and checked for UTF-8 by the caller, row by row.
    return pacsv.open_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(use_threads=False, block_size=1 << 22),
        parse_options=pacsv.ParseOptions(delimiter=csv_delimiter, invalid_row_handler=on_invalid,
                                         newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(include_columns=columns,
                                             column_types={c: pa.large_binary() for c in columns},
                                             strings_can_be_null=False, quoted_strings_can_be_null=False))


def _read_csv(f: InputFile, columns: List[str], *, csv_delimiter: str, chunk_rows: int, strict: bool):
    import pyarrow.csv as pacsv
    with _open(f.path) as fh:
        data = fh.read()
    if not data.strip():
        if data:
            yield DeadLetter(f.path, -1, "empty_file", "the file has no header and no records", f.index)
        return
    header_end = data.find(b"\n")
    header_line = data[: header_end if header_end >= 0 else len(data)].rstrip(b"\r")
    try:
        header = next(iter(csv.reader([header_line.decode("utf-8")], delimiter=csv_delimiter)))
    except (UnicodeDecodeError, StopIteration, csv.Error):
        yield DeadLetter(f.path, -1, "bad_header", "the header line (line 1) is not UTF-8 CSV; every record of "
                         "the file is sent to the dead letters. Fix: save the file as UTF-8 with a header row",
                         f.index)
        return
    missing = [c for c in columns if c not in header]
    if missing:
        yield _missing_columns_letter(f, missing, header)
        return
    # Record numbers of CSV rows are the line numbers where the records start (the header is line 1),
    # also after quoted values with line breaks.
    record_lines, unterminated = _csv_record_lines(data, csv_delimiter)
    if unterminated is not None:
        cut = _line_offset(data, unterminated)
        nlines = data.count(b"\n", cut) + (0 if data.endswith(b"\n") else 1)
        yield DeadLetter(f.path, unterminated, "framing_lost",
                         f"unterminated quote: a quoted value opened in the record at line {unterminated} is "
                         f"never closed, so lines {unterminated}..{unterminated + nlines - 1} ({len(data) - cut} "
                         "bytes, the rest of the file) cannot be split into records. Fix: close the quote "
                         "(a literal quote inside a quoted value is written \"\")", f.index)
        data = data[:cut]
        record_lines = record_lines[:-1]
        if not data.strip():
            return
    original = data
    data, not_utf8_lines = _blank_invalid_utf8(data, record_lines)

    def line_of(ordinal: int) -> int:
        if ordinal < record_lines.size:
            return int(record_lines[ordinal])
        base = int(record_lines[-1]) if record_lines.size else 1
        return base + 1 + ordinal - record_lines.size

    bad: List[Tuple[int, DeadLetter]] = []  # (ordinal, letter) of malformed rows not yielded yet
    bad_ordinals: set = set()
    reported: set = set()  # ordinals of the malformed rows that were yielded

    def on_invalid(row):
        ordinal = int(row.number) - 2 if row.number is not None else len(bad_ordinals) + read_so_far
        bad_ordinals.add(ordinal)
        bad.append((ordinal, DeadLetter(f.path, line_of(ordinal), "malformed_record",
                                        f"expected {row.expected_columns} columns, got {row.actual_columns}: "
                                        f"{row.text[:200]!r}", f.index)))
        return "skip"

    def drain_bad():
        for ordinal, letter in bad:
            reported.add(ordinal)
            yield letter
        bad.clear()

    def lost_from() -> int:
        """The line of the first record neither yielded in a batch nor reported as malformed."""
        o = next_ordinal
        while o in reported:
            o += 1
        return line_of(o)

    next_ordinal = 0
    try:
        reader = _open_csv(pacsv, data, columns, csv_delimiter, on_invalid)
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        yield from drain_bad()
        yield DeadLetter(f.path, lost_from(), "framing_lost",
                         f"CSV parsing failed in the first block: {str(e)[:200]}; the file cannot be split into "
                         "records from here on", f.index)
        return
    batch_index = 0
    pending: List[Tuple[pa.RecordBatch, np.ndarray]] = []
    pending_rows = 0
    read_so_far = 0

    def ordinals_for(n: int) -> np.ndarray:
        nonlocal next_ordinal
        cand = np.arange(next_ordinal, next_ordinal + n + len(bad_ordinals), dtype=np.int64)
        if bad_ordinals:
            cand = cand[~np.isin(cand, np.fromiter(bad_ordinals, dtype=np.int64, count=len(bad_ordinals)))]
        out = cand[:n]
        if n:
            next_ordinal = int(out[-1]) + 1
        return out

    def lines_of(ordinals: np.ndarray) -> np.ndarray:
        inside = ordinals < record_lines.size
        if inside.all():
            return record_lines[ordinals]
        return np.asarray([line_of(int(o)) for o in ordinals], dtype=np.int64)

    def flush():
        nonlocal batch_index, pending, pending_rows
        table = pa.Table.from_batches([b for b, _ in pending])
        rb = RawBatch(f.index, f.path, batch_index, np.concatenate([lines for _, lines in pending]),
                      {c: table.column(c).combine_chunks().cast(pa.large_string()) for c in columns})
        batch_index += 1
        pending, pending_rows = [], 0
        return rb

    while True:
        try:
            rb = reader.read_next_batch()
        except StopIteration:
            break
        except (pa.ArrowInvalid, UnicodeDecodeError) as e:
            yield from drain_bad()
            yield DeadLetter(f.path, lost_from(), "framing_lost",
                             f"CSV parsing stopped after {read_so_far} records: {e}; the rest of the file cannot "
                             "be split into records", f.index)
            break
        yield from drain_bad()
        ordinals = ordinals_for(rb.num_rows)
        lines = lines_of(ordinals)
        ok = np.ones(rb.num_rows, bool)
        for i in np.flatnonzero(np.isin(lines, not_utf8_lines)):
            letter = _utf8_letter(f, original, int(lines[i]), record_lines, header, columns, csv_delimiter)
            if letter is not None:
                ok[i] = False
                yield letter
        if not ok.all():
            rb = rb.filter(pa.array(ok))
            lines = lines[ok]
        if rb.num_rows:
            pending.append((rb, lines))
            pending_rows += rb.num_rows
            read_so_far += rb.num_rows
        if pending_rows >= chunk_rows:
            yield flush()
    yield from drain_bad()
    if pending_rows:
        yield flush()


def _read_parquet(f: InputFile, columns: List[str], *, csv_delimiter: str, chunk_rows: int, strict: bool):
    import pyarrow.parquet as pq
    with _open(f.path) as fh:
        data = fh.read()
    if not data:
        return
    try:
        pf = pq.ParquetFile(io.BytesIO(data))
    except (pa.ArrowException, OSError, ValueError) as e:
        yield DeadLetter(f.path, -1, "not_parquet", f"not a Parquet file ({str(e)[:200]}). Fix: check inputs.format "
                         "and the input patterns", f.index)
        return
    have = pf.schema_arrow.names
    missing = [c for c in columns if c not in have]
    if missing:
        yield _missing_columns_letter(f, missing, have)
        return
    ordinal = 0
    batches = pf.iter_batches(batch_size=chunk_rows, columns=columns, use_threads=False)
    bi = 0
    while True:
        try:
            rb = next(batches)
        except StopIteration:
            break
        except (pa.ArrowException, OSError, ValueError) as e:
            total = pf.metadata.num_rows if pf.metadata is not None else ordinal
            yield DeadLetter(f.path, ordinal, "framing_lost",
                             f"Parquet data cannot be read from record {ordinal} on ({total - ordinal} of {total} "
                             f"records): {str(e)[:200]}. Fix: re-create or re-copy the file", f.index)
            break
        n = rb.num_rows
        yield RawBatch(f.index, f.path, bi, np.arange(ordinal, ordinal + n, dtype=np.int64),
                       {c: rb.column(c) for c in columns})
        ordinal += n
        bi += 1


def _tfrecord_frames(data: bytes):
    """Walk a TFRecord file: ("ok", pos, payload) | ("corrupt", pos, detail) | ("lost", pos, detail).

    A record whose length field is intact (its CRC matches) but whose data CRC does not is "corrupt":
    that record is bad, the next one starts where the length says. A bad length CRC or a truncated
    record means the framing is "lost" at `pos`; the rest of the file is then scanned for frames
    whose two CRCs both match (each is yielded as ("after_loss", pos, payload)), so that what is lost
    can be counted; bytes between frames are reported as further ("lost", ...) gaps.
    """
    import struct
    import google_crc32c
    from tpu_embed.shards import _mask_crc

    def frame_at(pos):
        if pos + 12 > n:
            return None
        length, = struct.unpack_from("<Q", data, pos)
        if _mask_crc(google_crc32c.value(data[pos:pos + 8])) != struct.unpack_from("<I", data, pos + 8)[0]:
            return None
        end = pos + 12 + length
        if end + 4 > n:
            return None
        return end

    n = len(data)
    pos = 0
    lost = False
    while pos < n:
        end = frame_at(pos)
        if end is None:
            why = ("truncated record header" if pos + 12 > n else
                   "corrupt record length" if _mask_crc(google_crc32c.value(data[pos:pos + 8])) !=
                   struct.unpack_from("<I", data, pos + 8)[0] else "truncated record")
            # Scan for the next frame whose length CRC and data CRC both match.
            nxt = pos + 1
            while nxt < n:
                e = frame_at(nxt)
                if e is not None and _mask_crc(google_crc32c.value(data[nxt + 12:e])) == \
                        struct.unpack_from("<I", data, e)[0]:
                    break
                nxt += 1
            yield "lost", pos, f"{why} at byte {pos}; bytes {pos}..{nxt - 1} cannot be read as records"
            lost = True
            pos = nxt
            continue
        payload = data[pos + 12:end]
        if _mask_crc(google_crc32c.value(payload)) != struct.unpack_from("<I", data, end)[0]:
            yield "corrupt", pos, f"record data CRC mismatch at byte {pos} ({end - pos - 12} bytes)"
        else:
            yield ("after_loss" if lost else "ok"), pos, payload
        pos = end + 4


def _read_tfrecord(f: InputFile, columns: List[str], *, csv_delimiter: str, chunk_rows: int, strict: bool):
    from tfx_bsl.coders import example_coder
    decoder = example_coder.ExamplesToRecordBatchDecoder()
    with _open(f.path) as fh:
        data = fh.read()
    # Record numbers are 0-based record indexes; a lost stretch of framing counts as one record.
    records: List[Tuple[int, bytes]] = []
    letters: List[DeadLetter] = []
    first_loss: Optional[int] = None
    for ordinal, (kind, pos, x) in enumerate(_tfrecord_frames(data)):
        if kind == "ok":
            records.append((ordinal, x))
        elif kind == "corrupt":
            letters.append(DeadLetter(f.path, ordinal, "corrupt_record",
                                      f"record {ordinal}: {x}; the framing is intact, the reader goes on with "
                                      "the next record. Fix: re-create or re-copy the file", f.index))
        elif kind == "lost":
            if first_loss is None:
                first_loss = pos
            letters.append(DeadLetter(f.path, ordinal, "framing_lost",
                                      f"record {ordinal}: TFRecord framing lost: {x}. Every record after it is "
                                      "dead-lettered (policies.lost_framing). Fix: re-create or re-copy the file "
                                      "(a truncated upload or a damaged disk)", f.index))
        else:
            letters.append(DeadLetter(f.path, ordinal, "after_framing_loss",
                                      f"record {ordinal} at byte {pos}: found by scanning for a valid frame after "
                                      f"the framing was lost at byte {first_loss}; not used", f.index))
    for bi, start in enumerate(range(0, len(records), chunk_rows)):
        chunk = [p for _, p in records[start:start + chunk_rows]]
        rows = np.asarray([r for r, _ in records[start:start + chunk_rows]], dtype=np.int64)
        try:
            rb = decoder.DecodeBatch(chunk)
        except Exception:  # noqa: BLE001 - find the records that do not parse, one by one
            good, good_rows = [], []
            for r, payload in zip(rows, chunk, strict=True):
                try:
                    decoder.DecodeBatch([payload])
                except Exception as e:  # noqa: BLE001
                    yield DeadLetter(f.path, int(r), "malformed_record",
                                     f"record {int(r)} is not a tf.train.Example ({str(e)[:200]}). Fix: write "
                                     "tf.train.Example protos, or set inputs.format to the file's format", f.index)
                    continue
                good.append(payload)
                good_rows.append(r)
            if not good:
                continue
            rb = decoder.DecodeBatch(good)
            rows = np.asarray(good_rows, dtype=np.int64)
        cols = {}
        for c in columns:
            idx = rb.schema.get_field_index(c)
            cols[c] = rb.column(idx) if idx >= 0 else pa.nulls(rb.num_rows, pa.large_list(pa.large_binary()))
        yield RawBatch(f.index, f.path, bi, rows, cols)
    yield from letters


# ---------------------------------------------------------------- output files

@dataclasses.dataclass
class FileInfo:
    path: str  # relative to the artifact directory
    sha256: str
    bytes: int
    records: Optional[int] = None
    extra: Optional[dict] = None

    def to_json(self) -> dict:
        d = {"path": self.path, "sha256": self.sha256, "bytes": self.bytes}
        if self.records is not None:
            d["records"] = self.records
        if self.extra:
            d.update(self.extra)
        return d


def join(base: str, *parts: str) -> str:
    return tio.join(base, *parts)


def write_atomic(base: str, rel: str, chunks, records: Optional[int] = None, extra=None) -> FileInfo:
    """Write `chunks` (bytes or an iterable of bytes) to base/rel atomically (`tpu_embed.io.write_atomic`)."""
    written = tio.write_atomic(join(base, rel), chunks)
    return FileInfo(rel, written.sha256, written.bytes, records, extra)


def read_bytes(path: str) -> bytes:
    return tio.read_bytes(path)
