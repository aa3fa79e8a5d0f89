"""The JAX input pipeline: an artifact's jax records, one element per training step, without TensorFlow.

    for step in input_iterator("build/criteo", output="jax", feature_specs=specs):
        activations = sparse_matmul(step.sparse, emb_variables)   # embedding.tpu_sparse_dense_matmul
        loss = dense_model(activations, step.dense, step.label, step.mask)

Each element (`JaxStep`) holds, for this process's devices, what jax-tpu-embedding's
`embedding.preprocess_sparse_dense_matmul_input` returns for the step's global batch (`step.sparse`, the
`PreprocessedInput` that `tpu_sparse_dense_matmul` and the Flax `SparseCoreEmbed` layer take), plus the
host's labels, example mask (0 for the examples that pad the last step, `policies.tail: pad`), dense
features and tensor-core features. The records are those the shard job writes with `shards.layout: jax` or
`both` (`tpu_embed.artifact.jax_records`); the reader is the counterpart of `tpu_embed.input_fn`: the same files
(local or any object store, `tpu_embed.artifact.io`), compression, host index, verification, step order or
shuffled steps (the same permutation as `input_fn(shuffle_steps=seed)`), epochs, and windows of days
(`input_iterator([day1, day2])`: the days one after the other, checked as `input_fn` checks them, with the
window's COO buffers, the largest of its days').

Decoding is numpy (`tpu_embed.jax.step_decoder`): each record is parsed in place (no copy of its arrays), and
each COO array is copied once, from the record into its buffer. A background thread reads, decodes and (with
`output="jax"`) puts the arrays on the devices `prefetch` steps ahead. jax and jax-tpu-embedding are imported only
when the iterator is made, and only where they are needed.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import queue
import shutil
import tempfile
import threading
from typing import Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from tpu_embed.artifact import io as tio
from tpu_embed.artifact import tfrecord
from tpu_embed.artifact.jax_records import STATIC_SIZES
from tpu_embed.artifact.manifest import Manifest, read_manifest
from tpu_embed.artifact.shard_format import ShardFormat
from tpu_embed.artifact.shard_records import open_by_position, window_step_owners
from tpu_embed.artifact.verify import check_files, check_level, check_shard_steps, path_of, verify_shard_bytes
from tpu_embed.core.permutation import Permutation, epoch_key
from tpu_embed.jax.step_decoder import StepDecoder

OUTPUTS = ("numpy", "jax")
ArtifactDirs = Union[str, Sequence[str]]  # one artifact, or a window of days of one lineage (oldest first)
DEFAULT_AXIS = "device"  # the mesh axis of jax-tpu-embedding's examples' data sharding


class PreprocessedArrays(NamedTuple):
    """jax-tpu-embedding's `PreprocessedInput` as plain data, where jax-tpu-embedding is not installed: the same
    attributes (`lhs_row_pointers`, `lhs_embedding_ids`, `lhs_sample_ids`, `lhs_gains`: {stack: array};
    `num_minibatches`), and a pytree for jax as any NamedTuple is."""

    lhs_row_pointers: Dict[str, Any]
    lhs_embedding_ids: Dict[str, Any]
    lhs_sample_ids: Dict[str, Any]
    lhs_gains: Dict[str, Any]
    num_minibatches: Any

    @property
    def sparse_dense_matmul_input(self) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
        return self.lhs_row_pointers, self.lhs_embedding_ids, self.lhs_sample_ids, self.lhs_gains


class JaxStep(NamedTuple):
    """One training step of this host.

    `sparse`: jax-tpu-embedding's `PreprocessedInput` (`PreprocessedArrays` where it is not installed): per
    stacked table, row pointers int32 [local devices x row pointers per device], embedding ids, sample ids
    int32 and gains float32 [local devices x COO buffer per device] (`[local devices, ...]` with
    `has_leading_dimension`), and `num_minibatches` (1 per local device). `label`, `mask` float32
    [host batch]; `dense` float32 [host batch, dense features]; `tensor_core`: {feature: (ids int32
    [host batch, tensor_core_width], 0 past a row's values; weights float32 [same], 0 past them, else 1 or the
    weight)}. Arrays are numpy, or with `output="jax"` `jax.Array`s whose first axis is split over the devices.
    """

    step: int
    epoch: int
    sparse: Any
    label: Any
    mask: Any
    dense: Any
    tensor_core: Dict[str, Tuple[Any, Any]]


# ---------------------------------------------------------------- reading the records

def _stream(artifact_dir: str, entries, compression: str, verify: str) -> Iterator[Any]:
    """The host's records in step order: streamed from each file (CRC-checked), or with verify="sha256" each
    file read whole and checked before any of its records is used."""
    for e in entries:
        path = path_of(artifact_dir, e)
        if verify == "sha256":
            data = tio.read_bytes(path)
            verify_shard_bytes(path, data, e, verify, compression)
            data = tfrecord.decompress(data, compression, path)
            view = memoryview(data)
            for off, length in tfrecord.index_records(data, path, verify=False):
                yield view[off:off + length]
        else:
            yield from tfrecord.stream_records(path, compression)


def _spill_path(tmp_holder: List[str], i: str) -> str:
    """Where file `i`'s decompressed records go: the iterator's temporary directory, made when first needed."""
    if not tmp_holder:
        tmp_holder.append(tempfile.mkdtemp(prefix="tpu_embed_jax-"))
    return os.path.join(tmp_holder[0], f"{i}.tfrecord")


@dataclasses.dataclass(frozen=True)
class _Day:
    """One artifact of what the iterator reads: its manifest and this host's shard files."""
    directory: str
    manifest: Manifest
    entries: List[Any]  # the manifest's shard file entries of the host

    @property
    def steps(self) -> int:
        return int(self.manifest.shards.steps) if self.manifest.shards is not None else 0

    @property
    def compression(self) -> str:
        return self.manifest.shard_format.compression


