"""Input files -> splits, and the reading of one split in any format.

A split is a byte range of one file (`plan_splits`): CSV files are split by byte range, Parquet files by
row group (a row group belongs to the split holding its first byte), TFRecord files are one split each.
Every record belongs to exactly one split, so the records, their numbers and the dead letters are the same
for any split size and any number of workers (docs/explanation/reads.md).
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from pipelines import progress
from pipelines.read import csv_reader, parquet_reader, tfrecord_reader
from pipelines.read.records import DEFAULT_CHUNK_ROWS, DeadLetter, Deferred, InputFile, InputSplit, StrictModeError
from tpu_embed.artifact import io as tio

DEFAULT_SPLIT_BYTES = 64 << 20  # input files larger than this are read by several workers


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


def whole_file(f: InputFile) -> InputSplit:
    return InputSplit(f, 0, 1, 0, f.size)


def plan_splits(fmt: str, files: Sequence[InputFile], split_bytes: int = DEFAULT_SPLIT_BYTES) -> List[InputSplit]:
    """The splits of every file: [k*split_bytes, (k+1)*split_bytes) for CSV and Parquet, whole TFRecord files."""
    if split_bytes < 1:
        raise ValueError(f"split size must be a positive number of bytes, got {split_bytes}")
    out = []
    for f in files:
        count = 1 if fmt == "tfrecord" or f.size <= split_bytes else -(-f.size // split_bytes)
        for k in range(count):
            out.append(InputSplit(f, k, count, k * split_bytes, f.size if k == count - 1 else (k + 1) * split_bytes))
    return out


# ---------------------------------------------------------------- readers

def read_split(fmt: str, split: InputSplit, columns: Sequence[str], *, csv_delimiter: str = ",",
               chunk_rows: int = DEFAULT_CHUNK_ROWS, strict: bool = False,
               csv_state: Optional[Tuple[int, int]] = None,
               encode: Optional[Mapping[str, Optional[str]]] = None, deferred: bool = False) -> Iterator[object]:
    """Yield `RawBatch` and `DeadLetter` objects for the records that start in one split.

    Whole-file letters come from the file's split 0 only. `csv_state` is the CSV quote state and line
    count at the split's start (`csv_scan.csv_split_states`); without it a split of a CSV file that is not the
    first computes it by scanning the bytes before it. `encode`: {column: token delimiter or None} of
    columns a CSV batch of plain records may give dictionary-encoded (`RawBatch.encoded`,
    `pipelines.read.parse.encodable_columns`) instead of as strings.

    `deferred`: the decoding of each batch of framed records (CSV, TFRecord) comes as a `Deferred` whose
    `run()` gives its items, for the caller to run, in order, on threads of its own
    (`pipelines.jobs.read_examples`); else it runs here.
    """
    f = split.file
    readers = {"csv": csv_reader.read_csv, "tfrecord": tfrecord_reader.read_tfrecord,
               "parquet": parquet_reader.read_parquet}
    any_rows = False
    for item in readers[fmt](split, list(columns), csv_delimiter=csv_delimiter, chunk_rows=chunk_rows,
                             csv_state=csv_state, encode=dict(encode or {})):
        if isinstance(item, Deferred):
            if deferred:
                yield Deferred(_checked_all, (item, f.index))
            else:
                yield from _checked_all(item, f.index)
            continue  # a batch's records start after a header or record: never a file's only letter
        if isinstance(item, DeadLetter):
            item.file_index = f.index
            if strict and item.record < 0:  # record-level letters: the caller raises on the first one
                raise StrictModeError(f"--strict: {item.describe()}")
        elif item.num_rows:
            any_rows = True
            progress.advance(item.num_rows)
        yield item
    if split.index == 0 and not any_rows and f.size == 0:
        dl = DeadLetter(f.path, -1, "empty_file", "the file is empty (0 bytes)", f.index)
        if strict:
            raise StrictModeError(f"--strict: {f.path}: empty file")
        yield dl


def _checked_all(work: Deferred, file_index: int) -> Iterator[object]:
    """A batch's items as `read_split` gives the others (its letters are records' letters)."""
    for item in work.run():
        if isinstance(item, DeadLetter):
            item.file_index = file_index
        elif item.num_rows:
            progress.advance(item.num_rows)
        yield item


def read_file(fmt: str, f: InputFile, columns: Sequence[str], *, csv_delimiter: str = ",",
              chunk_rows: int = DEFAULT_CHUNK_ROWS, strict: bool = False,
              encode: Optional[Mapping[str, Optional[str]]] = None) -> Iterator[object]:
    """Yield `RawBatch` and `DeadLetter` objects for one input file (one split)."""
    return read_split(fmt, whole_file(f), columns, csv_delimiter=csv_delimiter, chunk_rows=chunk_rows,
                      strict=strict, encode=encode)
