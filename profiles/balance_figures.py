"""Balance per stacked table: frequency order and balanced ids side by side, with the floor neither can beat.

A step waits for its busiest destination SparseCore, and `max_ids_per_table` / `max_unique_ids_per_table` (so the
buffer memory) are sized by it. Per stack of the profiled topology, from the profile's own counts (exact, every
step):

* `step_balance`: the busiest destination per step against the mean, summed over steps
  (`PartitionStats.step_destination_balance`); `worst_step_balance`: the largest of one step; `data_balance`: the
  busiest destination over the whole profile against the mean;
* the limits and the buffer bytes per SparseCore a plan makes of them (the planner's own enumerate and propose,
  with the plan's policy): what the balance costs in memory;
* `floor`: what no assignment of ids can beat: per step the larger of the hottest id's lookups (one id lives on
  one SparseCore) and the mean, summed over steps, and of the worst step.

An artifact with balanced ids (`partition: {ids: balanced}`) has its steps counted both ways in the same pass
(`PartitionStats.frequency_order`: the same (sample, id) pairs with each id's frequency-order id), so the two
columns are the same steps; an artifact in frequency order has the frequency column only.

`balance_comparison(profile)` is what plan.json records as `balance` (`with_balance` attaches it to a plan made
from a profile directory) and `balance_lines` prints it (`tpu-embed run`, `plan`, `inspect`, the demo).
"""

from __future__ import annotations

import warnings
from typing import Dict, List, Mapping, Optional, Sequence

from profiles.display import short_stack_name
from profiles.errors import ProfileError
from profiles.histogram import quantile_label
from profiles.plan_file import Plan
from profiles.planner.enumerate import enumerate_options
from profiles.planner.propose import propose
from profiles.planner.types import Policy, StackFigures
from profiles.profile import Profile
from profiles.stats import PartitionStats
from profiles.store import ProfileStore

ORDERS = ("frequency", "balanced")


