"""What the readers yield and the errors of a read: input files and splits, raw record batches, dead letters.

Readers work per *input split* (`pipelines.read.splits`) and yield `RawBatch`es (Arrow columns + the record
number of every row) plus `DeadLetter`s for what cannot be read; they never drop anything silently.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

DEFAULT_CHUNK_ROWS = 32768

# Dead-letter reasons after which the rest of a file could not be split into records (TFRecord framing,
# an unterminated CSV quote, a CSV parse error): `policies.lost_framing` decides (error | dead_letter).
FRAMING_REASONS = ("framing_lost", "after_framing_loss")
# Dead letters that stand for a whole file (record -1); every other letter is one record.
FILE_REASONS = ("empty_file", "missing_columns", "bad_header", "not_parquet", "unreadable_file")


class StrictModeError(RuntimeError):
    """--strict: the first bad record stops the job; the message names file and record."""


class DataError(RuntimeError):
    """The input cannot be turned into examples as the spec and its policies say (names file, record, fix)."""


@dataclasses.dataclass(frozen=True)
class InputFile:
    index: int  # position in the sorted list of all matched files
    path: str
    size: int


@dataclasses.dataclass(frozen=True)
class InputSplit:
    """Bytes [start, end) of an input file: the records that *start* there (the last split: to the end)."""
    file: InputFile
    index: int  # 0-based split of the file
    count: int  # splits of the file
    start: int
    end: int

    @property
    def last(self) -> bool:
        return self.index == self.count - 1


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

    def describe(self) -> str:
        """"FILE record N: reason: detail" ("FILE whole file: ..." for a letter of the whole file)."""
        return describe_letter(self.to_json())


def describe_letter(d: dict) -> str:
    """A dead letter (`DeadLetter.to_json`, or a line of a dead-letter file) in the words of the jobs' errors."""
    where = f"record {d['record']}" if d["record"] >= 0 else "whole file"
    return f"{d['file']} {where}: {d['reason']}: {d['detail']}"


@dataclasses.dataclass
class RawBatch:
    file_index: int
    path: str
    batch_index: int
    record_numbers: np.ndarray  # int64, per row, increasing
    columns: Dict[str, pa.Array]
    # Columns given dictionary-encoded instead (read_split's `encode`): column -> (its token delimiter or None,
    # int64 tokens per row, the non-blank tokens as token_index.DICTIONARY_TYPE in first-seen order).
    encoded: Dict[str, Tuple[Optional[str], np.ndarray, pa.Array]] = dataclasses.field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return int(self.record_numbers.size)


@dataclasses.dataclass
class Deferred:
    """Work of a reader that need not run in its thread: decoding or splitting one batch of records it framed.
    `run()` gives the `RawBatch`es and `DeadLetter`s it stands for, in order. A reader yields these where
    its caller may spread them over threads (`pipelines.read.splits.read_split`'s `deferred`)."""
    fn: Callable[..., Iterable[Any]]
    args: Tuple[Any, ...] = ()

    def run(self) -> List[Any]:
        return list(self.fn(*self.args))


def missing_columns_letter(f: InputFile, missing: List[str], have: List[str]) -> DeadLetter:
    """The whole-file letter of a file without some columns the spec reads: the missing ones (the first five)
    and, for each of the first three, the file's columns closest to it (case ignored), never every column."""
    return DeadLetter(f.path, -1, "missing_columns", f"{missing_columns(missing, have)}; every record of the file "
                      "is sent to the dead letters", f.index)


def missing_columns(missing: Sequence[str], have: Sequence[str]) -> str:
    """"column 'C7' is missing (the file has 39 columns; 'C7': did you mean 'c7'?)", for a message."""
    import difflib
    shown = ", ".join(repr(c) for c in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    by_lower: Dict[str, List[str]] = {}
    for c in have:
        by_lower.setdefault(c.lower(), []).append(c)
    hints = []
    for c in missing[:3]:
        close = [h for x in difflib.get_close_matches(c.lower(), list(by_lower), n=3, cutoff=0.6) for h in by_lower[x]]
        if close:
            hints.append(f"{c!r}: did you mean {' or '.join(repr(h) for h in close[:3])}?")
    one = len(missing) == 1
    return (f"{'column' if one else 'columns'} {shown} {'is' if one else 'are'} missing (the file has {len(have)} "
            f"columns{'; ' + '; '.join(hints) if hints else ''})")


def some_files(paths: Sequence[str], most: int = 3) -> str:
    """The files for a message: every path up to `most`, else the first `most` and how many more."""
    shown = ", ".join(paths[:most])
    return shown if len(paths) <= most else f"{shown} and {len(paths) - most} more"


def one_array(col: pa.ChunkedArray) -> pa.Array:
    """The column as one array; without a copy when it is one chunk (combine_chunks copies even then)."""
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
