"""The `tf.data` input of the training side: an artifact's shards as one element per training step.

    ds = input_fn(artifact_dir, host_index=h)   # this host's steps, in step order (or shuffled by step)
    ds = input_fn([day1, day2, day3])           # a window of days of one lineage, oldest first
    dequeue_inputs(element["sparse_core"][c])   # chip c's CSR tensors as `TPUEmbeddingV2.dequeue` takes them
    per_chip_dataset(artifact_dir, h)           # one element per chip of each step, static shapes (TPU infeed)

The manifest says where the host's files are and how they are encoded (`tpu_embed.artifact.manifest`,
`shard_format`); `tpu_embed.artifact.verify` checks them; the records are read by TensorFlow's
`TFRecordDataset` or by `tpu_embed.artifact.tfrecord` (object stores, shuffled steps) and parsed by
`tpu_embed.training.shard_parse.parse_fn`.  TensorFlow is imported when a dataset is built.

A window (a list of artifact directories) is read as one dataset: the days' steps one day after the other,
or permuted together (`shuffle_steps`), after `tpu_embed.artifact.lineage.check_window` has checked that one
model reads them all; each day's records are parsed with its own format and padded to the window's buffers
(`window_format`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tpu_embed.artifact import io as tio
from tpu_embed.artifact import tfrecord
from tpu_embed.artifact.lineage import ArtifactDirs, check_window_formats, window
from tpu_embed.artifact.manifest import Manifest
from tpu_embed.artifact.shard_format import ShardFormat
from tpu_embed.artifact.shard_records import open_by_position, shard_files, window_step_owners
from tpu_embed.artifact.verify import (
    check_files,
    check_level,
    check_shard_steps,
    checked_shard_paths,
    path_of,
)
from tpu_embed.core.permutation import Permutation, epoch_key
from tpu_embed.training.shard_parse import parse_fn

READERS = ("auto", "tensorflow", "io")

def window_format(dirs: Sequence[str], manifests: Sequence[Manifest]) -> ShardFormat:
    """The format a window's elements are parsed to: the newest day's, with each stack's buffers the largest
    of the window (a day's plan is made from its profile, which covers its base's days too, so the newest
    day's buffers are those where the window is a run of consecutive days). The days' hosts, chips, batch,
    features and stacks must agree."""
    fmts = [m.shard_format for m in manifests]
    newest = fmts[-1]
    check_window_formats(dirs, fmts)
    sizes = [{s: (rows, ids) for s, rows, ids in f.stacks} for f in fmts]  # per day: {stack: buffer sizes}
    stacks = tuple((name, max(d[name][0] for d in sizes), max(d[name][1] for d in sizes))
                   for name, _, _ in newest.stacks)
    return dataclasses.replace(newest, stacks=stacks)


def _pad_fn(day: ShardFormat, to: ShardFormat):
    """Map function: a parsed element of `day`'s format -> the same with CSR buffers zero-padded to `to`'s sizes
    (beyond its prefix a buffer holds zeros, so the padded element is the one `to`'s buffers would hold)."""
    import tensorflow as tf  # TensorFlow boundary
    grow = {s: (r2 - r1, i2 - i1) for (s, r1, i1), (_, r2, i2) in zip(day.stacks, to.stacks)}
    if not any(r or i for r, i in grow.values()):
        return None

    def pad(el):
        chips = []
        for chip in el["sparse_core"]:
            out = dict(chip)
            for stack, (r, i) in grow.items():
                d = dict(chip[stack])
                if r:
                    d["row_pointers"] = tf.pad(d["row_pointers"], [[0, r]])
                if i:
                    for k in ("sorted_sample_ids", "sorted_token_ids", "sorted_gains"):
                        d[k] = tf.pad(d[k], [[0, i]])
                out[stack] = d
            chips.append(out)
        return dict(el, sparse_core=tuple(chips))

    return pad


def _tensorflow_reads(path: str) -> bool:
    """True if TensorFlow's own filesystems read `path` (local files, and gs:// in the standard wheel)."""
    import tensorflow as tf  # TensorFlow boundary
    proto = tio.protocol(path)
    return proto == "" or proto in tf.io.gfile.get_registered_schemes()


# Long for its docstring (every reader, check and order it offers); its code checks the options and picks a reader.
def input_fn(artifact_dir: ArtifactDirs, *, host_index: int = 0, num_epochs: Optional[int] = 1,
             prefetch: int = 2, num_parallel_calls: Optional[int] = None, expected_fingerprint: Optional[str] = None,
             reader: str = "auto", verify: str = "size", shuffle_steps: Optional[int] = None):
    """`tf.data.Dataset` of this host's steps, in step order: one element per training step.

    Each element is the dict `parse_fn` makes; `element["sparse_core"][c]`
    is chip c's `{stack: {...}}`, `dequeue_inputs(...)` turns it into what
    `TPUEmbeddingV2.dequeue` takes.  The manifest is read through `tpu_embed.artifact.io`
    (local or any object store); every record is parsed by the same `parse_fn`, run as a
    parallel `map` (deterministic order).

    A window of days (`[day1, day2, day3]`) is read one day after the other (`element["step"]` is the
    step within its day), after `tpu_embed.artifact.lineage.check_window` has checked that one model
    reads them all (one lineage, days in order, the same table rows and layout, every older vocabulary
    a prefix of the newest day's); each day's records are parsed with its own format and zero-padded
    to the window's buffers (`window_format`).

    Args:
      artifact_dir: one artifact, or a window of days of one lineage, oldest first.
      host_index: the host whose shards are read.
      num_epochs: passes over the steps; None repeats forever.
      prefetch: elements prefetched (`Dataset.prefetch`).
      num_parallel_calls: parallel `parse_fn` calls; default AUTOTUNE.
      expected_fingerprint: the training spec's `Spec.fingerprint` (checked against the newest
        day); a mismatch raises instead of training on shards made for another spec.
      reader: how the records are read (with `shuffle_steps` they are read by position instead):

        * "tensorflow": `tf.data.TFRecordDataset` over the paths, i.e.
          TensorFlow's own filesystems (local files; gs:// through TF's GCS
          filesystem, which has its own credentials and retries), with the
          format's `compression_type`;
        * "io": `tpu_embed.artifact.io` (fsspec: gs:// through gcsfs, s3://,
          memory://, ...), records streamed (and decompressed) from each file and
          CRC-checked, fed to tf.data with `Dataset.from_generator` (serialized
          records; one file read at a time, in step order);
        * "auto" (default): "tensorflow" when TF has a filesystem for
          the paths' scheme (`tf.io.gfile.get_registered_schemes()`: local, gs://),
          else "io".
      verify: "none", "size" or "sha256" (see `tpu_embed.artifact.verify`). At load, the
        artifact is a finished one (no run still writing it, killed or failed), every file the
        manifest lists (of the shards: the host's) exists with the listed size and the host's
        shard files cover every step; each file's record CRCs (and, "sha256", its hash) are
        checked as it is first opened, so damage is refused naming the file and step before
        any record of that file is used.
      shuffle_steps: None (default) reads the steps in step order, every
        epoch. An integer seed reads epoch e in the order of the permutation
        `tpu_embed.core.permutation.Permutation(steps, epoch_key(seed, e))` of the
        steps: every step exactly once per epoch, another order each epoch, the
        same orders every time the dataset is iterated. The order depends only on
        the seed, the epoch and the number of steps (of the whole window: its steps
        are permuted together), so every host (whose records
        of a step belong together) reads the steps in the same order. Records are
        then read by position through `tpu_embed.artifact.io`:
        uncompressed files are read in place; a compressed file is decompressed
        once, when first needed, into a temporary file that is removed when the
        iteration ends.

    Returns:
      The `tf.data.Dataset`.

    Raises:
      ValueError: an unknown `reader` or `verify`, a `shuffle_steps` that is not a seed in
        [0, 2**64), shards made for another spec than `expected_fingerprint`, or shards with
        jax-tpu-embedding's arrays only.
      LineageError: the days of a window are not one lineage in order (`check_window`).
      ArtifactDamagedError: (unless `verify="none"`) an unfinished artifact, or a shard file
        missing, of another size or damaged; the message names the file and the fix.
    """
    import tensorflow as tf  # TensorFlow boundary: the rest of tpu_embed imports without it
    if reader not in READERS:
        raise ValueError(f"reader must be one of {READERS}, got {reader!r}")
    if shuffle_steps is not None and (isinstance(shuffle_steps, bool) or not isinstance(shuffle_steps, int)
                                      or not 0 <= shuffle_steps < 1 << 64):
        raise ValueError(f"shuffle_steps must be None or an integer seed in [0, 2**64), got {shuffle_steps!r}")
    check_level(verify)
    dirs, manifests = window(artifact_dir)
    if expected_fingerprint is not None and manifests[-1].spec_fingerprint != expected_fingerprint:
        raise ValueError(f"{dirs[-1]} was made for spec {manifests[-1].spec_fingerprint}, not "
                         f"{expected_fingerprint}: regenerate the shards with this spec.")
    days = [_open_day(d, m, host_index, verify) for d, m in zip(dirs, manifests)]
    fmt = window_format(dirs, manifests) if len(days) > 1 else days[0].fmt
    if reader == "auto":
        reader = "tensorflow" if all(_tensorflow_reads(f) for day in days for f in day.files) else "io"
    calls = num_parallel_calls or tf.data.AUTOTUNE
    if shuffle_steps is not None:  # the shuffled reader makes its epochs itself
        return _shuffled_dataset(days, fmt, verify, shuffle_steps, num_epochs, calls).prefetch(prefetch)
    return _ordered_dataset(days, fmt, reader, verify, num_epochs, calls).prefetch(prefetch)


def _shuffled_dataset(days: Sequence["_Day"], fmt: ShardFormat, verify: str, seed: int,
                      num_epochs: Optional[int], calls: int):
    """The window's records read by position, each epoch's steps in their permutation's order, parsed."""
    import tensorflow as tf  # TensorFlow boundary
    ds = tf.data.Dataset.from_generator(
        lambda: _shuffled_records(days, verify, seed, num_epochs),
        output_signature=(tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.string)))
    parsers = [_parser(day.fmt, fmt) for day in days]
    if len(parsers) == 1:
        return ds.map(lambda _, record: parsers[0](record), num_parallel_calls=calls, deterministic=True)
    # each record parsed with its own day's format
    return ds.map(lambda i, record: tf.switch_case(i, [lambda p=p: p(record) for p in parsers]),
                  num_parallel_calls=calls, deterministic=True)


def _ordered_dataset(days: Sequence["_Day"], fmt: ShardFormat, reader: str, verify: str,
                     num_epochs: Optional[int], calls: int):
    """The window's records day after day in step order, each parsed with its day's format, `num_epochs` times."""
    ds: Any = None
    for day in days:
        parsed = _day_records(day, reader, verify).map(_parser(day.fmt, fmt), num_parallel_calls=calls,
                                                         deterministic=True)
        ds = parsed if ds is None else ds.concatenate(parsed)
    if num_epochs != 1:
        ds = ds.repeat(num_epochs)
    return ds


@dataclasses.dataclass(frozen=True)
class _Day:
    """One artifact of what `input_fn` reads: its host's shard files."""
    directory: str
    manifest: Manifest
    files: List[str]
    entries: List[Any]  # the manifest's shard file entries of the host

    @property
    def fmt(self) -> ShardFormat:
        return self.manifest.shard_format

    @property
    def steps(self) -> int:
        return int(self.manifest.shards.steps) if self.manifest.shards is not None else 0


def _open_day(artifact_dir: str, manifest: Manifest, host_index: int, verify: str) -> _Day:
    fmt = manifest.shard_format
    if "tensorflow" not in fmt.layouts:
        raise ValueError(f"{artifact_dir}: its shards hold jax-tpu-embedding's arrays only (shards.layout: jax), not "
                         "TPUEmbeddingV2's: read them with tpu_embed.jax, or write them with shards.layout: both.")
    files = shard_files(artifact_dir, host_index, manifest)
    entries = manifest.shard_files(host_index)
    if verify != "none":
        check_shard_steps(manifest, host_index)
        check_files(artifact_dir, manifest, "size", kinds=("shard",), host=host_index)  # sha256: lazily
    return _Day(artifact_dir, manifest, files, entries)


def _day_records(day: _Day, reader: str, verify: str):
    """The serialized records of one artifact's host, in step order."""
    import tensorflow as tf  # TensorFlow boundary
    fmt = day.fmt
    compression = "" if fmt.compression == "none" else fmt.compression
    if reader == "tensorflow":
        if verify == "none":
            return tf.data.TFRecordDataset(day.files, compression_type=compression)
        # each file verified as it is first opened, then read by TF (a dataset of paths: one flat_map)
        return tf.data.TFRecordDataset(checked_shard_paths(day.directory, day.entries, verify, fmt.compression),
                                       compression_type=compression)
    return tf.data.Dataset.from_generator(lambda: _stream_records(day.files, fmt.compression),
                                          output_signature=tf.TensorSpec([], tf.string))


def _parser(day: ShardFormat, to: ShardFormat):
    """serialized record of `day`'s format -> the element, its buffers of `to`'s sizes."""
    parse = parse_fn(day)
    pad = _pad_fn(day, to)
    return parse if pad is None else (lambda record: pad(parse(record)))


def _stream_records(files: Sequence[str], compression: str = "none") -> Iterator[bytes]:
    for path in files:
        yield from tfrecord.stream_records(path, compression)


def step_order(steps: int, seed: int, epoch: int) -> np.ndarray:
    """The steps in the order `input_fn(..., shuffle_steps=seed)` reads epoch `epoch` (0-based)."""
    return Permutation(steps, epoch_key(seed, epoch))(np.arange(steps, dtype=np.int64))


def _shuffled_records(days: Sequence[_Day], verify: str, seed: int, num_epochs: Optional[int]):
    """(day index, serialized record), epoch after epoch, each epoch in `step_order` of the window's steps (the
    days' steps one after the other); read by position (see `input_fn`)."""
    owner, steps = window_step_owners(days)  # window step -> (day, file, record in the file)
    tmp = tempfile.mkdtemp(prefix="tpu_embed_shuffle-") if any(day.fmt.compression != "none" for day in days) else None
    handles: Dict[Tuple[int, int], Any] = {}
    offsets: Dict[Tuple[int, int], List[Tuple[int, int]]] = {}  # (day, file) -> [(payload offset, length)] per record

    def open_file(d: int, i: int):
        day = days[d]
        e = day.entries[i]

        def spill_path() -> str:
            assert tmp is not None
            return os.path.join(tmp, f"{d}-{i}.tfrecord")

        handles[(d, i)], offsets[(d, i)] = open_by_position(path_of(day.directory, e), e, day.fmt.compression,
                                                            verify, spill_path)

    try:
        epoch = 0
        while num_epochs is None or epoch < num_epochs:
            for s in step_order(steps, seed, epoch):
                d, i, k = owner[int(s)]
                if (d, i) not in handles:
                    open_file(d, i)
                entry, path = days[d].entries[i], path_of(days[d].directory, days[d].entries[i])
                if k >= len(offsets[(d, i)]):
                    raise ValueError(f"{path}: has {len(offsets[(d, i)])} records, the manifest lists steps "
                                     f"{entry.first_step}..{entry.last_step}")
                try:
                    payload = tfrecord.read_payload(handles[(d, i)], *offsets[(d, i)][k])
                except tfrecord.TFRecordError as e:
                    raise ValueError(f"{path}: step {k + (entry.first_step or 0)}: {e.problem} at byte "
                                     f"{e.offset}") from None
                yield d, payload
            epoch += 1
    finally:
        for fh in handles.values():
            fh.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _split_chips(fmt: ShardFormat, host_index: int):
    """Map function: one host record -> the record's chips stacked on a leading axis (then unbatched)."""
    import tensorflow as tf  # TensorFlow boundary
    cph = fmt.chips_per_host
    hb = fmt.host_batch_size
    pc = hb // cph
    nd = len(fmt.dense_features)

    def split(el):
        out: Dict[str, Any] = {
            "step": tf.fill([cph], el["step"]),
            "host": tf.fill([cph], el["host"]),
            "chip": tf.constant(host_index * cph, tf.int32) + tf.range(cph, dtype=tf.int32),
            "label": tf.reshape(el["label"], [cph, pc]),
            "mask": tf.reshape(el["mask"], [cph, pc]),
            "dense": tf.reshape(el["dense"], [cph, pc, nd]),
        }
        tc = {}
        for name, weighted, width in fmt.tensor_core_features:
            ragged = el["tensor_core"][name]
            ids = tf.cast(ragged.to_tensor(default_value=0, shape=[hb, width]), tf.int32)
            if weighted:
                w = el["tensor_core"][name + "/weights"].to_tensor(default_value=0.0, shape=[hb, width])
            else:
                w = tf.sequence_mask(ragged.row_lengths(), width, dtype=tf.float32)
            tc[name] = {"ids": tf.reshape(ids, [cph, pc, width]), "weights": tf.reshape(w, [cph, pc, width])}
        out["tensor_core"] = tc
        sc: Dict[str, Dict[str, Any]] = {}
        for stack, _, _ in fmt.stacks:
            fields = el["sparse_core"][0][stack].keys()
            sc[stack] = {k: tf.stack([el["sparse_core"][c][stack][k] for c in range(cph)]) for k in fields}
        out["sparse_core"] = sc
        return out

    return split


def per_chip_dataset(artifact_dir: ArtifactDirs, host_index: int = 0, *, num_epochs: Optional[int] = 1,
                     prefetch: int = 2, num_parallel_calls: Optional[int] = None,
                     expected_fingerprint: Optional[str] = None, reader: str = "auto",
                     shuffle_steps: Optional[int] = None):
    """`tf.data.Dataset` of host `host_index`'s per-chip elements: step 0 chip 0, step 0 chip 1, ..., step 1 chip 0.

    Element c of a step (the host's chip c, global chip `host * chips_per_host + c`)::

        {"step": int64, "host": int64, "chip": int32 (global chip),
         "label": float32 [per_chip], "mask": float32 [per_chip], "dense": float32 [per_chip, num_dense],
         "tensor_core": {feature: {"ids": int32 [per_chip, width] (0-padded),
                                   "weights": float32 [per_chip, width] (0 on padding, else 1 or the weight)}},
         "sparse_core": {stack: {"row_pointers": int32 [buffer], "sorted_sample_ids" / "sorted_token_ids": int32
                                 [ids buffer], "sorted_gains": float32 [ids buffer], "row_pointers_unpadded_size",
                                 "ids_unpadded_size", "num_minibatches_per_physical_sparse_core", ...: int32 []}}}

    Every shape is static (TPU infeed needs that): CSR buffers have TF's full
    static sizes, tensor-core ids are padded to the spec's `tensor_core_width`.

    Args:
      artifact_dir: one artifact, or a window of days of one lineage, oldest first (as for `input_fn`).
      host_index: the host whose shards are read.
      num_epochs: as for `input_fn`.
      prefetch: steps prefetched (times the host's chips, in elements).
      num_parallel_calls: as for `input_fn`.
      expected_fingerprint: as for `input_fn`.
      reader: as for `input_fn`.
      shuffle_steps: as for `input_fn`.

    Returns:
      The `tf.data.Dataset` of per-chip elements.
    """
    fmt = window(artifact_dir)[1][-1].shard_format  # the newest day's: its chips and batch are every day's
    ds = input_fn(artifact_dir, host_index=host_index, num_epochs=num_epochs, prefetch=prefetch,
                  num_parallel_calls=num_parallel_calls, expected_fingerprint=expected_fingerprint, reader=reader,
                  shuffle_steps=shuffle_steps)
    ds = ds.map(_split_chips(fmt, host_index)).unbatch()
    return ds.prefetch(max(1, prefetch) * fmt.chips_per_host)


def dequeue_inputs(chip: Mapping[str, Mapping[str, Any]], sample_counts: Optional[Mapping[str, int]] = None):
    """{stack: (PartitionedCsrFormatTensor, row_pointers_unpadded_size, ids_unpadded_size)} for one chip.

    That is the structure `TPUEmbeddingV2` builds in `enqueue` and consumes in
    `dequeue`. `sample_count` must be a Python int there: it is taken from
    `sample_counts` (the manifest's stacks) when given, else from the record.
    """
    import tensorflow as tf  # TensorFlow boundary
    from tensorflow.python.tpu.tpu_embedding_v3 import PartitionedCsrFormatTensor
    out = {}
    for stack, d in chip.items():
        sc = sample_counts[stack] if sample_counts is not None else d["sample_count"]
        out[stack] = (PartitionedCsrFormatTensor(
            row_pointers=d["row_pointers"], sorted_sample_ids=d["sorted_sample_ids"],
            sorted_token_ids=d["sorted_token_ids"], sorted_gains=d["sorted_gains"], sample_count=sc,
            num_minibatches_per_physical_sparse_core=tf.cast(d["num_minibatches_per_physical_sparse_core"], tf.int32)),
            d["row_pointers_unpadded_size"], d["ids_unpadded_size"])
    return out
