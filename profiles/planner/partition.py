"""Partition: how ids spread over SparseCores, and what stacking and topology change.

* mod vs div: SparseCore always mod-shards (id % S, rotated per table);
  TPUEmbedding v1's `partition_strategy` default was 'div' (contiguous id
  ranges).  Both loads come from the same pass (raw lookups per shard); with
  a frequency-ordered vocabulary 'div' sends every hot id to shard 0.
* stacking: TF stacks tables by default; the alternative (disable_table_stacking)
  is planned from each table's own statistics and compared by memory.
* topology: the same limits at every candidate chip count the profile
  covered (exact maxima), so a user can compare without re-reading data.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List

from profiles.planner.enumerate import limit_value
from profiles.planner.estimate import csr_buffer_bytes_per_sc, partition_bytes_per_sc
from profiles.planner.propose import buffer_multiple
from profiles.planner.sources import matching_profile
from profiles.planner.types import Policy, Proposal, StackFigures, TableFigures
from profiles.profile import Profile
from profiles.units import GlobalConfig, StackUnit, table_units
from tpu_embed.core.model import ModelConfig
from tpu_embed.sparsecore.padding import round_up


def table_balance(tables: Dict[str, TableFigures]) -> Dict[str, dict]:
    out = {}
    for name, t in tables.items():
        entry: Dict[str, Any] = {"stack": t.stack, "origin": t.origin}
        if t.shard_load is not None:
            s = t.shard_load.summary()
            entry.update(mod_balance=s["mod_balance"], div_balance=s["div_balance"],
                         div_shard0_share=(int(t.shard_load.div[0]) / int(t.shard_load.div.sum())
                                           if int(t.shard_load.div.sum()) else 0.0),
                         better="mod" if s["mod_balance"] <= s["div_balance"] else "div")
        if t.partitions is not None:
            entry.update(max_ids_per_partition=t.partitions.max_ids,
                         max_unique_ids_per_partition=t.partitions.max_unique_ids,
                         destination_balance=t.partitions.destination_balance())
        out[name] = entry
    return out


def _stack_memory(figs: List[StackFigures], limits: Dict[str, tuple], value: int) -> int:
    return sum(partition_bytes_per_sc(f, *limits[f.spec.name]) + csr_buffer_bytes_per_sc(f, value) for f in figs)


def _quantile_limits(f: StackFigures, policy: Policy) -> tuple:
    pq = policy.partition_quantile if f.exact else "max"
    bq = policy.quantile if f.exact else "max"
    return (limit_value(f.step_max_ids.quantile(pq), policy.headroom),
            limit_value(f.step_max_unique_ids.quantile(pq), policy.headroom),
            limit_value(f.step_max_chip_buffer.quantile(bq), policy.headroom))


def _chip_value(figs: List[StackFigures], slots: Dict[str, int]) -> int:
    need = max((max(1, math.ceil(slots[f.spec.name] / f.spec.sample_count)) for f in figs), default=1)
    m = buffer_multiple(f.spec.sample_count for f in figs)
    return -(-need // m) * m


def stacking_comparison(target: ModelConfig, figures: Dict[str, StackFigures], tables: Dict[str, TableFigures],
                        proposal: Proposal, policy: Policy) -> dict:
    stacked = _stack_memory(list(figures.values()),
                            {n: (e.option.max_ids_per_table, e.option.max_unique_ids_per_table)
                             for n, e in proposal.chosen.items()}, proposal.max_ids_per_chip_per_sample)
    out = {"mode": "tf-default (disable_table_stacking=False)",
           "stacks": {n: list(f.spec.table_names) for n, f in figures.items()},
           "stacked_bytes_per_sc": stacked}
    partitions = {n: t.partitions for n, t in tables.items() if t.partitions is not None}
    if len(partitions) < len(tables):
        out["unstacked"] = None
        out["note"] = "some tables have no per-table statistics for this configuration; no unstacked comparison"
        return out
    g = GlobalConfig.of(target)
    figs = []
    for t in table_units(target):
        spec = StackUnit(t.name, (t,), (0,), round_up(t.dim, 8), sum(f.samples for f in t.features))
        figs.append(StackFigures.from_stats(spec, g, partitions[t.name], "table"))
    limits = {f.spec.name: _quantile_limits(f, policy) for f in figs}
    value = _chip_value(figs, {n: l[2] for n, l in limits.items()})
    unstacked = _stack_memory(figs, {n: l[:2] for n, l in limits.items()}, value)
    out["unstacked"] = {"stacks": len(figs), "max_ids_per_chip_per_sample": value, "bytes_per_sc": unstacked,
                        "max_ids_per_table": {n: l[0] for n, l in limits.items()},
                        "max_unique_ids_per_table": {n: l[1] for n, l in limits.items()}}
    out["recommendation"] = ("keep TF's stacking" if stacked <= unstacked else
                             "disable_table_stacking would need less SparseCore memory under this model, at the "
                             "cost of more stacks (one kernel launch each)")
    return out


def topology_comparison(target: ModelConfig, models: List[Profile]) -> List[dict]:
    """Exact-max limits at every chip count the matching profile covered (same global batch)."""
    source = matching_profile(target, models)
    if source is None:
        return []
    out = []
    for c, status in sorted(source.candidates.items()):
        row = {"num_chips": c, "status": status.status, "reason": status.reason}
        if status.status == "skipped":
            out.append(row)
            continue
        try:
            stacks = source.candidate_stacks(c)
        except KeyError:
            row.update(status="skipped", reason="no statistics for this chip count in the profile")
            out.append(row)
            continue
        figs = [StackFigures.from_stats(sp.stack, sp.global_config, sp.stats, status.status) for sp in stacks.values()]
        limits = {f.spec.name: (f.step_max_ids.max or 1, f.step_max_unique_ids.max or 1,
                                f.step_max_chip_buffer.max or 1) for f in figs}
        value = _chip_value(figs, {n: l[2] for n, l in limits.items()})
        g = figs[0].global_config
        row.update(per_chip_batch=g.per_chip_batch, num_sparse_cores=g.num_sparse_cores, stacks=len(figs),
                   max_ids_per_table={n: l[0] for n, l in limits.items()},
                   max_unique_ids_per_table={n: l[1] for n, l in limits.items()},
                   max_ids_per_chip_per_sample=value,
                   bytes_per_sc=_stack_memory(figs, {n: l[:2] for n, l in limits.items()}, value),
                   worst_destination_balance=max((f.destination_balance or 1.0) for f in figs),
                   is_target=(c == target.topology.num_chips))
        out.append(row)
    return out

