"""Assemble: the stages' results as one `Plan` (profiles/plan_file.py).

Per stack the chosen limits beside the figures they were chosen from, the expected drops and the memory per
SparseCore against TensorFlow's default limits (the memory model of profiles/SCHEMA.md); then the totals.
"""

from __future__ import annotations

from typing import Any, Dict, List

from profiles.plan_file import Plan, StackPlan
from profiles.planner.enumerate import STANDARD_QUANTILES
from profiles.planner.estimate import csr_buffer_bytes_per_sc, partition_bytes_per_sc
from profiles.planner.types import Estimate, Policy, Proposal, StackFigures
from profiles.units import GlobalConfig
from tpu_embed.core.model import ModelConfig

# TF's defaults (TPUEmbeddingV2.DEFAULT_MAX_IDS_PER_TABLE & co), defined once in the core.
from tpu_embed.sparsecore.csr_types import (
    DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE,
    DEFAULT_MAX_IDS_PER_TABLE,
    DEFAULT_MAX_UNIQUE_IDS_PER_TABLE,
)


def assemble(target: ModelConfig, figures: Dict[str, StackFigures], proposal: Proposal, policy: Policy,
             balance: Dict[str, dict], stacking: dict, topologies: List[dict], warns: List[str]) -> Plan:
    """The plan of `target`: `proposal`'s limits per stack with their figures, and the comparisons beside them."""
    stacks = {name: _stack_plan(name, f, proposal) for name, f in figures.items()}
    ids_total = sum(f.ids for f in figures.values())
    return Plan(
        model_key=target.key, global_config=GlobalConfig.of(target).to_json(),
        policy={"quantile": policy.quantile, "partition_quantile": policy.partition_quantile,
                "headroom": policy.headroom, "min_steps": policy.min_steps},
        steps=min((f.steps for f in figures.values()), default=0),
        max_ids_per_table={n: s.max_ids_per_table for n, s in stacks.items()},
        max_unique_ids_per_table={n: s.max_unique_ids_per_table for n, s in stacks.items()},
        max_ids_per_chip_per_sample=proposal.max_ids_per_chip_per_sample,
        allow_id_dropping=proposal.allow_id_dropping, disable_table_stacking=False,
        stacks=stacks, tables=balance, stacking=stacking, topologies=topologies,
        memory=_memory(stacks, proposal, ids_total), warnings=warns, model=target.to_json())


def _stack_plan(name: str, f: StackFigures, proposal: Proposal) -> StackPlan:
    e = proposal.chosen[name]
    planned = e.partition_bytes_per_sc + e.buffer_bytes_per_sc
    default = (partition_bytes_per_sc(f, DEFAULT_MAX_IDS_PER_TABLE, DEFAULT_MAX_UNIQUE_IDS_PER_TABLE)
               + csr_buffer_bytes_per_sc(f, DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE))
    return StackPlan(
        name=name, tables=list(f.spec.table_names), sample_count=f.spec.sample_count, padded_dim=f.spec.padded_dim,
        origin=f.origin, steps=f.steps, max_ids_per_table=e.option.max_ids_per_table,
        max_unique_ids_per_table=e.option.max_unique_ids_per_table,
        required_ids_per_chip_per_sample=proposal.required_per_stack[name], observed=_observed(f),
        drops={"steps_over_max_ids": e.steps_over_max_ids, "steps_over_max_unique_ids": e.steps_over_max_unique_ids,
               "ids_over_max_ids": e.ids_over_limit, "unique_ids_over_max_unique_ids": e.unique_ids_over_limit,
               "buffer_capacity_slots": e.buffer_capacity_slots, "steps_over_buffer": e.steps_over_buffer,
               "chip_steps_over_buffer": e.chip_steps_over_buffer, "ids_dropped_at_most": e.ids_dropped_at_most,
               "drop_rate_at_most": e.drop_rate_at_most, "exact_figures": e.exact},
        memory={"planned_bytes_per_sc": planned, "partition_bytes_per_sc": e.partition_bytes_per_sc,
                "buffer_bytes_per_sc": e.buffer_bytes_per_sc, "tf_default_bytes_per_sc": default,
                "saving_bytes_per_sc": default - planned},
        destination_balance=f.destination_balance,
        options=[_estimate_json(o) for o in proposal.options[name]])


def _memory(stacks: Dict[str, StackPlan], proposal: Proposal, ids_total: int) -> Dict[str, Any]:
    """The plan's totals over its stacks: memory per SparseCore against TF's defaults, drops and failing steps."""
    planned = sum(s.memory["planned_bytes_per_sc"] for s in stacks.values())
    default = sum(s.memory["tf_default_bytes_per_sc"] for s in stacks.values())
    return {"model": "see profiles/SCHEMA.md (Memory model)", "planned_bytes_per_sc": planned,
            "tf_default_bytes_per_sc": default, "saving_bytes_per_sc": default - planned,
            "buffer_multiple": proposal.buffer_multiple,
            "drop_rate_at_most": (sum(s.drops["ids_dropped_at_most"] for s in stacks.values()) / ids_total
                                  if ids_total else 0.0),
            "steps_failing": max((max(s.drops["steps_over_max_ids"], s.drops["steps_over_max_unique_ids"])
                                  for s in stacks.values()), default=0.0)}


def _observed(f: StackFigures) -> dict:
    return {k: {q: h.quantile(q) for q in STANDARD_QUANTILES}
            for k, h in (("max_ids", f.step_max_ids), ("max_unique_ids", f.step_max_unique_ids),
                         ("chip_buffer_slots", f.step_max_chip_buffer))}


def _estimate_json(e: Estimate) -> dict:
    return {"option": e.option.label, "max_ids_per_table": e.option.max_ids_per_table,
            "max_unique_ids_per_table": e.option.max_unique_ids_per_table,
            "chip_buffer_slots": e.option.chip_buffer_slots,
            "max_ids_per_chip_per_sample": e.max_ids_per_chip_per_sample,
            "steps_failing": max(e.steps_over_max_ids, e.steps_over_max_unique_ids),
            "steps_over_buffer": e.steps_over_buffer, "drop_rate_at_most": e.drop_rate_at_most,
            "bytes_per_sc": e.partition_bytes_per_sc + e.buffer_bytes_per_sc}
