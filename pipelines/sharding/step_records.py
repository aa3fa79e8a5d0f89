"""One global batch -> per-host records of per-chip SparseCore CSR.

`build_step` is everything the shard job does per training step: split the
global batch per host then per chip (contiguous blocks), pack every chip's
stacks with the resolved limits (the native packer on `chip_entries`, else
`tpu_embed.sparsecore.preprocess_with_layout` on `split_global_batch`: the
same batches), and encode one record per host (`tpu_embed.artifact.shard_records`).
With `shards.layout: jax | both` the record also holds jax-tpu-embedding's input arrays of the host's
devices (`tpu_embed.sparsecore.jax_layout.pack_host` on `jax_host_features`, `tpu_embed.artifact.jax_records`);
with `jax` alone, TF's are left out. The format of the records (`shard_format_for`) is decided in
`tpu_embed.artifact.shard_format_choice`.
"""

from __future__ import annotations

import collections
import logging
import os
from typing import Dict, List, Tuple

import numpy as np

from pipelines.sharding.batches import ExampleBlock, GlobalIds
from tpu_embed.artifact import jax_records, shard_records
from tpu_embed.artifact.manifest import LimitsInfo
from tpu_embed.artifact.shard_format_choice import jax_layout_for, shard_format_for
from tpu_embed.sparsecore import LimitExceededError, csr, preprocess_with_layout, split_global_batch
from tpu_embed.sparsecore import jax_layout as jax_layout_lib
from tpu_embed.sparsecore.csr_types import stack_limits_of

_log = logging.getLogger("tpu_embed.pipelines")
_native_checked = False


def warn_if_no_native_kernel() -> bool:
    """Log once per process (a Beam worker) when CSR packing falls back to numpy; True if it does.

    Called where workers first pack CSR (`pipelines.jobs.build_shards._BuildStep.setup`): a worker image or wheel built
    without the C kernel would otherwise just be slower, silently.
    """
    global _native_checked
    if csr.native_available():
        return False
    if not _native_checked:
        _native_checked = True
        why = ("TPU_EMBED_NATIVE=0 is set" if os.environ.get("TPU_EMBED_NATIVE") == "0" else
               "tpu_embed.sparsecore._csr_native is not importable: the package was installed without a C "
               "compiler, or from a pure-Python wheel/sdist")
        _log.warning("tpu_embed: the native CSR kernel is not available on this worker (pid %d; %s). Packing "
                     "falls back to numpy: the same bytes, about 5x slower (docs/benchmarks.md: 7.2 vs 1.3-1.5 "
                     "ms per batch). Install a wheel built with a C compiler (python -m build --wheel) on the "
                     "workers.", os.getpid(), why)
    return True


def global_ids_of(block: ExampleBlock, spec) -> GlobalIds:
    return GlobalIds.of(block, {f.name: f.sequence_length for f in spec.sparse_core_features})


def chip_entries(block: ExampleBlock, spec, layout, chips) -> List[Dict[str, tuple]]:
    """Each chip's batch as the native packer takes it: {feature: (None, ids, weights | None, row_splits)}.

    A chip's samples are a contiguous block of the step's (`split_global_batch`), so its ids and weights are
    slices of the feature's and its row splits a slice of the feature's sample starts, rebased: no row per id,
    no copy of the ids. A feature's sample starts are its examples' (`FeatureBlock`'s, kept with it); a sequence
    feature's sample (example, position) holds one id below the example's length, none after. The packer reads
    them as it reads `split_global_batch(global_ids_of(block, spec), layout)`
    (tests/pipelines/sharding/test_shard_entries.py)."""
    num_chips = layout.topology.num_chips
    sequence = {f.name: f.sequence_length for f in spec.sparse_core_features}
    out: List[Dict[str, tuple]] = [{} for _ in chips]
    for feat in layout.features:
        fb = block.features[feat.path]
        L = sequence.get(feat.path, 0)
        n = feat.sample_count
        if L <= 0:
            samples, starts = fb.lengths.size, None
        else:
            per_sample = (np.arange(L) < fb.lengths[:, None]).reshape(-1)
            samples = per_sample.size
            starts = np.zeros(samples + 1, np.int64)
            np.cumsum(per_sample, out=starts[1:])
        if samples != n * num_chips:
            raise ValueError(f"Feature {feat.path!r}: the step has {samples} samples, not the "
                             f"{n * num_chips} of its global batch ({num_chips} chips x {n}).")
        if starts is None:
            starts = fb.starts()
        bounds = starts[::n].tolist()  # where each chip's samples start, and the end
        for i, c in enumerate(chips):
            a, b = bounds[c], bounds[c + 1]
            weights = None if fb.weights is None else np.ascontiguousarray(fb.weights[a:b], np.float32)
            out[i][feat.path] = (None, np.ascontiguousarray(fb.ids[a:b], np.int64), weights,
                                 starts[c * n:(c + 1) * n + 1] - a)
    return out