def _by_position(days: Sequence[_Day], verify: str, order: Iterator[int], tmp_holder: List[str]) -> Iterator[Any]:
    """The records of the window's steps in `order` (the days' steps one after the other), each read by its
    position (as `tpu_embed.input_fn(shuffle_steps=...)` reads them): uncompressed files in place, a compressed
    one decompressed once into a temporary file."""
    owner, _ = window_step_owners(days)  # window step -> (day, file, record in the file)
    handles: Dict[Tuple[int, int], Any] = {}
    offsets: Dict[Tuple[int, int], List[Tuple[int, int]]] = {}
    try:
        for s in order:
            d, i, k = owner[int(s)]
            day, e = days[d], days[d].entries[i]
            path = path_of(day.directory, e)
            if (d, i) not in handles:
                handles[(d, i)], offsets[(d, i)] = open_by_position(
                    path, e, day.compression, verify, functools.partial(_spill_path, tmp_holder, f"{d}-{i}"))
            if k >= len(offsets[(d, i)]):
                raise ValueError(f"{path}: has {len(offsets[(d, i)])} records, the manifest lists steps "
                                 f"{e.first_step}..{e.last_step}")
            try:
                yield tfrecord.read_payload(handles[(d, i)], *offsets[(d, i)][k])
            except tfrecord.TFRecordError as err:
                raise ValueError(f"{path}: step {k + (e.first_step or 0)}: {err.problem} at byte "
                                 f"{err.offset}") from None
    finally:
        for fh in handles.values():
            fh.close()


def step_order(steps: int, seed: int, epoch: int) -> np.ndarray:
    """The steps in the order epoch `epoch` (0-based) is read with `shuffle_steps=seed`: the same permutation as
    `tpu_embed.input_fn(..., shuffle_steps=seed)`, so every host reads the same step at the same time."""
    return Permutation(steps, epoch_key(seed, epoch))(np.arange(steps, dtype=np.int64))


# ---------------------------------------------------------------- the iterator

