"""Input files -> Arrow record batches, and atomic output files.

Readers work per file and yield `RawBatch`es (Arrow columns + the record
number of every row) plus `DeadLetter`s for what cannot be read; they never
drop anything silently.  All file access goes through `tpu_embed.io`
(local paths and object stores alike: gs://, s3://, ...), on the launcher and
on the workers of any runner.
"""

from __future__ import annotations

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
    record: int  # csv: line number (1 = header); tfrecord / parquet: 0-based record index; -1: whole file
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
        header = next(iter(__import__("csv").reader([header_line.decode("utf-8")], delimiter=csv_delimiter)))
    except (UnicodeDecodeError, StopIteration):
        yield DeadLetter(f.path, 1, "bad_header", "the header line is not UTF-8 CSV", f.index)
        return
    missing = [c for c in columns if c not in header]
    if missing:
        yield _missing_columns_letter(f, missing, header)
        return
    bad: List[DeadLetter] = []

    def on_invalid(row):
        bad.append(DeadLetter(f.path, int(row.number) if row.number is not None else -1, "malformed_record",
                              f"expected {row.expected_columns} columns, got {row.actual_columns}: "
                              f"{row.text[:200]!r}", f.index))
        return "skip"

    reader = pacsv.open_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(use_threads=False, block_size=1 << 22),
        parse_options=pacsv.ParseOptions(delimiter=csv_delimiter, invalid_row_handler=on_invalid,
                                         newlines_in_values=True),
        convert_options=pacsv.ConvertOptions(include_columns=columns,
                                             column_types={c: pa.large_string() for c in columns},
                                             strings_can_be_null=False, quoted_strings_can_be_null=False))
    # Record numbers of CSV rows are line numbers (the header is line 1), as in the invalid-row
    # reports of pyarrow; values with embedded newlines shift them (they stay ordered and unique).
    next_line = 2
    skip: set = set()
    batch_index = 0
    pending: List[Tuple[pa.RecordBatch, np.ndarray]] = []
    pending_rows = 0
    read_so_far = 0

    def lines_for(n: int) -> np.ndarray:
        nonlocal next_line
        if not skip:
            out = np.arange(next_line, next_line + n, dtype=np.int64)
        else:
            cand = np.arange(next_line, next_line + n + len(skip), dtype=np.int64)
            cand = cand[~np.isin(cand, np.fromiter(skip, dtype=np.int64, count=len(skip)))]
            out = cand[:n]
        if n:
            next_line = int(out[-1]) + 1
            for x in [x for x in skip if x < next_line]:
                skip.discard(x)
        return out

    def flush():
        nonlocal batch_index, pending, pending_rows
        table = pa.Table.from_batches([b for b, _ in pending])
        rb = RawBatch(f.index, f.path, batch_index, np.concatenate([lines for _, lines in pending]),
                      {c: table.column(c).combine_chunks() for c in columns})
        batch_index += 1
        pending, pending_rows = [], 0
        return rb

    while True:
        try:
            rb = reader.read_next_batch()
        except StopIteration:
            break
        except (pa.ArrowInvalid, UnicodeDecodeError) as e:
            yield DeadLetter(f.path, -1, "unreadable_file",
                             f"CSV parsing stopped after {read_so_far} records: {e}", f.index)
            break
        for dl in bad:
            if dl.record >= 0:
                skip.add(dl.record)
        yield from bad
        bad.clear()
        pending.append((rb, lines_for(rb.num_rows)))
        pending_rows += rb.num_rows
        read_so_far += rb.num_rows
        if pending_rows >= chunk_rows:
            yield flush()
    yield from bad
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
    except (pa.ArrowInvalid, OSError) as e:
        yield DeadLetter(f.path, -1, "unreadable_file", f"not a Parquet file: {e}", f.index)
        return
    have = pf.schema_arrow.names
    missing = [c for c in columns if c not in have]
    if missing:
        yield _missing_columns_letter(f, missing, have)
        return
    ordinal = 0
    for bi, rb in enumerate(pf.iter_batches(batch_size=chunk_rows, columns=columns, use_threads=False)):
        n = rb.num_rows
        yield RawBatch(f.index, f.path, bi, np.arange(ordinal, ordinal + n, dtype=np.int64),
                       {c: rb.column(c) for c in columns})
        ordinal += n


def _read_tfrecord(f: InputFile, columns: List[str], *, csv_delimiter: str, chunk_rows: int, strict: bool):
    from tfx_bsl.coders import example_coder
    decoder = example_coder.ExamplesToRecordBatchDecoder()
    with _open(f.path) as fh:
        data = fh.read()
    records: List[bytes] = []
    corrupt: Optional[str] = None
    try:
        for _, payload in iter_tfrecords(data):
            records.append(payload)
    except ValueError as e:
        corrupt = str(e)
    ordinal = 0
    for bi, start in enumerate(range(0, len(records), chunk_rows)):
        chunk = records[start:start + chunk_rows]
        rows = np.arange(ordinal, ordinal + len(chunk), dtype=np.int64)
        ordinal += len(chunk)
        try:
            rb = decoder.DecodeBatch(chunk)
        except Exception:  # noqa: BLE001 - find the records that do not parse, one by one
            good, good_rows = [], []
            for r, payload in zip(rows, chunk, strict=True):
                try:
                    decoder.DecodeBatch([payload])
                except Exception as e:  # noqa: BLE001
                    yield DeadLetter(f.path, int(r), "malformed_record", f"not a tf.train.Example: {e}", f.index)
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
    if corrupt is not None:
        yield DeadLetter(f.path, -1, "unreadable_file",
                         f"TFRecord framing is broken after {ordinal} records ({corrupt}); the rest of the file "
                         "cannot be read", f.index)


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
