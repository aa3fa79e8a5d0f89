"""`tpu-embed plan --propose`: placements compared under the cost model, and the chosen configuration written.

From the steps the profile job recorded (`profiles.whatif_steps`) and the profile itself:

1. TensorCore moves (`tensor_core_moves`): while a stack's floor (what no id assignment can beat: its hottest
   id's lookups against its mean, per step) is above `BALANCE_TARGET`, the small table of that stack whose
   removal lowers the floor most is moved to the TensorCore (`placements.may_move_to_tensor_core`);
2. the candidates (`placements`): TensorFlow's stacking and `disable_table_stacking`; jax-tpu-embedding's
   `auto_stack_tables` and the planner's own jax stack groups (`jax_stack_groups`); each without and with the
   TensorCore moves;
3. each costed (`profiles.planner.cost`) on the same recorded steps, the cheapest per API chosen (ties keep
   the earlier candidate: TensorFlow's default first);
4. the chosen configurations as plan.json's `proposal` (`Proposal.to_json`), a table (`proposal_lines`) and a
   Python file (`proposal_snippet`) with `SparseCoreEmbeddingConfig`'s keyword arguments and jax's stack
   groups and limits, ready to use.
"""

from __future__ import annotations

import dataclasses
import pprint
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from profiles.display import short_stack_name
from profiles.planner.cost import PlacementCost, placement_cost, steps_are_profile
from profiles.planner.placements import (
    TENSOR_CORE_MAX_TABLE_BYTES,
    Candidate,
    jax_auto_candidate,
    jax_auto_groups,
    jax_groups_candidate,
    jax_placement,
    may_move_to_tensor_core,
    sparse_core_model,
    stackable,
    tensorflow_candidates,
)
from profiles.planner.whatif import Placement, ReplaySteps, StackShape, evaluate, tf_placement
from profiles.profile import Profile
from profiles.units import CandidateUnavailable
from profiles.whatif_steps import WhatIfSteps
from tpu_embed.core.model import ModelConfig
from tpu_embed.sparsecore.jax_layout import ACTIVATION_MEM_BYTES_LIMIT

BALANCE_TARGET = 1.10  # a stack's floor above this is worth a TensorCore move (issue: <= 1.10 where it allows)
_EPS = 1e-9


def sampling_of(replay: ReplaySteps, profile: Profile) -> dict:
    """How the recorded steps cover the profile, for every figure computed from them."""
    src = replay.source
    exact = src.exact
    text = (f"exact: all {src.steps_seen} steps" if exact else
            f"sampled: {len(src.steps)} of {src.steps_seen} steps (every {src.stride}th block of 4 consecutive "
            "steps)")
    if exact and src.steps_seen != profile.steps:
        text += f" of this run (the profile covers {profile.steps}: it merges a base's)"
    return {"exact": exact, "steps": len(src.steps), "steps_seen": src.steps_seen, "stride": src.stride,
            "limits_exact": steps_are_profile(replay, profile), "text": text}


# ---------------------------------------------------------------- TensorCore moves

def _floor(model: ModelConfig, tables: Sequence[str], replay: ReplaySteps) -> float:
    """The floor of a stack of `tables` (it does not depend on their order or rotations)."""
    if not tables:
        return 1.0
    samples = sum(f.samples for t in tables for f in model.table_features(t))
    shape = StackShape("_".join(tables), tuple(tables), (0,) * len(tables), 8, samples)
    return evaluate(Placement("floor", model, (shape,)), replay)[shape.name].floor


def tensor_core_moves(profile: Profile, replay: ReplaySteps,
                      max_table_bytes: int = TENSOR_CORE_MAX_TABLE_BYTES) -> Tuple[str, ...]:
    """The tables to move to the TensorCore (see the module docstring), in the order chosen."""
    model = profile.model
    moved: List[str] = []
    while True:
        try:
            sc = sparse_core_model(model, moved)
        except CandidateUnavailable:
            break
        placement = tf_placement(sc)
        loads = evaluate(placement, replay)
        best: Optional[Tuple[float, str]] = None
        for st in placement.stacks:
            floor = loads[st.name].floor
            if floor <= BALANCE_TARGET:
                continue
            for t in st.tables:
                if not may_move_to_tensor_core(model, t, max_table_bytes) or len(sc.tables) == 1:
                    continue
                gain = floor - _floor(sc, [x for x in st.tables if x != t], replay)
                if gain > _EPS and (best is None or gain > best[0]):
                    best = (gain, t)
        if best is None:
            break
        moved.append(best[1])
    return tuple(moved)


# ---------------------------------------------------------------- jax stack groups

