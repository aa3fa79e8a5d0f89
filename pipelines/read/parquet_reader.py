"""Parquet files -> `RawBatch`es: the row groups that start in a split, checked as they are read.

A row group belongs to the split that holds its first byte (as the footer's row-group sizes place it);
record numbers count the rows before it. pyarrow does not check what it decodes, so every column read is
validated: a damaged page loses the rest of its row group (one framing_lost letter), a string that is not
UTF-8 loses its record.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.read import source
from pipelines.read.records import DeadLetter, InputFile, InputSplit, RawBatch, missing_columns_letter
from pipelines.read.source import Source


def _row_group_starts(md, size: int) -> List[int]:
    """Where each row group starts in the file, as the footer's row-group sizes place them: row group g at
    size * (bytes of the row groups before g) / (bytes of all). Only row-group metadata is read (pyarrow's
    column-chunk metadata of a damaged footer can abort the process instead of raising)."""
    sizes = [max(int(md.row_group(g).total_byte_size), 0) for g in range(md.num_row_groups)]
    total = sum(sizes)
    out, before = [], 0
    for n in sizes:
        out.append(size * before // total if total else 0)
        before += n
    return out


def read_parquet(split: InputSplit, columns: List[str], *, chunk_rows: int, **_):
    f = split.file
    with source.open_input(f.path) as fh:
        if Source(fh).size == 0:
            return
        fh.seek(0)
        try:
            # pre_buffer=False: pre-buffering reads ahead on Arrow's I/O thread pool (through this Python file
            # object), and a pool worker alive when the process exits can abort it (exit 134).
            pf = pq.ParquetFile(fh, pre_buffer=False)
            md = pf.metadata
            have = pf.schema_arrow.names
        except (pa.ArrowException, OSError, ValueError) as e:
            if split.index == 0:
                yield DeadLetter(f.path, -1, "not_parquet", f"not a Parquet file ({str(e)[:200]}). Fix: check "
                                 "inputs.format and the input patterns", f.index)
            return
        missing = [c for c in columns if c not in have]
        if missing:
            if split.index == 0:
                yield missing_columns_letter(f, missing, have)
            return
        # A row group belongs to the split that holds its start; record numbers count the rows before it.
        starts = _row_group_starts(md, f.size) if split.count > 1 else [0] * md.num_row_groups
        first = 0
        merged: List[RawBatch] = []  # batches of small row groups, given on together up to chunk_rows rows
        bi = 0
        for g, off in enumerate(starts):
            n = int(md.row_group(g).num_rows)
            if (off >= split.start or split.index == 0) and (off < split.end or split.last):
                for item in _row_group(pf, g, first, n, f, columns, chunk_rows):
                    if not isinstance(item, RawBatch):
                        yield item
                        continue
                    if merged and sum(b.num_rows for b in merged) + item.num_rows > chunk_rows:
                        yield _merge(merged, bi)
                        merged, bi = [], bi + 1
                    merged.append(item)
            first += max(n, 0)
        if merged:
            yield _merge(merged, bi)


def _merge(batches: List[RawBatch], bi: int) -> RawBatch:
    b = batches[0]
    if len(batches) == 1:
        return dataclasses.replace(b, batch_index=bi)
    return RawBatch(b.file_index, b.path, bi, np.concatenate([x.record_numbers for x in batches]),
                    {c: pa.concat_arrays([x.columns[c] for x in batches]) for c in b.columns})


def _row_group(pf, g: int, first: int, n: int, f: InputFile, columns: List[str], chunk_rows: int):
    """The records of row group g (records first..first+n-1); reading stops at the first damaged page (the
    rest of the row group is one framing_lost letter) and goes on with the next row group."""
    got = 0
    batches = pf.iter_batches(batch_size=chunk_rows, row_groups=[g], columns=columns, use_threads=False)
    while got < n:
        rb = None
        try:
            rb = next(batches)
        except StopIteration:
            problem = f"the row group ends after {got} of the {n} records its metadata lists"
        except (pa.ArrowException, OSError, ValueError, IndexError) as e:
            problem = str(e)[:200]
        else:
            checked = {c: _check_column(rb.column(c)) for c in columns}
            damage = next((f"column {c!r}: {why}" for c, (why, _) in checked.items() if why), None)
            if damage is not None:
                problem = damage
                rb = None
        if rb is not None:
            k = rb.num_rows
            over = k > n - got  # more rows than the metadata lists: the last number is the letter's
            take = n - got - 1 if over else k
            if take:
                numbers = np.arange(first + got, first + got + take, dtype=np.int64)
                cols = {c: rb.column(c).slice(0, take) for c in columns}
                ok = np.ones(take, bool)
                for c in columns:
                    for r, value in checked[c][1]:
                        if r < take and ok[r]:
                            ok[r] = False
                            yield DeadLetter(f.path, int(numbers[r]), "invalid_utf8",
                                             f"column {c!r}: {value[:80]!r} is not UTF-8. Fix: write string "
                                             "columns as UTF-8 (Parquet's string type is UTF-8)", f.index)
                if not ok.all():
                    keep = pa.array(ok)
                    numbers, cols = numbers[ok], {c: v.filter(keep) for c, v in cols.items()}
                if numbers.size:
                    yield RawBatch(f.index, f.path, 0, numbers, cols)
                got += take
            if not over:
                continue
            problem = f"the row group holds more than the {n} records its metadata lists"
        yield DeadLetter(f.path, first + got, "framing_lost",
                         f"Parquet data cannot be read from record {first + got} on ({n - got} of the {n} records of "
                         f"row group {g}): {problem}. Fix: re-create or re-copy the file", f.index)
        return


def _binary_view(t):
    """The type with every string replaced by binary (the same buffers, no UTF-8 to check)."""
    if pa.types.is_string(t):
        return pa.binary()
    if pa.types.is_large_string(t):
        return pa.large_binary()
    if pa.types.is_list(t):
        return pa.list_(_binary_view(t.value_type))
    if pa.types.is_large_list(t):
        return pa.large_list(_binary_view(t.value_type))
    return t


def _check_column(col) -> Tuple[Optional[str], List[Tuple[int, bytes]]]:
    """(why a column read from a Parquet file is not a well-formed Arrow array, or None; the (row, value) of
    its strings that are not UTF-8).

    pyarrow does not check what it decodes: a damaged page can give list offsets that point anywhere
    (then the rest of the row group is lost), and a string column can hold bytes that are not UTF-8
    (then only that record is dead-lettered). One full validation when all is well.
    """
    try:
        col.validate(full=True)
        return None, []
    except (pa.ArrowException, ValueError, TypeError):
        pass
    try:
        col.view(_binary_view(col.type)).validate(full=True)
    except (pa.ArrowException, ValueError, TypeError) as e:
        return str(e)[:200], []
    values, rows = col, None
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type):
        values, rows = pc.list_flatten(col), pc.list_parent_indices(col).to_numpy(zero_copy_only=False)
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        return "the column does not validate", []
    out = []
    for i, v in enumerate(values.cast(pa.large_binary()).to_pylist()):
        if v is not None:
            try:
                v.decode("utf-8")
            except UnicodeDecodeError:
                out.append((i if rows is None else int(rows[i]), v))
    return None, out
