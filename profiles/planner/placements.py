"""The placements `tpu-embed plan --propose` compares: what TensorFlow's and jax-tpu-embedding's APIs allow.

* TensorFlow: its stacking rule (`tf_placement`), or `disable_table_stacking` (one stack per table);
* jax-tpu-embedding: `auto_stack_tables`' groups (`tpu_embed.sparsecore.jax_layout.jax_layout`), or any groups of tables
  of one optimizer and one combiner whose activations fit `activation_mem_bytes_limit` (`table_stacking.
  stack_tables`, a rotation of `num_sc_per_device` more per table, the stack as wide as its widest table);
* either with some tables moved to the TensorCore (the spec's `embedding_lookup_device: tpu_tensor_core`):
  their features leave the SparseCore model, so the other tables' stacks (names, rotations) are those of the
  model without them.

A table may move to the TensorCore when every feature of it is one value per sample position (no sequence
feature) and the table is small (`tensor_core_table_bytes` at most `TENSOR_CORE_MAX_TABLE_BYTES`: the
TensorCore keeps a copy on every chip and all-reduces its dense gradient every step).
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Sequence, Tuple

from profiles.planner.estimate import ROW_ELEMENT_BYTES
from profiles.planner.whatif import Placement, StackShape, tf_placement
from profiles.profile import Profile
from profiles.units import CandidateUnavailable
from tpu_embed.core.model import ModelConfig, TableConfig
from tpu_embed.sparsecore.jax_layout import ACTIVATION_MEM_BYTES_LIMIT, check_topology, jax_layout, round_up, stack_name

TENSOR_CORE_MAX_TABLE_BYTES = 64 * 1024  # rows x width x 4 B: e.g. 1,024 rows of 16


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A placement as one API writes it: `api` 'tensorflow' (`disable_table_stacking`) or 'jax' (`groups`)."""

    placement: Placement
    api: str
    disable_table_stacking: bool = False
    groups: Tuple[Tuple[str, ...], ...] = ()  # jax: the stack groups, in stack order

    @property
    def label(self) -> str:
        return self.placement.label


def sparse_core_model(model: ModelConfig, tensor_core: Sequence[str]) -> ModelConfig:
    """`model` without the features of the `tensor_core` tables."""
    moved = set(tensor_core)
    features = tuple(f for f in model.features if f.table.name not in moved)
    if not features:
        raise CandidateUnavailable("every table would leave the SparseCores")
    return ModelConfig(features, model.topology)


def _suffix(tensor_core: Sequence[str]) -> str:
    return f" + TensorCore: {', '.join(tensor_core)}" if tensor_core else ""


def tensorflow_candidates(model: ModelConfig, tensor_core: Sequence[str] = ()) -> List[Candidate]:
    """TensorFlow's stacking and `disable_table_stacking=True`, of `model` less the `tensor_core` tables."""
    sc = sparse_core_model(model, tensor_core)
    return [Candidate(tf_placement(sc, "tf-default" + _suffix(tensor_core), tensor_core=tensor_core), "tensorflow"),
            Candidate(tf_placement(sc, "tf-unstacked" + _suffix(tensor_core), disable_table_stacking=True,
                                   tensor_core=tensor_core), "tensorflow", disable_table_stacking=True)]


# ---------------------------------------------------------------- jax-tpu-embedding

def jax_checked(model: ModelConfig) -> None:
    """CandidateUnavailable (why) where jax-tpu-embedding cannot lay `model` out."""
    t = model.topology
    try:
        check_topology(t.num_chips, t.num_sc_per_chip, t.num_hosts)
    except ValueError as e:
        raise CandidateUnavailable(str(e)) from None


def table_activation_bytes(model: ModelConfig, table: TableConfig, padded_dim: int = 0) -> int:
    """A table's activations on one SparseCore (auto_stack_tables' measure): padded width x its features' samples
    per SparseCore x 4 B; `padded_dim` the stack's width where wider than the table's."""
    nsc = model.topology.num_sc_per_chip
    samples = sum(f.samples for f in model.table_features(table.name)) // nsc
    return max(round_up(table.dim, 8), padded_dim) * samples * ROW_ELEMENT_BYTES