def _jax_sizes(feature_specs: Any, fj: Mapping[str, Any], where: str) -> Dict[str, int]:
    """jax-tpu-embedding's own COO buffer sizes for stacked `feature_specs`, after checking that their stacks are
    the artifact's and that their limits hold every step the records (`where`: the artifact or window) hold: the
    maxima the shard job recorded (over a window, the largest of its days') are at most the specs'
    `max_ids_per_partition` / `max_unique_ids_per_partition`; jax's preprocessing with lower limits would drop
    ids, or stop, where the records keep them all."""
    import jax
    from jax_tpu_embedding.sparsecore.lib.nn import embedding

    leaves = jax.tree.leaves(feature_specs)
    unstacked = [f.name for f in leaves if not f.table_spec.is_stacked()]
    if unstacked:
        raise ValueError(f"feature specs {unstacked[:3]} are not stacked: stack them as the artifact's records are "
                         "(tpu_embed.jax.limits.stack_tables, or jax's auto_stack_tables and "
                         "prepare_feature_specs_for_training)")
    theirs: Dict[str, set] = {}
    for f in leaves:
        theirs.setdefault(f.table_spec.stacked_table_spec.stack_name, set()).add(f.name)
    ours = {s["name"]: {x["name"] for x in s["features"]} for s in fj["stacks"]}
    if theirs != ours:
        diff = sorted(set(theirs) ^ set(ours)) or sorted(n for n in ours if ours[n] != theirs.get(n))
        raise ValueError(f"the feature specs are stacked otherwise than the artifact's jax records (stacked tables "
                         f"{sorted(theirs)[:4]} vs {sorted(ours)[:4]}; first difference {diff[:1]}): stack them with "
                         "jax's auto_stack_tables over the spec's features in the spec's order")
    limits = {}
    for f in leaves:
        st = f.table_spec.stacked_table_spec
        limits[st.stack_name] = (int(st.max_ids_per_partition), int(st.max_unique_ids_per_partition))
    for s in fj["stacks"]:
        reached = (s.get("max_ids_per_partition"), s.get("max_unique_ids_per_partition"))
        if None not in reached and (reached[0] > limits[s["name"]][0] or reached[1] > limits[s["name"]][1]):
            raise ValueError(
                f"jax stack {s['name']!r}: the feature specs' max_ids_per_partition / max_unique_ids_per_partition "
                f"({limits[s['name']][0]} / {limits[s['name']][1]}) are below what the steps of {where} reach "
                f"({reached[0]} / {reached[1]}): jax would drop ids there. Set the limits of these records: "
                "feature_specs(..., fdo_dir=) of `tpu-embed plan --artifact DIR [DIR ...] --format jax-fdo` with "
                "every day read")
    return {k: int(v) for k, v in embedding.compute_coo_buffer_size_per_device(
        feature_specs, global_device_count=int(fj["num_devices"]), num_sc_per_device=int(fj["num_sc_per_device"])
    ).items()}


def _preprocessed_class():
    """jax-tpu-embedding's (PreprocessedInput, SparseDenseMatmulInput) where it is installed, else None."""
    if importlib.util.find_spec("jax_tpu_embedding") is None:
        return None
    from jax_tpu_embedding.sparsecore.lib.nn import embedding
    return embedding.PreprocessedInput, embedding.SparseDenseMatmulInput


