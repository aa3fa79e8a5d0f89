"""Table stacking for SparseCore, as TensorFlow's `SparseCoreLayoutStacker` does it.

TF (`tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer` and
`tensorflow/core/tpu/kernels/sparse_core_layout.cc`):

* tables are visited sorted by name;
* they are grouped by (width rounded up to 8, optimizer);
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
import math
import operator
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tpu_embed.topology import Topology

ACTIVATION_MEM_LIMIT_BYTES = 2 * 1024 * 1024
VARIABLE_SHARD_LIMIT_BYTES = 2 * 1024 * 1024 * 1024
ROW_LIMIT = (1 << 31) - 1


def round_up(n: int, m: int) -> int:
    return -(-n // m) * m


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


# ---------------------------------------------------------------- flattening

def flatten_with_paths(structure: Any) -> List[Tuple[str, Any]]:
    """`tf.nest.flatten_with_joined_string_paths` for dict/list/tuple nests.

    Dict keys are visited sorted, sequences in order, paths joined with '/'.
    A bare (non-nested) leaf gets the empty path, as in TF.
    """
    out: List[Tuple[str, Any]] = []

    def visit(prefix: Tuple[str, ...], node: Any):
        if isinstance(node, Mapping):
            for key in sorted(node):
                visit(prefix + (str(key),), node[key])
        elif isinstance(node, (list, tuple)) and not _is_leaf_tuple(node):
            for i, item in enumerate(node):
                visit(prefix + (str(i),), item)
        else:
            out.append(("/".join(prefix), node))

    visit((), structure)
    return out


def _is_leaf_tuple(node) -> bool:
    # namedtuples of our own (e.g. SparseIds) are leaves, as tf.SparseTensor is.
    return hasattr(node, "_fields") and getattr(node, "_tpu_embed_leaf", False)


def flatten(structure: Any) -> List[Any]:
    return [leaf for _, leaf in flatten_with_paths(structure)]


# ---------------------------------------------------------------- stacking

def optimizer_group(table) -> int:
    """The stacking group of a table's optimizer: TF keys groups by hash(optimizer)
    (TF's optimizers hash their __dict__ items, so equal hyperparameters stack)."""
    return hash(getattr(table, "optimizer", None))


def quantization_repr(table) -> str:
    """TF also separates stacks by repr(quantization_config)."""
    return repr(getattr(table, "quantization_config", None))


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
    topology: Topology,
    *,
    disable_table_stacking: bool = False,
    activation_mem_limit_bytes: int = ACTIVATION_MEM_LIMIT_BYTES,
    variable_shard_limit_bytes: int = VARIABLE_SHARD_LIMIT_BYTES,
    tf_first_feature_only: bool = False,
) -> SparseCoreLayout:
    """Stack the tables of `feature_config` for `topology`, as TPUEmbeddingV2 does.

    `feature_config` is the nested structure of
    `tf.tpu.experimental.embedding.FeatureConfig` that TPUEmbeddingV2 takes (or
    any objects with the same attributes: `.table`, `.output_shape`; tables
    with `.name`, `.vocabulary_size`, `.dim`, `.combiner`, `.optimizer`).
    Features whose `output_shape` is unset need it: SparseCore preprocessing
    is per chip, so pass the per-chip batch shape, e.g. `[batch // chips]`.
    """
    if not isinstance(topology, Topology):
        raise TypeError(f"topology must be a tpu_embed.Topology, got {type(topology).__name__}")
    flat = flatten_with_paths(feature_config)
    if not flat:
        raise ValueError("feature_config has no features.")
    num_sc = topology.num_sparse_cores
    tables: Dict[str, Any] = {}
    table_objs: Dict[int, str] = {}
    feature_shapes: List[Tuple[int, ...]] = []
    for path, feature in flat:
        table = getattr(feature, "table", None)
        if table is None:
            raise TypeError(f"Feature {path!r}: expected a FeatureConfig with a .table, got {type(feature).__name__}.")
        name = table.name
        if not name:
            raise ValueError(f"Feature {path!r}: its table has no name; give every TableConfig a unique name.")
        if name in tables and tables[name] is not table and _table_signature(tables[name]) != _table_signature(table):
            raise ValueError(
                f"Two different tables are both named {name!r} (features sharing a table must share "
                "the same TableConfig). Rename one of them.")
        tables.setdefault(name, table)
        if int(table.vocabulary_size) < 1 or int(table.dim) < 1:
            raise ValueError(f"Table {name!r}: vocabulary_size and dim must be >= 1, got "
                             f"{table.vocabulary_size} and {table.dim}.")
        combiner = getattr(table, "combiner", "mean")
        if combiner not in ("sum", "mean", "sqrtn"):
            raise ValueError(f"Table {name!r}: combiner {combiner!r} is not one of 'sum', 'mean', 'sqrtn'.")
        shape = getattr(feature, "output_shape", None)
        if shape is None or len(list(shape)) == 0:
            raise ValueError(
                f"Feature {path!r} has no output_shape. SparseCore preprocessing is per chip: set "
                "output_shape to the per-chip batch shape, e.g. [global_batch // num_chips].")
        shape = tuple(int(d) for d in shape)
        if any(d < 1 for d in shape):
            raise ValueError(f"Feature {path!r}: output_shape {list(shape)} must be fully defined and positive.")
        n = functools.reduce(operator.mul, shape)
        if n % topology.num_sc_per_chip:
            raise ValueError(
                f"Feature {path!r}: {n} samples per chip (output_shape {list(shape)}) is not divisible by "
                f"{topology.num_sc_per_chip} SparseCores per chip. Use a per-chip batch that is a multiple "
                f"of {topology.num_sc_per_chip}.")
        feature_shapes.append(shape)

    samples = {name: 0 for name in tables}
    for i, (path, feature) in enumerate(flat):
        if tf_first_feature_only and i > 0:
            break
        samples[feature.table.name] += functools.reduce(operator.mul, feature_shapes[i])

    groups: Dict[Tuple[int, int, str], List[_Stack]] = {}
    table_stack: Dict[str, _Stack] = {}
    for name in sorted(tables):
        table = tables[name]
        padded_width = round_up(int(table.dim), 8)
        padded_height = round_up(int(table.vocabulary_size), num_sc * 8)
        activation = 4 * padded_width * (samples[name] // topology.num_sc_per_chip)
        shard = 4 * padded_width * padded_height // topology.num_chips
        key = (padded_width, optimizer_group(table), quantization_repr(table))
        candidates = groups.setdefault(key, [])
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

    placements: Dict[str, TablePlacement] = {}
    stack_order: List[str] = []
    stack_objs: Dict[str, _Stack] = {}
    for name in sorted(tables):  # TF orders stacks by their first member in name order
        st = table_stack[name]
        stack_name = "_".join(st.tables)
        if stack_name not in stack_objs:
            stack_objs[stack_name] = st
            stack_order.append(stack_name)
        i = st.tables.index(name)
        table = tables[name]
        placements[name] = TablePlacement(
            name=name, stack=stack_name,
            vocabulary_size=int(table.vocabulary_size), dim=int(table.dim),
            padded_vocabulary_size=round_up(int(table.vocabulary_size), num_sc * 8),
            padded_dim=st.padded_width, combiner=getattr(table, "combiner", "mean"),
            shard_row_offset=st.offsets[i], rotation=st.rotations[i], num_sparse_cores=num_sc)

    sample_counts = {s: 0 for s in stack_order}
    features: List[FeaturePlacement] = []
    for i, (path, feature) in enumerate(flat):
        tp = placements[feature.table.name]
        n = functools.reduce(operator.mul, feature_shapes[i])
        features.append(FeaturePlacement(
            path=path, index=i, table=tp.name, stack=tp.stack, output_shape=feature_shapes[i],
            sample_count=n, sample_offset=sample_counts[tp.stack], combiner=tp.combiner,
            col_offset=tp.col_offset, col_shift=tp.rotation, vocabulary_size=tp.vocabulary_size))
        sample_counts[tp.stack] += n

    stacks = {}
    for s in stack_order:
        st = stack_objs[s]
        stacks[s] = StackLayout(
            name=s, tables=tuple(st.tables),
            features=tuple(f.path for f in features if f.stack == s),
            padded_dim=st.padded_width, total_padded_vocabulary=st.unsharded_height,
            sample_count=sample_counts[s])
    return SparseCoreLayout(topology=topology, stacks=stacks, tables=placements, features=tuple(features))


def _table_signature(table):
    return (table.name, int(table.vocabulary_size), int(table.dim), getattr(table, "combiner", None))
