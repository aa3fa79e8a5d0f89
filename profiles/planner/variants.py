"""What-if: the plan's figures for other chip counts, SparseCores per chip and global batches, from the steps the
profile job recorded (`profiles.whatif_steps`), without reading the data again.

Every plan made from a profile with recorded steps has them (plan.json's `what_if`, printed by `tpu-embed plan`):
the configuration as profiled, then x1/2, x2 and x4 the chips, 2 and 4 SparseCores per chip (TPU v6e, v5p), and
half and twice the global batch; each with TensorFlow's stacking of that configuration, re-partitioned by
`profiles.planner.whatif.evaluate`.  Per configuration: per stack the largest ids and unique ids of one
(source, destination) pair (`max_ids_per_table`, `max_unique_ids_per_table`), the chip id buffer
(`max_ids_per_chip_per_sample`), the buffer memory per SparseCore (`estimate`'s model), the busiest destination's
ids per step against the mean (balance) and its floor; with the sampling beside it: "exact" where every profiled
step was recorded, else "sampled: k of n steps" (the maxima of a sample are not limits that hold on every step:
`--candidate-chip-counts` profiles other chip counts exactly, in the same pass).
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Tuple

from profiles.planner.estimate import csr_buffer_bytes, staging_bytes
from profiles.planner.whatif import ReplaySteps, chip_value, evaluate, global_batch, over_mean, tf_placement, variant
from profiles.units import CandidateUnavailable
from profiles.whatif_steps import WhatIfSteps
from tpu_embed.core.model import ModelConfig

Variant = Tuple[str, int, int, int]  # label, chips, SparseCores per chip, global batch


def variants_of(model: ModelConfig) -> List[Variant]:
    """The configurations the plan shows beside `model`'s own (see the module docstring)."""
    c, n, B = model.topology.num_chips, model.topology.num_sc_per_chip, global_batch(model)
    out: List[Variant] = [("as profiled", c, n, B)]
    if c % 2 == 0:
        out.append(("chips x1/2", c // 2, n, B))
    out += [("chips x2", 2 * c, n, B), ("chips x4", 4 * c, n, B)]
    out += [(f"{k} SparseCores per chip", c, k, B) for k in (2, 4) if k != n]
    if B % 2 == 0:
        out.append(("batch B/2", c, n, B // 2))
    out.append(("batch 2B", c, n, 2 * B))
    return out


def _sampling(steps: WhatIfSteps, evaluated: int, profiled_batch: int, batch: int) -> dict:
    total = steps.steps_seen * profiled_batch // batch  # the steps the profiled data makes at this batch
    if steps.exact:
        return {"exact": True, "steps": evaluated, "of": total, "text": "exact"}
    return {"exact": False, "steps": evaluated, "of": total, "text": f"sampled: {evaluated} of {total} steps"}


def what_if(target: ModelConfig, source: ModelConfig, steps: WhatIfSteps, profile_steps: Optional[int] = None
            ) -> dict:
    """plan.json's `what_if` for `target` (a configuration of the same tables, features and global batch as
    `source`, the profiled model whose recorded `steps` these are; `profile_steps`: the steps its profile covers,
    more where it merges a base's)."""
    replay = ReplaySteps(source, steps)
    B = global_batch(source)
    rows = []
    for label, chips, nsc, batch in variants_of(target):
        row: dict = {"label": label, "num_chips": chips, "num_sc_per_chip": nsc, "num_sparse_cores": chips * nsc,
                     "global_batch": batch}
        try:
            model = variant(target, chips, nsc, batch)
            placement = tf_placement(model)
            loads = evaluate(placement, replay)
        except CandidateUnavailable as e:
            rows.append({**row, "status": "skipped", "reason": str(e)})
            continue
        value = chip_value(loads, placement)
        shapes = {s.name: s for s in placement.stacks}
        stacks = {}
        memory = busiest = mean = floor = 0.0
        for name, load in loads.items():
            shape = shapes[name]
            n = max(load.steps, 1)
            stacks[name] = {"tables": list(shape.tables), "max_ids_per_table": load.max_ids,
                            "max_unique_ids_per_table": load.max_unique_ids, "chip_buffer_slots": load.max_chip_buffer,
                            "busiest_ids_per_step": load.busiest_ids / n, "mean_ids_per_step": load.mean_ids / n,
                            "balance": load.balance, "floor": load.floor}
            memory += staging_bytes(load.max_ids, load.max_unique_ids, shape.padded_dim)
            memory += csr_buffer_bytes(value, shape.sample_count, nsc)
            busiest, mean, floor = busiest + load.busiest_ids / n, mean + load.mean_ids / n, floor + load.floor_ids / n
        evaluated = min((load.steps for load in loads.values()), default=0)
        rows.append({**row, "status": "evaluated", "per_chip_batch": model.per_chip_batch,
                     "sampling": _sampling(steps, evaluated, B, batch), "stacks": stacks,
                     "max_ids_per_chip_per_sample": value, "bytes_per_sc": int(memory),
                     "busiest_ids_per_step": busiest, "balance": over_mean(busiest, mean),
                     "floor": over_mean(floor, mean)})
    recorded = steps.sampling()
    if profile_steps is not None and profile_steps != steps.steps_seen:
        recorded += f" of this run; the profile covers {profile_steps}"
    return {"source": "the profile job's recorded steps (whatif-<model>.json)", "recorded": recorded,
            "configurations": rows}


def what_if_lines(what: Optional[Mapping]) -> List[str]:
    """plan.json's `what_if` as a table."""
    if not what or not what.get("configurations"):
        return []
    head = ("configuration", "chips x SCs", "batch", "stacks", "max_ids_per_table", "max_unique_ids",
            "per_sample", "KiB/SC", "balance", "floor", "sampling")
    rows, skipped = [head], []
    for r in what["configurations"]:
        if r["status"] != "evaluated":
            skipped.append(f"{r['label']} ({r['reason']})")
            continue
        st = r["stacks"].values()
        rows.append((r["label"], f"{r['num_chips']} x {r['num_sc_per_chip']}", str(r["global_batch"]), str(len(st)),
                     str(max((s["max_ids_per_table"] for s in st), default=0)),
                     str(max((s["max_unique_ids_per_table"] for s in st), default=0)),
                     str(r["max_ids_per_chip_per_sample"]), f"{r['bytes_per_sc'] / 1024:.1f}", f"{r['balance']:.2f}",
                     f"{r['floor']:.2f}", r["sampling"]["text"]))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [f"what-if from the recorded steps ({what['recorded']}; TensorFlow's stacking of each configuration):"]
    lines += ["  " + "  ".join(c.ljust(w) if i in (0, 1, 10) else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.append("  max_ids_per_table / max_unique_ids: the largest of any stack; balance / floor: the busiest "
                 "destination SparseCore's ids per step against the mean, summed over the stacks")
    if skipped:
        lines.append(f"  not possible: {'; '.join(skipped)}")
    if any(not r["sampling"]["exact"] for r in what["configurations"] if r["status"] == "evaluated"):
        lines.append("  sampled figures are a sample's maxima, not limits: `--candidate-chip-counts N` profiles "
                     "N chips exactly")
    return lines
