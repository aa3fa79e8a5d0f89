"""One global batch -> per-host records of per-chip SparseCore CSR.

`build_step` is everything the shard job does per training step: split the
global batch per host then per chip (contiguous blocks), pack every chip's
stacks with the resolved limits (the native packer on `chip_entries`, else
`tpu_embed.sparsecore.preprocess_with_layout` on `split_global_batch`: the
same batches), and encode one record per host (`tpu_embed.artifact.shard_records`).
With `shards.layout: jax | both` the record also holds jax-tpu-embedding's input arrays of the host's
devices (`tpu_embed.jax.layout.pack_host` on `jax_host_features`, `tpu_embed.jax.records`); with `jax`
alone, TF's are left out.
"""

from __future__ import annotations

import collections
import logging
import os
from typing import Dict, List, Tuple

import numpy as np

from pipelines.sharding.batches import ExampleBlock, GlobalIds
from tpu_embed.artifact import shard_format, shard_records
from tpu_embed.artifact.manifest import LimitsInfo
from tpu_embed.artifact.spec import FrequencyVocabulary
from tpu_embed.jax import layout as jax_layout_lib
from tpu_embed.jax import records as jax_records
from tpu_embed.sparsecore import LimitExceededError, buffer_sizes, csr, preprocess_with_layout, split_global_batch
from tpu_embed.sparsecore.csr_types import stack_limits_of
from tpu_embed.sparsecore.padding import XLA_PAD, round_up

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