def jax_stack_groups(model: ModelConfig, replay: ReplaySteps, profile: Profile,
                     activation_mem_bytes_limit: int = ACTIVATION_MEM_BYTES_LIMIT) -> Tuple[Tuple[str, ...], ...]:
    """jax stack groups of `model` (SparseCore tables): from `auto_stack_tables`' groups, the merge of two groups
    (one optimizer, one combiner, activations within the limit; either order) that lowers the traffic per step
    most, or keeps it and saves a kernel, repeated while there is one."""
    groups = [tuple(g) for g in jax_auto_groups(model)]
    cache: Dict[Tuple[str, ...], float] = {}

    def traffic(group: Tuple[str, ...]) -> float:
        if group not in cache:
            p = jax_placement(model, [group], "group")
            load = evaluate(p, replay)[p.stacks[0].name]
            cache[group] = load.busiest_traffic / max(load.steps, 1)
        return cache[group]

    while True:
        best: Optional[Tuple[float, int, int, Tuple[str, ...]]] = None
        for i in range(len(groups)):
            for j in range(i + 1, len(groups)):
                a, b = groups[i], groups[j]
                if not stackable(model, a, b, activation_mem_bytes_limit):
                    continue
                for merged in (a + b, b + a):
                    delta = traffic(merged) - traffic(a) - traffic(b)
                    if delta <= _EPS and (best is None or delta < best[0] - _EPS):
                        best = (delta, i, j, merged)
        if best is None:
            return tuple(groups)
        _, i, j, merged = best
        groups = [g for k, g in enumerate(groups) if k not in (i, j)] + [merged]


# ---------------------------------------------------------------- the comparison

@dataclasses.dataclass(frozen=True)
class Proposal:
    model: ModelConfig
    sampling: dict
    tensor_core: Tuple[str, ...]
    costs: Tuple[PlacementCost, ...]
    tensorflow: PlacementCost
    jax: Optional[PlacementCost]
    jax_unavailable: Optional[str]

    def to_json(self) -> dict:
        return {"cost_model": "docs/explanation/partitioning.md (profiles/planner/cost.py)",
                "sampling": self.sampling, "balance_target": BALANCE_TARGET,
                "tensor_core": list(self.tensor_core),
                "candidates": [_cost_json(c) for c in self.costs],
                "chosen": {"tensorflow": self.tensorflow.label, "jax": self.jax.label if self.jax else None},
                "tensorflow": tensorflow_config(self.tensorflow),
                "jax": jax_config(self.jax, self.model) if self.jax else {"unavailable": self.jax_unavailable}}


def propose_placements(profile: Profile, steps: WhatIfSteps, *,
                       tensor_core_max_bytes: int = TENSOR_CORE_MAX_TABLE_BYTES,
                       activation_mem_bytes_limit: int = ACTIVATION_MEM_BYTES_LIMIT) -> Proposal:
    """Every candidate placement of `profile`'s model costed on its recorded `steps` (see the module)."""
    model = profile.model
    replay = ReplaySteps(model, steps)
    moved = tensor_core_moves(profile, replay, tensor_core_max_bytes)
    candidates: List[Candidate] = []
    jax_unavailable: Optional[str] = None
    for tc in ((), moved) if moved else ((),):
        candidates += tensorflow_candidates(model, tc)
        try:
            auto = jax_auto_candidate(model, tc)
            candidates.append(auto)
            groups = jax_stack_groups(sparse_core_model(model, tc), replay, profile, activation_mem_bytes_limit)
            if groups != auto.groups:
                candidates.append(jax_groups_candidate(model, groups, tc))
        except CandidateUnavailable as e:
            jax_unavailable = str(e)
    costs = tuple(placement_cost(c, replay, profile) for c in candidates)

    def cheapest(api: str) -> Optional[PlacementCost]:
        mine = [c for c in costs if c.candidate.api == api]
        return min(mine, key=lambda c: c.rank()) if mine else None

    tf = cheapest("tensorflow")
    assert tf is not None
    return Proposal(model, sampling_of(replay, profile), moved, costs, tf, cheapest("jax"), jax_unavailable)


# ---------------------------------------------------------------- the chosen configurations

def _tensor_core_features(cost: PlacementCost) -> Dict[str, int]:
    return {f: w for t in cost.tensor_core for f, w in t.widths.items()}


def tensorflow_config(cost: PlacementCost) -> dict:
    """`SparseCoreEmbeddingConfig`'s keyword arguments of a TensorFlow placement, and its TensorCore features."""
    stacks = cost.stacks
    return {"placement": cost.label,
            "sparse_core_config": {
                "disable_table_stacking": cost.candidate.disable_table_stacking,
                "max_ids_per_chip_per_sample": cost.max_ids_per_chip_per_sample,
                "max_ids_per_table": {s.name: s.limits.max_ids for s in stacks},
                "max_unique_ids_per_table": {s.name: s.limits.max_unique_ids for s in stacks},
                "allow_id_dropping": False},
            "tensor_core_features": _tensor_core_features(cost),
            "limits_from": {s.name: s.limits.limits_from for s in stacks}}