class JaxInputIterator:
    """An iterator of `JaxStep`s (see `input_iterator`); `close()` (or leaving a `with` block) stops its reader
    thread and removes its temporary files."""

    def __init__(self, records: Iterator[Tuple[int, Any]], decoder: StepDecoder, host_index: int, prefetch: int,
                 put, wrap, tmp_holder: List[str]):
        self._records, self._decoder, self._host = records, decoder, host_index
        self._put, self._wrap, self._tmp = put, wrap, tmp_holder
        self._stop = threading.Event()
        self._done = False
        self._queue: Optional[queue.Queue] = None
        self._thread: Optional[threading.Thread] = None
        if prefetch > 0:
            self._queue = queue.Queue(maxsize=prefetch)
            self._thread = threading.Thread(target=self._produce, name="tpu_embed-jax-input", daemon=True)
            self._thread.start()

    def _make(self, epoch: int, data) -> JaxStep:
        step, a = self._decoder.decode(data)
        rps, eids, sids, gains, nmb = a["sparse"]
        label, mask, dense, tc = a["label"], a["mask"], a["dense"], a["tensor_core"]
        if self._put is not None:
            p = self._put
            rps, eids, sids, gains = ({k: p(v) for k, v in d.items()} for d in (rps, eids, sids, gains))
            nmb, label, mask, dense = p(nmb), p(label), p(mask), p(dense)
            tc = {k: (p(i), p(w)) for k, (i, w) in tc.items()}
        return JaxStep(step, epoch, self._wrap(rps, eids, sids, gains, nmb), label, mask, dense, tc)

    def _produce(self) -> None:
        assert self._queue is not None
        try:
            for epoch, data in self._records:
                if self._stop.is_set():
                    return
                item: Any = self._make(epoch, data)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # handed to the consumer, raised there
            self._offer(("error", e))
            return
        self._offer(("end", None))

    def _offer(self, item) -> None:
        assert self._queue is not None
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __iter__(self) -> "JaxInputIterator":
        return self

    def __next__(self) -> JaxStep:
        if self._done:
            raise StopIteration
        if self._queue is None:
            try:
                epoch, data = next(self._records)
            except StopIteration:
                self.close()
                raise
            return self._make(epoch, data)
        item = self._queue.get()
        if isinstance(item, JaxStep):
            return item
        kind, err = item
        self.close()
        if kind == "error":
            raise err
        raise StopIteration

    def close(self) -> None:
        self._done = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        close = getattr(self._records, "close", None)
        if close is not None and (self._thread is None or not self._thread.is_alive()):
            close()
        for d in self._tmp:
            shutil.rmtree(d, ignore_errors=True)
        self._tmp.clear()

    def __enter__(self) -> "JaxInputIterator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass


def _window(artifact_dirs: ArtifactDirs) -> Tuple[List[str], List[Manifest]]:
    """`tpu_embed.artifact.lineage.window`: one artifact, or a window of days checked as `input_fn` checks it.
    lineage (its token counts need pyarrow) is imported for a list only: one artifact reads its manifest alone."""
    if isinstance(artifact_dirs, (str, os.PathLike)):
        return [str(artifact_dirs)], [read_manifest(str(artifact_dirs))]
    if importlib.util.find_spec("pyarrow") is None:
        raise ValueError("a window of days is checked by tpu_embed.artifact.lineage, which needs pyarrow (a "
                         "dependency of tpu_embed), not installed here: pip install pyarrow, or read one artifact at "
                         "a time")
    from tpu_embed.artifact.lineage import window
    return window(artifact_dirs)


def jax_stacking(fmt_jax: Mapping[str, Any]) -> Dict[str, Any]:
    """The jax records' description without the maxima the shard job records over its steps (`STATIC_SIZES`):
    what the days of a window must share to be decoded alike (devices, stacks, their tables and features)."""
    return dict(fmt_jax, stacks=[{k: v for k, v in s.items() if k not in STATIC_SIZES} for s in fmt_jax["stacks"]])


