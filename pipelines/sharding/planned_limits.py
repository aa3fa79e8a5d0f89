"""Limits planned from the same pass that wrote the shards (the default of `tpu-embed run` / `shard`).

Without `--plan` and without a `limits` section in the spec, the shard job
packs every step with unbounded limits (`pipelines.sharding.packing_limits.unbounded_limits`):
the CSR prefixes written to the shards do not depend on the limits, only
overflow does.  The profile of that same pass is then planned with exact
maxima (`profiles.plan(..., quantile="max", partition_quantile="max")`), and
the artifact records the planned limits:

* `manifest.json["limits"]` (and the shard job's copy) with
  `source: "planned: plan.json ..."`;
* `manifest.json["shards"]["format"]`: the id buffer sizes `parse_fn` pads
  to, from the planned `max_ids_per_chip_per_sample`;
* `plan.json` in the artifact directory (the whole plan: observed figures,
  drops, memory, and `balance`: per stack frequency order and balanced ids side by side with their floor,
  `profiles.balance_figures`), listed in the manifest's files.

No step can overflow those limits: they are the maxima over every step.
"""

from __future__ import annotations

import warnings
from typing import Optional

from pipelines.output import write_atomic
from pipelines.sharding import packing_limits as shard_limits
from profiles import plan as make_plan
from profiles.balance_figures import with_balance
from profiles.jsonio import dumps_readable
from tpu_embed.artifact.manifest import FILENAME, LimitsInfo, Manifest, manifest_bytes, manifest_path, read_manifest
from tpu_embed.artifact.shard_format_choice import shard_format_for

PLAN_FILE = "plan.json"
PLANNED_SOURCE = f"planned: {PLAN_FILE} (exact maxima of this run's profile)"


def needs_planning(manifest: Manifest) -> bool:
    return manifest.limits is not None and manifest.limits.source == shard_limits.UNBOUNDED_SOURCE


def finalize(cfg, vocab_sizes) -> Optional[object]:
    """If the shard job of `cfg` ran unbounded, plan its profile and record the limits; returns the Plan."""
    manifest = read_manifest(cfg.output)
    if not needs_planning(manifest):
        return None
    spec = cfg.spec
    layout = spec.layout(vocab_sizes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # recorded in plan.warnings
        plan = make_plan(cfg.resolved_profile_dir(), spec.model(vocab_sizes), quantile="max",
                         partition_quantile="max")
    plan = with_balance(plan, cfg.resolved_profile_dir())  # frequency order and balanced ids side by side
    limits = LimitsInfo(max_ids_per_chip_per_sample=int(plan.max_ids_per_chip_per_sample),
                        max_ids_per_table={s: int(plan.max_ids_per_table[s]) for s in layout.stacks},
                        max_unique_ids_per_table={s: int(plan.max_unique_ids_per_table[s])
                                                  for s in layout.stacks},
                        allow_id_dropping=bool(plan.allow_id_dropping), source=PLANNED_SOURCE)
    fmt = shard_format_for(spec, layout, limits)
    info = write_atomic(cfg.output, PLAN_FILE, dumps_readable(plan.to_json()).encode("utf-8"),
                        extra={"kind": "plan"})
    d = manifest.to_json()
    d["limits"] = limits.to_json()
    for job in d.get("jobs", {}).values():
        if job.get("limits") is not None and job["limits"].get("source") == shard_limits.UNBOUNDED_SOURCE:
            job["limits"] = limits.to_json()
    if d.get("shards") is not None:
        written = d["shards"]["format"]
        d["shards"]["format"] = fmt.to_json()
        if written.get("jax") is not None:  # the jax records' sizes (the job's maxima) do not depend on TF's limits
            d["shards"]["format"]["jax"] = written["jax"]
    files = [f for f in d.get("files", []) if f.get("kind") != "plan"] + [info.to_json()]
    d["files"] = sorted(files, key=lambda f: f["path"])
    Manifest.from_json(d, manifest_path(cfg.output))  # what is written is what readers accept
    write_atomic(cfg.output, FILENAME, manifest_bytes(d))
    return plan