def jax_config(cost: PlacementCost, model: ModelConfig) -> dict:
    """jax-tpu-embedding's stack groups and per-stack limits of a jax placement, and its TensorCore features."""
    t = model.topology
    return {"placement": cost.label, "global_device_count": t.num_chips, "num_sc_per_device": t.num_sc_per_chip,
            "stack_groups": {s.name: list(s.tables) for s in cost.stacks},
            "limits": {s.name: {"max_ids_per_partition": s.limits.max_ids,
                                "max_unique_ids_per_partition": s.limits.max_unique_ids,
                                "suggested_coo_buffer_size_per_device": s.limits.sc_buffer_slots * t.num_sc_per_chip}
                       for s in cost.stacks},
            "tensor_core_features": _tensor_core_features(cost),
            "limits_from": {s.name: s.limits.limits_from for s in cost.stacks}}


def _cost_json(c: PlacementCost) -> dict:
    return {"label": c.label, "api": c.candidate.api, "kernels": c.kernels, "steps": c.steps,
            "busiest_ids_per_step": c.busiest_ids, "busiest_unique_ids_per_step": c.busiest_rows,
            "gathered_bytes_per_step": c.gathered_bytes, "traffic_bytes_per_step": c.traffic_bytes,
            "balance": c.balance, "floor": c.floor, "buffer_bytes_per_sc": c.memory_bytes_per_sc,
            "tensor_core_bytes_per_step": c.tensor_core_bytes,
            "tensor_core": {t.table: {"features": t.widths, "table_bytes": t.table_bytes,
                                      "lookup_bytes_per_step": t.lookup_bytes} for t in c.tensor_core},
            "stacks": {s.name: {"tables": list(s.tables), "rotations": list(s.rotations), "padded_dim": s.padded_dim,
                                "busiest_ids_per_step": s.busiest_ids, "busiest_unique_ids_per_step": s.busiest_rows,
                                "traffic_bytes_per_step": s.busiest_traffic, "balance": s.balance,
                                "floor": s.floor, **dataclasses.asdict(s.limits)}
                       for s in c.stacks}}


# ---------------------------------------------------------------- shown to people

def _limits_word(c: Mapping) -> str:
    kinds = {s["limits_from"] for s in c["stacks"].values()}
    return "exact" if kinds == {"exact"} else ("bound" if "bound-from-tables" in kinds else "profiled")


