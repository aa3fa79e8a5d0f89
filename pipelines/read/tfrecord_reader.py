"""TFRecord files of tf.train.Example -> `RawBatch`es, going on after damage.

A TFRecord file is one split. Frames come from the one TFRecord codec (`tpu_embed.artifact.tfrecord.scan_frames`):
a record whose data CRC fails is one dead letter and the reader goes on; where the framing is lost, the rest
of the file is scanned for valid frames so that what is lost can be counted (dead-lettered, not used).
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional, Tuple

import numpy as np
import pyarrow as pa

from pipelines.read import source
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
    """tf.train.Examples -> one RawBatch (tfx_bsl's batch decoder); records that are not Examples are found one
    by one and dead-lettered."""
    # tfx_bsl's decoder takes 0.17 s to import: only where a TFRecord input is read.
    from tfx_bsl.coders import example_coder
    decoder = example_coder.ExamplesToRecordBatchDecoder()  # one per batch: a microsecond, and no shared state
    rows = np.asarray(rows_, dtype=np.int64)
    try:
        rb = decoder.DecodeBatch(payloads)
    except Exception:  # noqa: BLE001 - find the records that do not parse, one by one
        good, good_rows = [], []
        for r, payload in zip(rows_, payloads, strict=True):
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
            return
        rb = decoder.DecodeBatch(good)
        rows = np.asarray(good_rows, dtype=np.int64)
    cols = {}
    for c in columns:
        idx = rb.schema.get_field_index(c)
        cols[c] = rb.column(idx) if idx >= 0 else pa.nulls(rb.num_rows, pa.large_list(pa.large_binary()))
    yield RawBatch(f.index, f.path, bi, rows, cols)