def _planned(profile: Profile, stats: Mapping[str, PartitionStats], policy: Policy) -> Dict[str, dict]:
    """Per stack the limits and bytes per SparseCore a plan of `stats` (one statistic per stack) would choose."""
    g = profile.global_config
    units = {name: sp.stack for name, sp in profile.stacks.items()}
    figures = {name: StackFigures.from_stats(units[name], g, st, "profiled") for name, st in stats.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        proposal = propose(figures, enumerate_options(figures, policy))
    return {name: {"max_ids_per_table": e.option.max_ids_per_table,
                   "max_unique_ids_per_table": e.option.max_unique_ids_per_table,
                   "bytes_per_sc": e.partition_bytes_per_sc + e.buffer_bytes_per_sc,
                   "partition_bytes_per_sc": e.partition_bytes_per_sc, "buffer_bytes_per_sc": e.buffer_bytes_per_sc}
            for name, e in proposal.chosen.items()}


def _figures(st: PartitionStats) -> dict:
    return {"step_balance": st.step_destination_balance(), "worst_step_balance": st.worst_step_balance,
            "data_balance": st.destination_balance()}


def balance_comparison(profile: Profile, *, quantile: str = "max", partition_quantile: str = "max",
                       headroom: float = 1.0) -> Optional[dict]:
    """The balance of every stack of `profile` in each order it was counted in (see the module docstring), or
    None for a profile without the per-step floor (written before it was counted)."""
    stacks = {name: sp.stats for name, sp in profile.stacks.items()}
    if not stacks or any(st.step_floor_ids is None for st in stacks.values()):
        return None
    both = all(st.frequency_order is not None for st in stacks.values())
    policy = Policy(quantile_label(quantile), float(headroom), quantile_label(partition_quantile), 0)
    counted = {"balanced" if both else "frequency": stacks}
    if both:
        counted["frequency"] = {name: st.frequency_order for name, st in stacks.items()}  # type: ignore[misc]
    planned = {order: _planned(profile, stats, policy) for order, stats in counted.items()}
    out: dict = {"ids": "balanced" if both else "frequency", "num_sparse_cores": profile.global_config.num_sparse_cores,
                 "policy": {"quantile": policy.quantile, "partition_quantile": policy.partition_quantile,
                            "headroom": policy.headroom},
                 "stacks": {}}
    for name, sp in profile.stacks.items():
        st = stacks[name]
        floor = st.step_balance_floor()
        orders = {}
        for order in ORDERS:
            if order in counted:
                fig = _figures(counted[order][name])
                fig["over_floor"] = fig["step_balance"] / floor if floor else None
                orders[order] = {**fig, **planned[order][name]}
        out["stacks"][name] = {"tables": list(sp.stack.table_names), "steps": st.steps,
                               "floor": {"step_balance": floor, "worst_step": st.worst_step_floor},
                               "orders": orders}
    return out


def with_balance(plan: Plan, profile_dir: str, *, quantile: str = "max", partition_quantile: str = "max",
                 headroom: float = 1.0) -> Plan:
    """`plan` with its `balance` (`balance_comparison`) from the profile in `profile_dir` of the configuration it
    was made for; left without one where that profile is not there (a plan for another chip count)."""
    try:
        profile = ProfileStore(profile_dir).read(model=plan.model_key)
    except ProfileError:
        return plan
    if profile.model.key != plan.model_key:
        return plan
    plan.balance = balance_comparison(profile, quantile=quantile, partition_quantile=partition_quantile,
                                      headroom=headroom)
    return plan


def _ratio(a: float, b: float) -> str:
    return f"{a:.2f} -> {b:.2f}"


def balance_lines(balance: Optional[Mapping], stack_tables: Optional[Mapping[str, Sequence[str]]] = None
                  ) -> List[str]:
    """`balance` (a plan's) as a table: per stack the busiest destination per step / mean (summed over steps, and
    the worst step), its floor, the planned limits and bytes per SparseCore; frequency order -> balanced ids
    where both were counted."""
    if not balance or not balance.get("stacks"):
        return []
    both = balance["ids"] == "balanced"
    rows = [("stack", "tables", "per step" + (": frequency -> balanced" if both else ""), "floor", "worst step",
             "max_ids_per_table", "max_unique_ids", "KiB/SC")]
    for name, s in balance["stacks"].items():
        o, floor = s["orders"], s["floor"]
        cur = o["balanced" if both else "frequency"]
        tables = list((stack_tables or {}).get(name) or s["tables"])
        if both:
            f = o["frequency"]
            change = (cur["max_ids_per_table"] - f["max_ids_per_table"]) / f["max_ids_per_table"] \
                if f["max_ids_per_table"] else 0.0
            cells = (_ratio(f["step_balance"], cur["step_balance"]), f"{floor['step_balance']:.2f}",
                     _ratio(f["worst_step_balance"], cur["worst_step_balance"]),
                     f"{f['max_ids_per_table']} -> {cur['max_ids_per_table']} ({change:+.0%})",
                     f"{f['max_unique_ids_per_table']} -> {cur['max_unique_ids_per_table']}",
                     f"{f['bytes_per_sc'] / 1024:.1f} -> {cur['bytes_per_sc'] / 1024:.1f}")
        else:
            cells = (f"{cur['step_balance']:.2f}", f"{floor['step_balance']:.2f}", f"{cur['worst_step_balance']:.2f}",
                     str(cur["max_ids_per_table"]), str(cur["max_unique_ids_per_table"]),
                     f"{cur['bytes_per_sc'] / 1024:.1f}")
        rows.append((short_stack_name(name, tables), str(len(tables))) + cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"balance per stacked table ({balance['num_sparse_cores']} SparseCores; ids: {balance['ids']}):"]
    lines += ["  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
              for r in rows]
    lines.append("  per step = the busiest destination SparseCore / the mean, summed over steps (1.00 is perfect); "
                 "floor = what no id assignment can beat (the hottest id's lookups)")
    if not both:
        lines.append("  `partition: {ids: balanced}` in the spec assigns ids that even it out "
                     "(docs/how-to/balance-sparsecores.md)")
    return lines