def window_jax_format(dirs: Sequence[str], manifests: Sequence[Manifest]) -> Dict[str, Any]:
    """The jax records' description a window's steps are decoded to: the newest day's, each stack's recorded
    sizes the largest of the days' (a day's step padded to a larger COO buffer is that step in it). LineageError
    unless the days' shards agree as `input_fn` needs (`check_window_formats`) and their jax records are stacked
    alike."""
    from tpu_embed.artifact.lineage import LineageError, check_window_formats
    fmts = [m.shard_format for m in manifests]
    check_window_formats(dirs, fmts)
    jaxes = [f.jax for f in fmts]
    newest = jaxes[-1]
    assert newest is not None
    for d, fj in zip(dirs, jaxes):
        if fj is None or jax_stacking(fj) != jax_stacking(newest):
            raise LineageError(f"{d}: its jax records are stacked otherwise than {dirs[-1]}'s (another jax stacking "
                               "of the tables): one model cannot read both. Re-shard the days with one spec.")
    stacks = []
    for i, s in enumerate(newest["stacks"]):
        s = dict(s)
        for k in STATIC_SIZES:
            known = [int(fj["stacks"][i][k]) for fj in jaxes if fj is not None and fj["stacks"][i].get(k) is not None]
            s[k] = max(known) if known else None
        stacks.append(s)
    return dict(newest, stacks=stacks)


def input_iterator(artifact_dir: ArtifactDirs, *, host_index: Optional[int] = None, num_epochs: Optional[int] = 1,
                   shuffle_steps: Optional[int] = None, output: str = "numpy", sharding: Any = None,
                   feature_specs: Any = None, coo_buffer_sizes: Optional[Mapping[str, int]] = None,
                   has_leading_dimension: bool = False, prefetch: int = 2, verify: str = "size",
                   expected_fingerprint: Optional[str] = None) -> JaxInputIterator:
    """An iterator of this host's training steps (`JaxStep`) from an artifact written with `shards.layout: jax`
    or `both`: per step, what jax-tpu-embedding's `preprocess_sparse_dense_matmul_input` returns for the
    host's devices from that step's global batch, without running it; plus labels, mask, dense and
    tensor-core features.

    * `host_index`: this process's host (default: `jax.process_index()` with `output="jax"`, else 0).
    * `num_epochs` (None: forever); `shuffle_steps`: None reads the steps in order, an integer seed reads
      each epoch in `step_order(steps, seed, epoch)`, the order of `tpu_embed.input_fn(shuffle_steps=seed)`.
    * `output`: "numpy", or "jax": every array a `jax.Array` made with
      `jax.make_array_from_process_local_data(sharding, array)`, as jax-tpu-embedding's examples shard their
      preprocessed inputs; `sharding` defaults to `NamedSharding(Mesh(jax.devices(), ("device",)),
      PartitionSpec("device"))`. Its devices of this process must be the artifact's local devices.
    * COO buffer size per device of each stack (a static shape for `jax.jit`): `coo_buffer_sizes` {stack:
      size}, else jax's `compute_coo_buffer_size_per_device(feature_specs)` when stacked jax-tpu-embedding
      `feature_specs` are given (their stacks are checked against the records', and their limits against
      the maxima the records reach, of every day of a window; set them with `feature_specs(artifact,
      fdo_dir=...)` or `tpu_embed.jax.limits.apply_limits` from `tpu-embed plan --artifact DIR [DIR ...]
      --format jax-fdo`, every day of the window given), else the
      size recorded in the manifest, else each step's least size (which changes from step to step). A size
      too small for a step is a ValueError naming the step: jax would drop ids there.
    * `has_leading_dimension`: arrays [local devices, ...] (for `jax.pmap`) instead of flat (for `jax.jit`), as
      jax's argument of that name.
    * `prefetch`: steps decoded ahead in a background thread (0: decoded in the caller's thread).
    * `verify` ("none" | "size" | "sha256") and `expected_fingerprint`: as `tpu_embed.input_fn`.

    `artifact_dir`: one artifact, or a window of days of one lineage, oldest first (`[day1, day2, day3]`), read
    as `tpu_embed.input_fn` reads one: the days one after the other (`JaxStep.step` is the step within its
    day), or with `shuffle_steps` the window's steps permuted together, after the checks of `input_fn` (one
    lineage, days in order, the same table rows, topology and layouts, every older vocabulary a prefix of the
    newest day's, the same hosts, batch and features: `tpu_embed.artifact.lineage.check_window` and
    `check_window_formats`) and that the days' jax records are stacked alike; every step is padded to the
    window's COO buffers (each stack's largest over the days). `expected_fingerprint` is the newest day's.

    An artifact whose records hold no jax arrays is refused in one line that names the spec key to set.
    """
    _check_arguments(output, shuffle_steps, num_epochs, prefetch)
    check_level(verify)
    dirs, manifests = _window(artifact_dir)
    newest_dir = dirs[-1]
    fmt = _shard_format(dirs, manifests, expected_fingerprint)
    fj = fmt.jax
    assert fj is not None
    jax_mod = _jax_module(output)
    if host_index is None:
        host_index = int(jax_mod.process_index()) if jax_mod is not None else 0
    if not 0 <= int(host_index) < fmt.num_hosts:
        raise ValueError(f"host_index {host_index} is not a host of {newest_dir} ({fmt.num_hosts} hosts)")
    sizes = _coo_buffer_sizes(fj, coo_buffer_sizes, feature_specs, dirs)
    put = None if jax_mod is None else _device_put(jax_mod, sharding, fmt, newest_dir)
    wrap = _wrapper()
    days = _days(dirs, manifests, int(host_index), verify)
    tmp_holder: List[str] = []
    records = _records(days, num_epochs, shuffle_steps, verify, tmp_holder)
    decoder = StepDecoder(fmt, sizes, has_leading_dimension)
    return JaxInputIterator(records, decoder, int(host_index), prefetch, put, wrap, tmp_holder)