def jax_host_features(block: ExampleBlock, spec, jl: jax_layout_lib.JaxLayout, host: int
                      ) -> Dict[str, jax_layout_lib.HostFeature]:
    """Each SparseCore feature's samples on `host`, as jax's preprocessing takes them: the host's examples
    (a contiguous block of the step), one sample per example, or per (example, position) of a sequence
    feature (one id below the example's length, none after), as `chip_entries` reads them."""
    hb = spec.per_host_batch_size
    sequence = {f.name: f.sequence_length for f in spec.sparse_core_features}
    out = {}
    for f in jax_layout_lib.feature_order(jl):
        fb = block.features[f.name].slice(host * hb, (host + 1) * hb)
        L = sequence.get(f.name, 0)
        per_sample = fb.lengths if L <= 0 else (np.arange(L) < fb.lengths[:, None]).reshape(-1)
        splits = np.zeros(per_sample.size + 1, np.int64)
        np.cumsum(per_sample, out=splits[1:])
        out[f.name] = jax_layout_lib.HostFeature(splits, fb.ids, fb.weights)
    return out


def build_step(step: int, block: ExampleBlock, spec, layout, limits: LimitsInfo, *, encode: bool = True,
               compact: bool = True
               ) -> Tuple[List[Tuple[int, bytes]], GlobalIds, Dict[str, int], collections.Counter]:
    """(records [(host, bytes)], global ids, OOV counts per feature, counters) of one step.

    `compact`: the records use `stack_encodings(layout)` (what `shard_format_for` records,
    `tpu_embed.artifact.shard_format_choice`); False: version 1's encoding (for comparisons:
    benchmarks/shard_size.py)."""
    counts: collections.Counter = collections.Counter()
    gids = global_ids_of(block, spec)
    oov = {f.name: int(block.features[f.name].oov.sum()) for f in spec.sparse_core_features}
    records = _host_records(step, block, spec, layout, limits, gids, counts, compact) if encode else []
    counts["steps"] += 1
    counts["examples_in_steps"] += block.num_examples
    counts["examples_padding"] += int((block.mask == 0).sum())
    return records, gids, oov, counts


def _host_records(step: int, block: ExampleBlock, spec, layout, limits: LimitsInfo, gids, counts: collections.Counter,
                  compact: bool) -> List[Tuple[int, bytes]]:
    """One record per host: its examples' labels, mask, dense and tensor-core features, its chips' CSR (TF's
    layout) and its devices' jax arrays, as the shard format holds them."""
    topo = spec.topology
    cph = topo.chips_per_host
    hb = spec.per_host_batch_size
    fmt = shard_format_for(spec, layout, limits, compact=compact)
    with_tf = "tensorflow" in fmt.layouts
    jl = jax_layout_for(spec, layout) if fmt.jax is not None else None
    pack = _ChipPacker(step, spec, layout, limits)
    records = []
    for h in range(topo.num_hosts):
        extra = None if jl is None else _jax_features(block, spec, jl, h, fmt.jax, counts)
        chips = list(range(h * cph, (h + 1) * cph)) if with_tf else []
        packed = pack(block, gids, chips, counts)
        sl = slice(h * hb, (h + 1) * hb)
        tc = {}
        for f in spec.tensor_core_features:
            fb = block.features[f.name].slice(sl.start, sl.stop)
            tc[f.name] = (fb.lengths, fb.ids, fb.weights)
        rec = shard_records.encode_step_record(step=step, host=h, label=block.label[sl], mask=block.mask[sl],
                                               dense=block.dense[sl], tensor_core=tc, chips=packed,
                                               fmt=fmt, extra=extra)
        records.append((h, rec))
    return records