def proposal_lines(proposal: Mapping) -> List[str]:
    """plan.json's `proposal` as a table, the chosen configurations marked."""
    chosen = proposal["chosen"]
    rows = [("placement", "API", "kernels", "ids/step", "rows/step", "gathered KiB", "traffic KiB", "balance",
             "floor", "buffer KiB/SC", "limits", "TensorCore KiB", "")]
    for c in proposal["candidates"]:
        mark = " <- chosen" if c["label"] in (chosen["tensorflow"], chosen["jax"]) else ""
        rows.append((c["label"], c["api"], str(c["kernels"]), f"{c['busiest_ids_per_step']:.1f}",
                     f"{c['busiest_unique_ids_per_step']:.1f}", f"{c['gathered_bytes_per_step'] / 1024:.2f}",
                     f"{c['traffic_bytes_per_step'] / 1024:.2f}", f"{c['balance']:.2f}", f"{c['floor']:.2f}",
                     f"{c['buffer_bytes_per_sc'] / 1024:.1f}", _limits_word(c),
                     f"{c['tensor_core_bytes_per_step'] / 1024:.2f}" if c["tensor_core"] else "-", mark))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"placements compared (cost model: docs/explanation/partitioning.md; per step, from the recorded steps, "
             f"{proposal['sampling']['text']}):"]
    lines += ["  " + "  ".join(c.ljust(w) if i in (0, 1, 12) else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    lines.append("  ids, rows, gathered, traffic: the busiest destination SparseCore's, summed over the stacks (one "
                 "kernel each); balance / floor: busiest / mean ids, and what no id assignment can beat")
    tf = proposal["tensorflow"]
    sc = tf["sparse_core_config"]
    per_stack = ", ".join(f"{short_stack_name(n)} {sc['max_ids_per_table'][n]}/{sc['max_unique_ids_per_table'][n]}"
                          for n in sc["max_ids_per_table"])
    lines.append(f"TensorFlow: {tf['placement']}: SparseCoreEmbeddingConfig(disable_table_stacking="
                 f"{sc['disable_table_stacking']}, max_ids_per_chip_per_sample={sc['max_ids_per_chip_per_sample']}, "
                 f"allow_id_dropping={sc['allow_id_dropping']}, max_ids_per_table / max_unique_ids_per_table: "
                 f"{per_stack})")
    for f, w in tf["tensor_core_features"].items():
        lines.append(f"  spec: categorical {f}: embedding_lookup_device: tpu_tensor_core, tensor_core_width: {w}")
    jx = proposal["jax"]
    if "unavailable" in jx:
        lines.append(f"jax-tpu-embedding: no placement ({jx['unavailable']})")
    else:
        groups = ", ".join(f"[{', '.join(g)}]" if len(g) <= 4 else f"[{short_stack_name(n, g)}]"
                           for n, g in jx["stack_groups"].items())
        lines.append(f"jax-tpu-embedding: {jx['placement']}: stack groups {groups}")
    kinds = {k for cfg in (tf, jx) for k in cfg.get("limits_from", {}).values()}
    if "bound-from-tables" in kinds:
        lines.append("  limits marked bound: the sum of the member tables' maxima (no step can exceed it; an exact "
                     "profile of that stacking needs less memory)")
    return lines


_SNIPPET = '''"""The SparseCore configuration `tpu-embed plan --propose` chose for model {key}.

Cost model: docs/explanation/partitioning.md; figures from the recorded steps ({sampling}).
TensorFlow: {tf_label}.  jax-tpu-embedding: {jax_label}.
{tensor_core_note}"""

# Features to look up on the TensorCore (spec: embedding_lookup_device: tpu_tensor_core, tensor_core_width: N).
# The limits below are for the model with them moved.
TENSOR_CORE_FEATURES = {tensor_core}

SPARSE_CORE_CONFIG = {sparse_core_config}

JAX_GLOBAL_DEVICE_COUNT = {devices}
JAX_NUM_SC_PER_DEVICE = {nsc}
JAX_STACK_GROUPS = {groups}
JAX_LIMITS = {limits}


def sparse_core_config():
    """TensorFlow's SparseCoreEmbeddingConfig with the proposed limits (TPUEmbeddingV2(..., sparse_core_config=))."""
    from tensorflow.python.tpu.tpu_embedding_v3 import SparseCoreEmbeddingConfig
    return SparseCoreEmbeddingConfig(**SPARSE_CORE_CONFIG)


def stack_feature_specs(feature_specs):
    """Stack jax-tpu-embedding FeatureSpecs (unstacked, any nest; in place) in the proposed groups, with the
    proposed limits on every StackedTableSpec."""
    import dataclasses

    import jax
    from jax_tpu_embedding.sparsecore.lib.nn import embedding, table_stacking

    for name, tables in JAX_STACK_GROUPS.items():
        if len(tables) > 1:
            table_stacking.stack_tables(feature_specs, tables, global_device_count=JAX_GLOBAL_DEVICE_COUNT,
                                        num_sc_per_device=JAX_NUM_SC_PER_DEVICE, stack_name=name)
    embedding.prepare_feature_specs_for_training(feature_specs, global_device_count=JAX_GLOBAL_DEVICE_COUNT,
                                                 num_sc_per_device=JAX_NUM_SC_PER_DEVICE)
    for feature in jax.tree.leaves(feature_specs):
        spec = feature.table_spec.stacked_table_spec
        feature.table_spec.stacked_table_spec = dataclasses.replace(spec, **JAX_LIMITS[spec.stack_name])
    return feature_specs
'''


def _literal(value) -> str:
    return pprint.pformat(value, width=100, sort_dicts=False)


def proposal_snippet(proposal: Mapping, model_key: str) -> str:
    """A Python file holding the chosen configurations (`sparse_core_config()`, `stack_feature_specs(specs)`)."""
    tf, jx = proposal["tensorflow"], proposal["jax"]
    available = "unavailable" not in jx
    tc = tf["tensor_core_features"]
    note = ("" if not tc else
            f"Move {', '.join(tc)} to the TensorCore in the spec first: the stacks below are those of the model "
            "without them.\n")
    return _SNIPPET.format(
        key=model_key, sampling=proposal["sampling"]["text"], tf_label=tf["placement"],
        jax_label=jx["placement"] if available else f"none ({jx['unavailable']})", tensor_core_note=note,
        tensor_core=_literal(tc), sparse_core_config=_literal(tf["sparse_core_config"]),
        devices=jx.get("global_device_count"), nsc=jx.get("num_sc_per_device"),
        groups=_literal(jx.get("stack_groups", {})), limits=_literal(jx.get("limits", {})))
