"""Table stacking for SparseCore, as TensorFlow's `SparseCoreLayoutStacker` does it.

`stack_tables(feature_config, topology)` computes a `SparseCoreLayout` (where
every table and feature lives in its stacked table); `layout_of(model)` is
the layout of a `ModelConfig`, computed once per model (`layout_cache.layout_for`
remembers those of the configurations `preprocess` is called with).

TF (`tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer` and
`tensorflow/core/tpu/kernels/sparse_core_layout.cc`):

* tables are visited sorted by name;
* they are grouped by (width rounded up to 8, optimizer group: canonical JSON
  of the optimizer where TF uses `hash(optimizer)`);
* a table joins the first stack of its group whose activation memory
  (4 bytes * padded width * samples per SparseCore) and variable shard memory
  (4 bytes * padded width * padded height / chips) stay strictly under the
  limits (2 MiB and 2 GiB by default) and whose row count stays under 2**31-1;
* height is padded to a multiple of 8 * S (S = chips * SCs per chip);
* the stack is named by joining its member names with '_';
* each table gets a row offset in the shard (rows stacked before it / S) and a
  rotation of one chip per table ((index * S / chips) % S).

Per feature, `col_offset = row_offset * S`, `col_shift = rotation`, and the
sample offset is the running sum of `prod(output_shape)` over the features of
the same stack in flattened feature order.

Deliberate difference from TF 2.20/2.21: TF's stacking loop returns after the
first feature, so the activation-memory check sees only the first feature's
samples (every other table counts 0 samples).  We count every feature's
samples, as the stacker's documentation intends.  `stack_tables(...,
tf_first_feature_only=True)` reproduces TF's behaviour for conformance tests.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, List, Optional, Tuple

from tpu_embed.core.model import ModelConfig, from_tf_feature_config
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore.padding import round_up

ACTIVATION_MEM_LIMIT_BYTES = 2 * 1024 * 1024
VARIABLE_SHARD_LIMIT_BYTES = 2 * 1024 * 1024 * 1024
ROW_LIMIT = (1 << 31) - 1


@dataclasses.dataclass(frozen=True)
class TablePlacement:
    """Where one table lives inside its stack."""

    name: str
    stack: str
    vocabulary_size: int
    dim: int
    padded_vocabulary_size: int
    padded_dim: int
    combiner: str
    shard_row_offset: int  # rows of this stack before the table, per SparseCore shard
    rotation: int  # col_shift: the table's first row lands on SparseCore `rotation`
    num_sparse_cores: int

    @property
    def col_offset(self) -> int:
        return self.shard_row_offset * self.num_sparse_cores


@dataclasses.dataclass(frozen=True)
class FeaturePlacement:
    """One input feature: which table/stack it looks up and where its samples go."""

    path: str  # joined string path in the flattened feature structure
    index: int  # position in the flattened feature structure
    table: str
    stack: str
    output_shape: Tuple[int, ...]
    sample_count: int  # prod(output_shape): samples this feature has per chip
    sample_offset: int  # first sample of this feature in the stack's per-chip samples
    combiner: str
    col_offset: int
    col_shift: int
    vocabulary_size: int  # unpadded: ids must be < this


@dataclasses.dataclass(frozen=True)
class StackLayout:
    name: str
    tables: Tuple[str, ...]
    features: Tuple[str, ...]  # feature paths, flattened order
    padded_dim: int
    total_padded_vocabulary: int  # rows over all SparseCores
    sample_count: int  # per chip, over all features of the stack


@dataclasses.dataclass(frozen=True)
class SparseCoreLayout:
    """The result of `stack_tables`: plain data, shared by every later stage."""

    topology: Topology
    stacks: Dict[str, StackLayout]  # ordered as TF orders stacked tables
    tables: Dict[str, TablePlacement]
    features: Tuple[FeaturePlacement, ...]  # flattened feature order

    def stack_features(self, stack: str) -> List[FeaturePlacement]:
        return [f for f in self.features if f.stack == stack]

    def __getstate__(self):
        # Packers cache per-layout lookup tables on the instance; they are not state.
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def feature(self, path: str) -> FeaturePlacement:
        for f in self.features:
            if f.path == path:
                return f
        raise KeyError(f"No feature {path!r} in this layout; known: {[f.path for f in self.features]}")

    def to_dict(self) -> dict:
        return {
            "topology": self.topology.to_dict(),
            "stacks": {k: dataclasses.asdict(v) for k, v in self.stacks.items()},
            "tables": {k: dataclasses.asdict(v) for k, v in self.tables.items()},
            "features": [dataclasses.asdict(f) for f in self.features],
        }


# ---------------------------------------------------------------- stacking

@dataclasses.dataclass
class _Stack:
    padded_width: int
    unsharded_height: int = 0
    activation_bytes: int = 0
    shard_bytes: int = 0
    tables: List[str] = dataclasses.field(default_factory=list)
    offsets: List[int] = dataclasses.field(default_factory=list)
    rotations: List[int] = dataclasses.field(default_factory=list)


def stack_tables(
    feature_config: Any,
    topology: Optional[Topology] = None,
    *,
    disable_table_stacking: bool = False,
    activation_mem_limit_bytes: int = ACTIVATION_MEM_LIMIT_BYTES,
    variable_shard_limit_bytes: int = VARIABLE_SHARD_LIMIT_BYTES,
    tf_first_feature_only: bool = False,
) -> SparseCoreLayout:
    """Stack the tables of a model for its topology, as TPUEmbeddingV2 does.

    Features need a per-chip `output_shape`, e.g. `[batch // chips]`: SparseCore
    preprocessing is per chip.

    Args:
      feature_config: a `tpu_embed.core.model.ModelConfig` (which carries its
        topology), or the nested structure of `tf.tpu.experimental.embedding.FeatureConfig`
        that TPUEmbeddingV2 takes (converted by `tpu_embed.core.model.from_tf_feature_config`).
      topology: the `Topology`; required with TF feature configs.
      disable_table_stacking: one stack per table, as TF's option of the same name.
      activation_mem_limit_bytes: a table joins a stack only while the stack's activations per
        SparseCore stay below this (TF's 2 MiB); 0: no limit.
      variable_shard_limit_bytes: likewise for the stack's variable shard per chip (TF's 2 GiB).
      tf_first_feature_only: count only the first feature's samples in the activation check, as
        TF 2.20/2.21 does (see the module docstring); for conformance tests.

    Returns:
      The `SparseCoreLayout`: stacks, table placements (row offsets, rotations) and feature
      placements (sample offsets).

    Raises:
      ValueError: a feature config with no features or a feature without a fully defined
        positive `output_shape`.
      TypeError: a `topology` that is not a `Topology`, or a feature that is not a FeatureConfig.
    """
    model = from_tf_feature_config(feature_config, topology)
    samples = _samples_per_table(model, tf_first_feature_only)
    table_stack = _assign_stacks(model, samples, disable_table_stacking, activation_mem_limit_bytes,
                                 variable_shard_limit_bytes)
    placements, stack_objs = _place_tables(model, table_stack)
    features, sample_counts = _place_features(model, placements, list(stack_objs))
    stacks = {}
    for s, st in stack_objs.items():
        stacks[s] = StackLayout(
            name=s, tables=tuple(st.tables),
            features=tuple(f.path for f in features if f.stack == s),
            padded_dim=st.padded_width, total_padded_vocabulary=st.unsharded_height,
            sample_count=sample_counts[s])
    return SparseCoreLayout(topology=model.topology, stacks=stacks, tables=placements, features=tuple(features))


def _samples_per_table(model: ModelConfig, tf_first_feature_only: bool) -> Dict[str, int]:
    """{table: samples of its features}, or of the first feature only (TF 2.20/2.21's count)."""
    samples = {t.name: 0 for t in model.tables}
    for i, feature in enumerate(model.features):
        if tf_first_feature_only and i > 0:
            break
        samples[feature.table.name] += feature.samples
    return samples


def _assign_stacks(model: ModelConfig, samples: Dict[str, int], disable_table_stacking: bool,
                   activation_mem_limit_bytes: int, variable_shard_limit_bytes: int) -> Dict[str, _Stack]:
    """{table: its stack}: each table, in name order, joins the first stack of its (width, optimizer) group it
    fits under the limits, or starts one."""
    topology = model.topology
    num_sc = topology.num_sparse_cores
    groups: Dict[Tuple[int, str], List[_Stack]] = {}
    table_stack: Dict[str, _Stack] = {}
    for table in model.tables:
        name = table.name
        padded_width = round_up(table.dim, 8)
        padded_height = round_up(table.vocabulary_size, num_sc * 8)
        activation = 4 * padded_width * (samples[name] // topology.num_sc_per_chip)
        shard = 4 * padded_width * padded_height // topology.num_chips
        candidates = groups.setdefault((padded_width, table.optimizer_group), [])
        chosen = None
        if not disable_table_stacking:
            for st in candidates:
                if activation_mem_limit_bytes and st.activation_bytes + activation >= activation_mem_limit_bytes:
                    continue
                if variable_shard_limit_bytes and st.shard_bytes + shard >= variable_shard_limit_bytes:
                    continue
                if st.unsharded_height + padded_height >= ROW_LIMIT:
                    continue
                chosen = st
                break
        if chosen is None:
            chosen = _Stack(padded_width=padded_width)
            candidates.append(chosen)
        chosen.rotations.append((len(chosen.tables) * num_sc // topology.num_chips) % num_sc)
        chosen.tables.append(name)
        chosen.offsets.append(chosen.unsharded_height // num_sc)
        chosen.unsharded_height += padded_height
        chosen.activation_bytes += activation
        chosen.shard_bytes += shard
        table_stack[name] = chosen
    return table_stack


def _place_tables(model: ModelConfig, table_stack: Dict[str, _Stack]
                  ) -> Tuple[Dict[str, TablePlacement], Dict[str, _Stack]]:
    """({table: its placement}, {stack name: stack} in TF's order: by their first member in name order)."""
    num_sc = model.topology.num_sparse_cores
    placements: Dict[str, TablePlacement] = {}
    stack_objs: Dict[str, _Stack] = {}
    for table in model.tables:
        name = table.name
        st = table_stack[name]
        stack_name = "_".join(st.tables)
        if stack_name not in stack_objs:
            stack_objs[stack_name] = st
        i = st.tables.index(name)
        placements[name] = TablePlacement(
            name=name, stack=stack_name, vocabulary_size=table.vocabulary_size, dim=table.dim,
            padded_vocabulary_size=round_up(table.vocabulary_size, num_sc * 8),
            padded_dim=st.padded_width, combiner=table.combiner,
            shard_row_offset=st.offsets[i], rotation=st.rotations[i], num_sparse_cores=num_sc)
    return placements, stack_objs


def _place_features(model: ModelConfig, placements: Dict[str, TablePlacement], stack_order: List[str]
                    ) -> Tuple[List[FeaturePlacement], Dict[str, int]]:
    """(every feature's placement, {stack: its samples}): a feature's sample offset is the samples of the
    features of its stack before it, in flattened feature order."""
    sample_counts = {s: 0 for s in stack_order}
    features: List[FeaturePlacement] = []
    for i, feature in enumerate(model.features):
        tp = placements[feature.table.name]
        features.append(FeaturePlacement(
            path=feature.name, index=i, table=tp.name, stack=tp.stack, output_shape=feature.output_shape,
            sample_count=feature.samples, sample_offset=sample_counts[tp.stack], combiner=tp.combiner,
            col_offset=tp.col_offset, col_shift=tp.rotation, vocabulary_size=tp.vocabulary_size))
        sample_counts[tp.stack] += feature.samples
    return features, sample_counts


def layout_of(model: ModelConfig, *, disable_table_stacking: bool = False) -> SparseCoreLayout:
    """`stack_tables(model)`, cached: a model is frozen, so its layout is computed once per process."""
    return _cached_layout(model, disable_table_stacking)


@functools.lru_cache(maxsize=256)
def _cached_layout(model: ModelConfig, disable_table_stacking: bool) -> SparseCoreLayout:
    return stack_tables(model, disable_table_stacking=disable_table_stacking)