def _check_arguments(output: str, shuffle_steps: Optional[int], num_epochs: Optional[int], prefetch: int) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
    if shuffle_steps is not None and (isinstance(shuffle_steps, bool) or not isinstance(shuffle_steps, int)
                                      or not 0 <= shuffle_steps < 1 << 64):
        raise ValueError(f"shuffle_steps must be None or an integer seed in [0, 2**64), got {shuffle_steps!r}")
    if num_epochs is not None and (not isinstance(num_epochs, int) or num_epochs < 0):
        raise ValueError(f"num_epochs must be None or an integer >= 0, got {num_epochs!r}")
    if not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"prefetch must be an integer >= 0, got {prefetch!r}")


def _shard_format(dirs: Sequence[str], manifests: Sequence[Manifest], expected_fingerprint: Optional[str]
                  ) -> ShardFormat:
    """The shard format the steps are decoded to: the newest day's, with a window's jax records
    (`window_jax_format`); ValueError if the newest day is not of `expected_fingerprint` or a day holds no jax
    arrays."""
    newest_dir, manifest = dirs[-1], manifests[-1]
    if expected_fingerprint is not None and manifest.spec_fingerprint != expected_fingerprint:
        raise ValueError(f"{newest_dir} was made for spec {manifest.spec_fingerprint}, not "
                         f"{expected_fingerprint}: regenerate the shards with this spec.")
    for d, m in zip(dirs, manifests):
        if m.shard_format.jax is None:
            raise ValueError(f"{d}: its shards hold no jax-tpu-embedding arrays (shards.layout "
                             f"{'/'.join(m.shard_format.layouts)}): add `shards: {{layout: jax}}` (or `both`, to keep "
                             "TensorFlow's too) to the spec and run `tpu-embed run` again.")
    fmt = manifest.shard_format
    if len(dirs) > 1:
        fmt = dataclasses.replace(fmt, jax=window_jax_format(dirs, manifests))
    return fmt


def _jax_module(output: str) -> Any:
    """jax with `output="jax"` (ValueError where it is not installed), else None."""
    if output != "jax":
        return None
    if importlib.util.find_spec("jax") is None:
        raise ValueError("output='jax' needs jax, which is not installed here: install jax (with "
                         "jax-tpu-embedding, as tests/conformance/jax-requirements.txt pins them), or use "
                         "output='numpy'")
    import jax
    return jax


