"""The SparseCore limits the shards are packed with, and where they come from (recorded in the manifest)."""

from __future__ import annotations

from typing import Optional

from profiles import load_plan
from tpu_embed.artifact.manifest import LimitsInfo
from tpu_embed.artifact.spec import Spec
from tpu_embed.sparsecore import (
    DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE,
    DEFAULT_MAX_IDS_PER_TABLE,
    DEFAULT_MAX_UNIQUE_IDS_PER_TABLE,
)

# `run`/`shard` without pinned limits pack with these (nothing can overflow), then record the limits
# planned from the same pass's profile (`pipelines.sharding.planned_limits`). The CSR prefixes do not depend
# on the limits; only overflow does. A multiple of 8, so every id buffer size is one too.
UNBOUNDED_SOURCE = "unbounded (to be planned from this run's profile)"
UNBOUNDED_IDS_PER_CHIP_PER_SAMPLE = 1 << 20
UNBOUNDED_PER_PARTITION = (1 << 31) - 1


def unbounded_limits(layout) -> LimitsInfo:
    stacks = list(layout.stacks)
    return LimitsInfo(max_ids_per_chip_per_sample=UNBOUNDED_IDS_PER_CHIP_PER_SAMPLE,
                      max_ids_per_table={s: UNBOUNDED_PER_PARTITION for s in stacks},
                      max_unique_ids_per_table={s: UNBOUNDED_PER_PARTITION for s in stacks},
                      allow_id_dropping=False, source=UNBOUNDED_SOURCE)


def resolve_limits(spec: Spec, layout, plan_path: Optional[str] = None, *, auto: bool = False) -> LimitsInfo:
    """Limits from a plan file (profiles.load_plan), else the spec's `limits`; else, with `auto` (the
    job also profiles), unbounded limits to be replaced by the plan of that profile; else TF's defaults."""
    stacks = list(layout.stacks)
    if auto and not plan_path and not spec.limits.given:
        return unbounded_limits(layout)
    if plan_path:
        plan = load_plan(plan_path)
        d = plan.to_json() if hasattr(plan, "to_json") else {}
        sc = d.get("sparse_core_config") or d.get("sparse_core") or {}
        mids = getattr(plan, "max_ids_per_table", None) or sc.get("max_ids_per_table") or {}
        muids = getattr(plan, "max_unique_ids_per_table", None) or sc.get("max_unique_ids_per_table") or {}
        mpcs = (getattr(plan, "max_ids_per_chip_per_sample", None) or sc.get("max_ids_per_chip_per_sample")
                or DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE)
        drop = bool(getattr(plan, "allow_id_dropping", False) or sc.get("allow_id_dropping", False))
        unknown = sorted(set(mids) - set(stacks))
        if unknown:
            raise ValueError(f"plan {plan_path} has limits for stacks {unknown}, but this spec's stacks are "
                             f"{stacks}: the plan was made for another spec or topology. Re-run `tpu-embed plan`.")
        return LimitsInfo(max_ids_per_chip_per_sample=int(mpcs),
                          max_ids_per_table={s: int(mids.get(s, DEFAULT_MAX_IDS_PER_TABLE)) for s in stacks},
                          max_unique_ids_per_table={s: int(muids.get(s, DEFAULT_MAX_UNIQUE_IDS_PER_TABLE))
                                                    for s in stacks},
                          allow_id_dropping=drop, source=f"plan:{plan_path}")
    lim = spec.limits
    unknown = sorted((set(lim.max_ids_per_table) | set(lim.max_unique_ids_per_table)) - set(stacks))
    if unknown:
        raise ValueError(f"spec key 'limits': entries for {unknown} are not stacked tables; this spec's stacks are "
                         f"{stacks}. Fix: key the limits by stack name (`tpu-embed inspect` lists them).")
    return LimitsInfo(max_ids_per_chip_per_sample=lim.max_ids_per_chip_per_sample,
                      max_ids_per_table={s: int(lim.max_ids_per_table.get(s, DEFAULT_MAX_IDS_PER_TABLE))
                                         for s in stacks},
                      max_unique_ids_per_table={
                          s: int(lim.max_unique_ids_per_table.get(s, DEFAULT_MAX_UNIQUE_IDS_PER_TABLE))
                          for s in stacks},
                      allow_id_dropping=lim.allow_id_dropping, source="spec" if lim.given else "tf-defaults")