def stack_encodings(layout, compact: bool = True) -> Tuple[Tuple[str, shard_format.StackEncoding], ...]:
    """Per stack, how its CSR arrays are stored (shard format 2), from the layout alone (not the data or limits).

    `compact`: gains left out of a record when they are all 1.0; sample ids in the narrowest unsigned type
    whose maximum (the padding marker) is above every sample row of a SparseCore (stack samples per chip /
    SCs per chip), token ids likewise below the stack's rows per SparseCore (padded rows / all SCs); the
    padding entries left out (row pointers stored as per-partition counts) when a chip's padding can
    reach the size of its samples (8 x row pointers >= samples per chip: small per-chip batches, where
    the padding of mostly near-empty partitions dominates). Not compact: version 1's encoding.
    """
    if not compact:
        return ()
    topo = layout.topology
    rows = topo.num_sc_per_chip * round_up(topo.num_sparse_cores, XLA_PAD)
    return tuple((name, shard_format.StackEncoding(
        gains="omitted_if_unit",
        sample_ids=shard_format.narrowest_id_dtype(-(-st.sample_count // topo.num_sc_per_chip)),
        token_ids=shard_format.narrowest_id_dtype(-(-st.total_padded_vocabulary // topo.num_sparse_cores)),
        padding="omitted" if XLA_PAD * rows >= st.sample_count else "stored"))
        for name, st in layout.stacks.items())


def jax_layout_for(spec, layout) -> jax_layout_lib.JaxLayout:
    """jax-tpu-embedding's stacking of `spec`'s model (the model whose TF stacking is `layout`), cached on it."""
    jl = layout.__dict__.get("_jax_layout")
    if jl is None:
        # The vocabulary sizes that give `layout`'s table rows (spec.table_vocabulary_size's inverse).
        rows = {t.name: t.vocabulary_size for t in layout.tables.values()}
        sizes = {spec.vocabulary_key(f): rows[f.table] - f.vocabulary.num_oov_buckets
                 for f in spec.sparse_core_features if isinstance(f.vocabulary, FrequencyVocabulary)}
        jl = layout.__dict__["_jax_layout"] = jax_layout_lib.jax_layout(spec.model(sizes))
    return jl


def shard_format_for(spec, layout, limits: LimitsInfo, *, compact: bool = True) -> shard_format.ShardFormat:
    """The shard format (manifest `shards.format`) of `spec`'s shards: version 2, the spec's
    `shards.compression` and `shards.layout`; `compact`: short keys and `stack_encodings(layout)` (else version
    1's records)."""
    layouts = spec.shards.layouts
    stacks = []
    for name, st in layout.stacks.items():
        sizes = buffer_sizes(st, layout.topology, limits.max_ids_per_chip_per_sample)
        stacks.append((name, sizes.row_pointers, sizes.ids))
    if "tensorflow" not in layouts:
        return shard_format.ShardFormat(
            num_hosts=spec.topology.num_hosts, chips_per_host=spec.topology.chips_per_host,
            host_batch_size=spec.per_host_batch_size, dense_features=tuple(d.name for d in spec.dense),
            tensor_core_features=tuple((f.name, f.weight_column is not None, int(f.tensor_core_width))
                                       for f in spec.tensor_core_features),
            stacks=(), version=shard_format.FORMAT_VERSION, compression=spec.shards.compression,
            keys="short" if compact else "names", layouts=layouts,
            jax=jax_records.jax_format(jax_layout_for(spec, layout)))
    return shard_format.ShardFormat(
        num_hosts=spec.topology.num_hosts, chips_per_host=spec.topology.chips_per_host,
        host_batch_size=spec.per_host_batch_size, dense_features=tuple(d.name for d in spec.dense),
        tensor_core_features=tuple((f.name, f.weight_column is not None, int(f.tensor_core_width))
                                   for f in spec.tensor_core_features),
        stacks=tuple(stacks), version=shard_format.FORMAT_VERSION, compression=spec.shards.compression,
        encodings=stack_encodings(layout, compact), keys="short" if compact else "names",
        samples=tuple((name, st.sample_count) for name, st in layout.stacks.items()), layouts=layouts,
        jax=jax_records.jax_format(jax_layout_for(spec, layout)) if "jax" in layouts else None)


def global_ids_of(block: ExampleBlock, spec) -> GlobalIds:
    return GlobalIds.of(block, {f.name: f.sequence_length for f in spec.sparse_core_features})


def chip_entries(block: ExampleBlock, spec, layout, chips) -> List[Dict[str, tuple]]:
    """Each chip's batch as the native packer takes it: {feature: (None, ids, weights | None, row_splits)}.

    A chip's samples are a contiguous block of the step's (`split_global_batch`), so its ids and weights are
    slices of the feature's and its row splits a slice of the step's, rebased: no row per id, no copy of the
    ids, one cumulative sum for all features of a sample count. A sequence feature's sample (example,
    position) holds one id below the example's length, none after. The packer reads them as it reads
    `split_global_batch(global_ids_of(block, spec), layout)` (tests/pipelines/test_shard_entries.py)."""
    num_chips = layout.topology.num_chips
    sequence = {f.name: f.sequence_length for f in spec.sparse_core_features}
    groups: Dict[int, List[tuple]] = collections.defaultdict(list)  # (path, feature block, ids per sample)
    for feat in layout.features:
        fb = block.features[feat.path]
        L = sequence.get(feat.path, 0)
        per_sample = fb.lengths if L <= 0 else (np.arange(L) < fb.lengths[:, None]).reshape(-1)
        if per_sample.size != feat.sample_count * num_chips:
            raise ValueError(f"Feature {feat.path!r}: the step has {per_sample.size} samples, not the "
                             f"{feat.sample_count * num_chips} of its global batch ({num_chips} chips x "
                             f"{feat.sample_count}).")
        groups[feat.sample_count].append((feat.path, fb, per_sample))
    out: List[Dict[str, tuple]] = [{} for _ in chips]
    for n, feats in groups.items():
        splits = np.zeros((len(feats), n * num_chips + 1), np.int64)
        np.cumsum(np.stack([c for _, _, c in feats]), axis=1, out=splits[:, 1:])
        for i, c in enumerate(chips):
            lo, hi = splits[:, c * n].tolist(), splits[:, (c + 1) * n].tolist()
            local = splits[:, c * n:(c + 1) * n + 1] - splits[:, c * n:c * n + 1]
            for j, (path, fb, _) in enumerate(feats):
                a, b = lo[j], hi[j]
                weights = None if fb.weights is None else np.ascontiguousarray(fb.weights[a:b], np.float32)
                out[i][path] = (None, np.ascontiguousarray(fb.ids[a:b], np.int64), weights, local[j])
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

    `compact`: the records use `stack_encodings(layout)` (what `shard_format_for` records); False: version 1's
    encoding (for comparisons: benchmarks/shard_size.py)."""
    topo = spec.topology
    counts: collections.Counter = collections.Counter()
    gids = global_ids_of(block, spec)
    oov = {f.name: int(block.features[f.name].oov.sum()) for f in spec.sparse_core_features}
    records = []
    if encode:
        cph = topo.chips_per_host
        hb = spec.per_host_batch_size
        fmt = shard_format_for(spec, layout, limits, compact=compact)
        native = csr.native_available()
        kw: dict = dict(max_ids_per_chip_per_sample=limits.max_ids_per_chip_per_sample,
                        max_ids_per_table=dict(limits.max_ids_per_table),
                        max_unique_ids_per_table=dict(limits.max_unique_ids_per_table),
                        allow_id_dropping=limits.allow_id_dropping)
        per_stack = stack_limits_of(layout, kw["max_ids_per_table"], kw["max_unique_ids_per_table"],
                                    kw["max_ids_per_chip_per_sample"], kw["allow_id_dropping"])
        with_tf = "tensorflow" in fmt.layouts
        jl = jax_layout_for(spec, layout) if fmt.jax is not None else None
        for h in range(topo.num_hosts):
            extra = None
            if jl is not None:
                assert fmt.jax is not None  # jl is made where the format has jax's part
                jax_batches = jax_layout_lib.pack_host(jl, jax_host_features(block, spec, jl, h))
                extra = jax_records.encode_jax_features(jax_batches, fmt.jax)
                for i, st in enumerate(fmt.jax["stacks"]):  # the static sizes the manifest records
                    b = jax_batches[st["name"]]
                    for name, value in (("coo_buffer_size_per_device", b.required_buffer_size_per_device),
                                        ("max_ids_per_partition", int(b.max_ids_per_partition.max(initial=0))),
                                        ("max_unique_ids_per_partition",
                                         int(b.max_unique_ids_per_partition.max(initial=0)))):
                        k = jax_records.max_counter(i, name)
                        counts[k] = max(counts[k], value)
            chips = list(range(h * cph, (h + 1) * cph)) if with_tf else []
            # split_global_batch reads the Mapping GlobalIds as the dict it declares.
            per_chip: List[dict] = (chip_entries(block, spec, layout, chips) if native
                                    else split_global_batch(gids, layout, chips))  # type: ignore[arg-type]
            packed = []
            for c, chip in zip(chips, per_chip):
                try:
                    if native:
                        batches = {name: csr.preprocess_stack_native(stack, layout, chip, per_stack[name])
                                   for name, stack in layout.stacks.items()}
                    else:
                        batches = preprocess_with_layout(chip, layout, **kw)
                except LimitExceededError as e:
                    raise LimitExceededError(
                        f"step {step}, chip {c} (limits from {limits.source}): {e} Run `tpu-embed profile` then "
                        "`tpu-embed plan` and pass --plan, raise the spec's `limits`, or set "
                        "limits.allow_id_dropping: true (every dropped id is counted).") from None
                for stack, b in batches.items():  # type: ignore[assignment]  # `b` was a jax batch above
                    if b.dropped_ids:
                        counts[f"stack/{stack}/dropped_ids"] += int(b.dropped_ids)
                packed.append(batches)
            sl = slice(h * hb, (h + 1) * hb)
            tc = {}
            for f in spec.tensor_core_features:
                fb = block.features[f.name].slice(sl.start, sl.stop)
                tc[f.name] = (fb.lengths, fb.ids, fb.weights)
            rec = shard_records.encode_step_record(step=step, host=h, label=block.label[sl], mask=block.mask[sl],
                                                   dense=block.dense[sl], tensor_core=tc, chips=packed,
                                                   fmt=fmt, extra=extra)
            records.append((h, rec))
    counts["steps"] += 1
    counts["examples_in_steps"] += block.num_examples
    counts["examples_padding"] += int((block.mask == 0).sum())
    return records, gids, oov, counts


def shard_file_name(host: int, file_no: int, num_files: int) -> str:
    return f"shards/host-{host:05d}/part-{file_no:05d}-of-{num_files:05d}.tfrecord"