def group_activation_bytes(model: ModelConfig, tables: Sequence[str]) -> int:
    """A stack's activations on one SparseCore: every member at the stack's (widest) padded width."""
    width = max(round_up(model.table(t).dim, 8) for t in tables)
    return sum(table_activation_bytes(model, model.table(t), width) for t in tables)


def stackable(model: ModelConfig, a: Sequence[str], b: Sequence[str],
              activation_mem_bytes_limit: int = ACTIVATION_MEM_BYTES_LIMIT) -> bool:
    """jax stacks `a` and `b` together: one optimizer, one combiner, activations within the limit."""
    ta, tb = model.table(a[0]), model.table(b[0])
    return (ta.optimizer_group == tb.optimizer_group and ta.combiner == tb.combiner
            and group_activation_bytes(model, tuple(a) + tuple(b)) <= activation_mem_bytes_limit)


def jax_auto_groups(model: ModelConfig) -> Tuple[Tuple[str, ...], ...]:
    """jax-tpu-embedding's `auto_stack_tables` groups of `model` (default arguments)."""
    jax_checked(model)
    return tuple(tuple(t.name for t in s.tables) for s in jax_layout(model).stacks)


def jax_placement(model: ModelConfig, groups: Sequence[Sequence[str]], label: str,
                  tensor_core: Sequence[str] = ()) -> Placement:
    """`groups` stacked as jax's `stack_tables` does: stack name `stack_name(group)`, rotation `num_sc_per_device`
    more per table, padded to the group's widest table."""
    jax_checked(model)
    t = model.topology
    S = t.num_sparse_cores
    stacks = []
    for group in groups:
        width = max(round_up(model.table(n).dim, 8) for n in group)
        samples = sum(f.samples for n in group for f in model.table_features(n))
        stacks.append(StackShape(stack_name(group), tuple(group),
                                 tuple((i * t.num_sc_per_chip) % S for i in range(len(group))), width, samples))
    return Placement(label, model, tuple(stacks), tuple(tensor_core))


def jax_auto_candidate(model: ModelConfig, tensor_core: Sequence[str] = ()) -> Candidate:
    sc = sparse_core_model(model, tensor_core)
    groups = jax_auto_groups(sc)
    return Candidate(jax_placement(sc, groups, "jax-auto" + _suffix(tensor_core), tensor_core), "jax",
                     groups=groups)


def jax_groups_candidate(model: ModelConfig, groups: Sequence[Sequence[str]], tensor_core: Sequence[str] = ()
                         ) -> Candidate:
    sc = sparse_core_model(model, tensor_core)
    stacks = tuple(tuple(g) for g in groups)
    return Candidate(jax_placement(sc, stacks, "jax-groups" + _suffix(tensor_core), tensor_core), "jax",
                     groups=stacks)


# ---------------------------------------------------------------- the TensorCore

def tensor_core_table_bytes(table: TableConfig) -> int:
    return table.vocabulary_size * table.dim * ROW_ELEMENT_BYTES


def tensor_core_widths(profile: Profile, table: str) -> Dict[str, int]:
    """{feature: tensor_core_width} of `table`'s features: the most values one example had (the profile's exact
    ids-per-example histogram), at least 1."""
    stats = profile.accumulator.tables[table].features
    return {f.name: max(1, int(stats[f.name].ids_per_example.max)) if f.name in stats else 1
            for f in profile.model.table_features(table)}


def may_move_to_tensor_core(model: ModelConfig, table: str, max_table_bytes: int = TENSOR_CORE_MAX_TABLE_BYTES
                            ) -> bool:
    """A table the spec can put on the TensorCore (no sequence feature) and small enough to (see the module)."""
    features = model.table_features(table)
    return (bool(features) and all(len(f.output_shape) == 1 for f in features)
            and tensor_core_table_bytes(model.table(table)) <= max_table_bytes)