def _jax_features(block: ExampleBlock, spec, jl: jax_layout_lib.JaxLayout, host: int, fmt_jax,
                  counts: collections.Counter) -> Dict[str, tuple]:
    """The jax arrays of `host`'s devices as record features; `counts` keeps each stack's maxima of the sizes the
    manifest records (`jax_records.max_counter`)."""
    jax_batches = jax_layout_lib.pack_host(jl, jax_host_features(block, spec, jl, host))
    extra = jax_records.encode_jax_features(jax_batches, fmt_jax)
    for i, st in enumerate(fmt_jax["stacks"]):  # the static sizes the manifest records
        b = jax_batches[st["name"]]
        for name, value in (("coo_buffer_size_per_device", b.required_buffer_size_per_device),
                            ("max_ids_per_partition", int(b.max_ids_per_partition.max(initial=0))),
                            ("max_unique_ids_per_partition", int(b.max_unique_ids_per_partition.max(initial=0)))):
            k = jax_records.max_counter(i, name)
            counts[k] = max(counts[k], value)
    return extra


class _ChipPacker:
    """Each chip's stacks packed with the resolved limits: the native packer on `chip_entries`, else
    `preprocess_with_layout` on `split_global_batch` (the same batches); dropped ids counted per stack."""

    def __init__(self, step: int, spec, layout, limits: LimitsInfo):
        self.step, self.spec, self.layout, self.limits = step, spec, layout, limits
        self.native = csr.native_available()
        self.kw: dict = dict(max_ids_per_chip_per_sample=limits.max_ids_per_chip_per_sample,
                       max_ids_per_table=dict(limits.max_ids_per_table),
                       max_unique_ids_per_table=dict(limits.max_unique_ids_per_table),
                       allow_id_dropping=limits.allow_id_dropping)
        self.per_stack = stack_limits_of(layout, self.kw["max_ids_per_table"], self.kw["max_unique_ids_per_table"],
                                         self.kw["max_ids_per_chip_per_sample"], self.kw["allow_id_dropping"])

    def __call__(self, block: ExampleBlock, gids, chips: List[int], counts: collections.Counter) -> List[dict]:
        layout = self.layout
        # The native packer's entries or the reference's FeatureIds: each chip's batch as its packer takes it.
        per_chip: List[dict] = (chip_entries(block, self.spec, layout, chips) if self.native
                                else split_global_batch(gids, layout, chips))
        packed = []
        for c, chip in zip(chips, per_chip):
            try:
                if self.native:
                    batches = {name: csr.preprocess_stack_native(stack, layout, chip, self.per_stack[name])
                               for name, stack in layout.stacks.items()}
                else:
                    batches = preprocess_with_layout(chip, layout, **self.kw)
            except LimitExceededError as e:
                raise LimitExceededError(
                    f"step {self.step}, chip {c} (limits from {self.limits.source}): {e} Run `tpu-embed profile` "
                    "then `tpu-embed plan` and pass --plan, raise the spec's `limits`, or set "
                    "limits.allow_id_dropping: true (every dropped id is counted).") from None
            for stack, b in batches.items():
                if b.dropped_ids:
                    counts[f"stack/{stack}/dropped_ids"] += int(b.dropped_ids)
            packed.append(batches)
        return packed


def shard_file_name(host: int, file_no: int, num_files: int) -> str:
    return f"shards/host-{host:05d}/part-{file_no:05d}-of-{num_files:05d}.tfrecord"
