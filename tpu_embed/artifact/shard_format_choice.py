"""The shard format a spec's shards are written in, chosen from the spec and its layouts (`shard_format_for`).

`tpu_embed.artifact.shard_format` says what a format is and how a reader reads it; this module decides which
format the shard job writes: TF's stack encodings (`stack_encodings`, from the layout alone), and
jax-tpu-embedding's stacking of the same model (`jax_layout_for`) when the spec's `shards.layout` holds jax.
The Beam jobs (`pipelines.sharding.step_records`, `pipelines.jobs.shard_job`) only call it.
"""

from __future__ import annotations

from typing import Tuple

from tpu_embed.artifact import jax_records
from tpu_embed.artifact.manifest import LimitsInfo
from tpu_embed.artifact.shard_format import FORMAT_VERSION, ShardFormat, StackEncoding, narrowest_id_dtype
from tpu_embed.artifact.spec import FrequencyVocabulary, Spec
from tpu_embed.sparsecore.csr_types import buffer_sizes
from tpu_embed.sparsecore.jax_layout import JaxLayout, jax_layout
from tpu_embed.sparsecore.layout import SparseCoreLayout
from tpu_embed.sparsecore.padding import XLA_PAD, round_up


def stack_encodings(layout: SparseCoreLayout, compact: bool = True) -> Tuple[Tuple[str, StackEncoding], ...]:
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
    return tuple((name, StackEncoding(
        gains="omitted_if_unit",
        sample_ids=narrowest_id_dtype(-(-st.sample_count // topo.num_sc_per_chip)),
        token_ids=narrowest_id_dtype(-(-st.total_padded_vocabulary // topo.num_sparse_cores)),
        padding="omitted" if XLA_PAD * rows >= st.sample_count else "stored"))
        for name, st in layout.stacks.items())


def jax_layout_for(spec: Spec, layout: SparseCoreLayout) -> JaxLayout:
    """jax-tpu-embedding's stacking of `spec`'s model (the model whose TF stacking is `layout`), cached on it."""
    jl = layout.__dict__.get("_jax_layout")
    if jl is None:
        # The vocabulary sizes that give `layout`'s table rows (spec.table_vocabulary_size's inverse).
        rows = {t.name: t.vocabulary_size for t in layout.tables.values()}
        sizes = {spec.vocabulary_key(f): rows[f.table] - f.vocabulary.num_oov_buckets
                 for f in spec.sparse_core_features if isinstance(f.vocabulary, FrequencyVocabulary)}
        jl = layout.__dict__["_jax_layout"] = jax_layout(spec.model(sizes))
    return jl


def _buffer_sizes(layout: SparseCoreLayout, limits: LimitsInfo) -> Tuple[Tuple[str, int, int], ...]:
    """(stack, row pointers buffer size, ids buffer size) of every stack, with the limits' ids per sample."""
    stacks = []
    for name, st in layout.stacks.items():
        sizes = buffer_sizes(st, layout.topology, limits.max_ids_per_chip_per_sample)
        stacks.append((name, sizes.row_pointers, sizes.ids))
    return tuple(stacks)


def _tensor_core_features(spec: Spec) -> Tuple[Tuple[str, bool, int], ...]:
    """(name, weighted, width) of each tensor-core feature."""
    out = []
    for f in spec.tensor_core_features:
        assert f.tensor_core_width is not None  # the spec requires it of every tensor-core feature
        out.append((f.name, f.weight_column is not None, int(f.tensor_core_width)))
    return tuple(out)


def shard_format_for(spec: Spec, layout: SparseCoreLayout, limits: LimitsInfo, *,
                     compact: bool = True) -> ShardFormat:
    """The shard format (manifest `shards.format`) of `spec`'s shards: version 2, the spec's
    `shards.compression` and `shards.layout`; `compact`: short keys and `stack_encodings(layout)` (else version
    1's records). Without TF's layout the format has no stacks, encodings or samples."""
    layouts = spec.shards.layouts
    with_tf = "tensorflow" in layouts
    return ShardFormat(
        num_hosts=spec.topology.num_hosts, chips_per_host=spec.topology.chips_per_host,
        host_batch_size=spec.per_host_batch_size, dense_features=tuple(d.name for d in spec.dense),
        tensor_core_features=_tensor_core_features(spec),
        stacks=_buffer_sizes(layout, limits) if with_tf else (), version=FORMAT_VERSION,
        compression=spec.shards.compression,
        encodings=stack_encodings(layout, compact) if with_tf else (), keys="short" if compact else "names",
        samples=tuple((name, st.sample_count) for name, st in layout.stacks.items()) if with_tf else (),
        layouts=layouts, jax=jax_records.jax_format(jax_layout_for(spec, layout)) if "jax" in layouts else None)