def _coo_buffer_sizes(fj: Mapping[str, Any], coo_buffer_sizes: Optional[Mapping[str, int]], feature_specs: Any,
                      dirs: Sequence[str]) -> Dict[str, Optional[int]]:
    """Each stack's COO buffer size per device: `coo_buffer_sizes`, else jax's of `feature_specs`, else the
    recorded size (None: each step's least)."""
    newest_dir = dirs[-1]
    sizes: Dict[str, Optional[int]] = {s["name"]: s.get("coo_buffer_size_per_device") for s in fj["stacks"]}
    if coo_buffer_sizes is not None:
        unknown = sorted(set(coo_buffer_sizes) - set(sizes))
        if unknown:
            raise ValueError(f"coo_buffer_sizes names {unknown[:3]}, which are not jax stacks of {newest_dir} "
                             f"({sorted(sizes)[:5]})")
        sizes.update({k: int(v) for k, v in coo_buffer_sizes.items()})
    elif feature_specs is not None:
        sizes.update(_jax_sizes(feature_specs, fj, newest_dir if len(dirs) == 1 else f"the window {dirs}"))
    return sizes


def _device_put(jax_mod: Any, sharding: Any, fmt: ShardFormat, newest_dir: str):
    """x -> `jax.make_array_from_process_local_data(sharding, x)`; `sharding` defaults to every device along
    `DEFAULT_AXIS`, and must have the artifact's local devices on this process."""
    fj = fmt.jax
    assert fj is not None
    if sharding is None:
        from jax.sharding import Mesh, NamedSharding, PartitionSpec
        sharding = NamedSharding(Mesh(np.array(jax_mod.devices()), (DEFAULT_AXIS,)), PartitionSpec(DEFAULT_AXIS))
    local = len(sharding.addressable_devices)
    if local != int(fj["local_devices"]):
        raise ValueError(f"the sharding has {local} devices on this process; {newest_dir}'s jax records are for "
                         f"{fj['local_devices']} local devices ({fj['num_devices']} in all, {fmt.num_hosts} "
                         "host(s)): run with as many devices, or shard again for this topology.")
    make = jax_mod.make_array_from_process_local_data

    def put(x, _s=sharding, _make=make):
        return _make(_s, x)
    return put


def _wrapper():
    """(row pointers, embedding ids, sample ids, gains, num_minibatches) -> jax-tpu-embedding's
    PreprocessedInput where it is installed, else `PreprocessedArrays`."""
    classes = _preprocessed_class()
    if classes is None:
        def wrap(rps, eids, sids, gains, nmb):
            return PreprocessedArrays(rps, eids, sids, gains, nmb)
    else:
        pre_cls, smi_cls = classes

        def wrap(rps, eids, sids, gains, nmb):
            return pre_cls(smi_cls(rps, eids, sids, gains), nmb)
    return wrap


def _days(dirs: Sequence[str], manifests: Sequence[Manifest], host: int, verify: str) -> List[_Day]:
    """Each day's manifest and this host's shard files, checked (unless `verify="none"`) to be there whole."""
    days = []
    for d, m in zip(dirs, manifests):
        if verify != "none":
            check_shard_steps(m, host)
            check_files(d, m, "size", kinds=("shard",), host=host)
        days.append(_Day(d, m, m.shard_files(host)))
    return days


def _records(days: Sequence[_Day], num_epochs: Optional[int], shuffle_steps: Optional[int], verify: str,
             tmp_holder: List[str]) -> Iterator[Tuple[int, Any]]:
    """(epoch, record) of every step read: the days' steps one after the other, or each epoch's `step_order`."""
    steps = sum(day.steps for day in days)
    epoch = 0
    while num_epochs is None or epoch < num_epochs:
        if shuffle_steps is None:
            for day in days:
                for data in _stream(day.directory, day.entries, day.compression, verify):
                    yield epoch, data
        else:
            order = iter(step_order(steps, shuffle_steps, epoch).tolist())
            for data in _by_position(days, verify, order, tmp_holder):
                yield epoch, data
        epoch += 1
