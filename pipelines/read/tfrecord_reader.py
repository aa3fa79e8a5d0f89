"""TFRecord files of tf.train.Example -> `RawBatch`es, going on after damage.

A TFRecord file is one split. Frames come from the one TFRecord codec (`tpu_embed.artifact.tfrecord.scan_frames`):
a record whose data CRC fails is one dead letter and the reader goes on; where the framing is lost, the rest
of the file is scanned for valid frames so that what is lost can be counted (dead-lettered, not used).

A key may hold any value kind (bytes_list, int64_list, float_list), and its kind may change from record to
record: a batch where it does gives that key's values as text (an integer its decimal text, a float the repr of
its float64 value: `value_kinds`), the tokens the same values of one kind give, and the numbers a CSV cell of
that text gives. A Feature with no kind set is no value, as a missing key is.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa

from pipelines.read import source, value_kinds
from pipelines.read.csv_scan import csv_native
from pipelines.read.records import DeadLetter, Deferred, InputFile, InputSplit, RawBatch
from pipelines.read.source import Source
from tpu_embed.artifact import tfrecord


def read_tfrecord(split: InputSplit, columns: List[str], *, chunk_rows: int, **_):
    """Frames in this thread; each batch of chunk_rows payloads decoded by a `Deferred` (tfx_bsl's decoder lets
    go of the GIL for most of its work: two batches decode side by side on two threads)."""
    f = split.file
    # Record numbers are 0-based record indexes; a lost stretch of framing counts as one record.
    first_loss: Optional[int] = None
    payloads: List[bytes] = []
    first_row = 0  # the record number of payloads[0]
    ordinal = 0
    bi = 0

    def decode(batch: List[bytes], first: int) -> Deferred:
        nonlocal bi
        bi += 1
        return Deferred(_decode_examples, (f, columns, batch, np.arange(first, first + len(batch)), bi - 1))

    with source.open_input(f.path) as fh:
        for kind, pos, x in _frames(Source(fh), chunk_rows):
            if kind == "ok":
                if not payloads:
                    first_row = ordinal
                payloads += x
                ordinal += len(x)
                while len(payloads) >= chunk_rows:
                    yield decode(payloads[:chunk_rows], first_row)
                    payloads, first_row = payloads[chunk_rows:], first_row + chunk_rows
                continue
            if payloads:
                yield decode(payloads, first_row)
                payloads = []
            if kind == "corrupt":
                yield DeadLetter(f.path, ordinal, "corrupt_record",
                                 f"record {ordinal}: {x}; the framing is intact, the reader goes on with "
                                 "the next record. Fix: re-create or re-copy the file", f.index)
                ordinal += 1
            elif kind == "lost":
                if first_loss is None:
                    first_loss = pos
                yield DeadLetter(f.path, ordinal, "framing_lost",
                                 f"record {ordinal}: TFRecord framing lost: {x}. Every record after it is "
                                 "dead-lettered (policies.lost_framing). Fix: re-create or re-copy the file "
                                 "(a truncated upload or a damaged disk)", f.index)
                ordinal += 1
            else:  # after_loss: the records found by scanning, each at its own offset
                for payload in x:
                    yield DeadLetter(f.path, ordinal, "after_framing_loss",
                                     f"record {ordinal} at byte {pos}: found by scanning for a valid frame after "
                                     f"the framing was lost at byte {first_loss}; not used", f.index)
                    ordinal += 1
                    pos += tfrecord.FRAME_OVERHEAD + len(payload)
    if payloads:
        yield decode(payloads, first_row)


def _frames(src: Source, most: int) -> Iterator[Tuple[str, int, Any]]:
    """The events of `tfrecord.scan_frames(src, most, READ_BYTES)`: natively while the frames are good (the
    native module's `tfrecord_frames`: both CRC32Cs of every frame checked without the GIL, ~10x faster than a
    frame at a time in Python); from the first frame that is not (a CRC that does not match, the file's
    truncated end), `scan_frames` itself decides, over the file from its start, its events before that frame
    left out (they are the good frames given already). Memory: one read plus the largest record."""
    native = csv_native()
    if native is None:
        yield from tfrecord.scan_frames(src, most, source.READ_BYTES)
        return
    size, pos, base, buf = src.size, 0, 0, b""
    while pos < size:
        payloads, end, bad = native.tfrecord_frames(buf, pos - base, most)
        if payloads:
            yield "ok", pos, payloads
            pos = base + end
        if bad:
            break
        if payloads and len(payloads) == most:
            continue  # the buffer may hold more
        got = base + len(buf)  # the frame at pos is not whole in the buffer: read on
        if got >= size:
            break  # the file ends inside it
        need = tfrecord.FRAME_OVERHEAD
        if got - pos >= 8:
            need += int.from_bytes(buf[pos - base:pos - base + 8], "little")
        buf = buf[pos - base:] + src.read(got, max(source.READ_BYTES, min(need, size - pos) - (got - pos)))
        base = pos
    if pos >= size:
        return
    for kind, at, x in tfrecord.scan_frames(src, most, source.READ_BYTES):
        if kind == "ok" and at < pos:  # frames given already (all good: the events before pos are "ok" runs)
            keep, p = [], at
            for payload in x:
                if p >= pos:
                    keep.append(payload)
                p += tfrecord.FRAME_OVERHEAD + len(payload)
            if keep:
                yield "ok", pos, keep
            continue
        yield kind, at, x


def _decode_examples(f: InputFile, columns: List[str], payloads: List[bytes], rows_: np.ndarray, bi: int):
    """tf.train.Examples -> one RawBatch (tfx_bsl's batch decoder). A batch it refuses (a record that is not an
    Example, or a key whose value kind differs between records) is read by `_decode_apart`."""
    # tfx_bsl's decoder takes 0.17 s to import: only where a TFRecord input is read.
    from tfx_bsl.coders import example_coder
    decoder = example_coder.ExamplesToRecordBatchDecoder()  # one per batch: a microsecond, and no shared state
    rows = np.asarray(rows_, dtype=np.int64)
    try:
        rb = decoder.DecodeBatch(payloads)
    except Exception:  # noqa: BLE001 - a record that does not parse, or a key of two kinds: see _decode_apart
        yield from _decode_apart(f, columns, payloads, rows, bi)
        return
    cols = {}
    for c in columns:
        col = _present(rb, c)
        cols[c] = pa.nulls(rb.num_rows, _NO_VALUES) if col is None else col
    yield RawBatch(f.index, f.path, bi, rows, cols)


_NO_VALUES = pa.large_list(pa.large_binary())  # a key no record of the batch gives a value kind


def _present(rb: pa.RecordBatch, column: str) -> Optional[pa.Array]:
    """The column of a decoded batch, or None where no record has the key with a value kind (missing, or a
    Feature with no kind set: tfx_bsl gives a column of type null, which is no value)."""
    idx = rb.schema.get_field_index(column)
    if idx < 0 or pa.types.is_null(rb.schema.field(idx).type):
        return None
    return rb.column(idx)


def _decode_apart(f: InputFile, columns: List[str], payloads: List[bytes], rows: np.ndarray, bi: int):
    """A batch that tfx_bsl's decoder refuses as a whole. The records are grouped by the value kind of each key
    read (`value_kinds.record_kinds`) and each group is decoded by a decoder given those kinds (keys not read
    are not decoded, whatever their kinds). A key read whose kind differs between the records of the batch
    comes out as the text of its values (`value_kinds.list_as_text`: an integer its decimal text, a float the
    repr of its float64 value), as a CSV cell holds them. Within a group that still does not decode, each
    record is decoded alone: one that is not a tf.train.Example is a dead letter."""
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.coders import example_coder
    schema_type = {"bytes_list": schema_pb2.BYTES, "float_list": schema_pb2.FLOAT, "int64_list": schema_pb2.INT}
    kinds = value_kinds.record_kinds(payloads, columns)
    seen = [set(s) - {None} for s in zip(*[k for k in kinds if k is not None])] or [set() for _ in columns]
    # A key of one kind (or none) in the batch: that kind for every record, also where it is missing. A key of
    # several kinds: a group per kind (a record without it goes with one of them).
    fixed = [min(s) if s else "bytes_list" for s in seen]
    mixed = [j for j, s in enumerate(seen) if len(s) > 1]
    groups: Dict[Optional[Tuple[str, ...]], List[int]] = {}
    for i, k in enumerate(kinds):
        key = None if k is None else tuple([k[j] or fixed[j] for j in mixed])
        groups.setdefault(key, []).append(i)
    plain = example_coder.ExamplesToRecordBatchDecoder()
    pieces: List[Tuple[np.ndarray, Dict[str, Optional[pa.Array]]]] = []
    letters = []
    for key, idx in groups.items():
        if key is not None:
            kind_of = dict(zip(mixed, key, strict=True))
            schema = schema_pb2.Schema()
            for j, c in enumerate(columns):
                schema.feature.add(name=c, type=schema_type[kind_of.get(j, fixed[j])])
            try:
                rb = example_coder.ExamplesToRecordBatchDecoder(schema.SerializeToString()).DecodeBatch(
                    [payloads[i] for i in idx])
                pieces.append((np.asarray(idx, dtype=np.int64), {c: _present(rb, c) for c in columns}))
                continue
            except Exception:  # noqa: BLE001 - a record of the group that does not parse: record by record
                pass
        for i in idx:
            try:
                rb = plain.DecodeBatch([payloads[i]])
            except Exception as e:  # noqa: BLE001
                r = int(rows[i])
                letters.append(DeadLetter(
                    f.path, r, "malformed_record",
                    f"record {r} is not a tf.train.Example ({str(e)[:200]}). Fix: write tf.train.Example protos, "
                    "or set inputs.format to the file's format", f.index))
                continue
            pieces.append((np.asarray([i], dtype=np.int64), {c: _present(rb, c) for c in columns}))
    yield from sorted(letters, key=lambda x: x.record)
    if not pieces:
        return
    order = np.concatenate([p[0] for p in pieces])
    cols = {c: _merge([(len(p[0]), p[1][c]) for p in pieces]) for c in columns}
    if order.size > 1 and not np.all(order[1:] > order[:-1]):
        perm = np.argsort(order, kind="stable")
        take = pa.array(perm)
        cols = {c: a.take(take) for c, a in cols.items()}
        order = order[perm]
    yield RawBatch(f.index, f.path, bi, rows[order], cols)


def _merge(parts: List[Tuple[int, Optional[pa.Array]]]) -> pa.Array:
    """One column from the groups' pieces (row count, column or None where it has no values): as decoded where
    every piece has one kind; else every piece as text."""
    types = {a.type for _, a in parts if a is not None}
    if not types:
        return pa.nulls(sum(n for n, _ in parts), _NO_VALUES)
    if len(types) == 1:
        t = next(iter(types))
        arrays = [pa.nulls(n, t) if a is None else a for n, a in parts]
    else:
        arrays = [pa.nulls(n, _NO_VALUES) if a is None else value_kinds.list_as_text(a) for n, a in parts]
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)
