"""What `tpu-embed plan` and `tpu-embed report` do, as plain functions of typed arguments.

The command line (its flags and what it prints) is `pipelines.cli.plan_report`. Every function works from the
profile directory alone: every profile file records its tables, features and topology, so the configuration
to plan for is optional (another one, e.g. another chip count, is planned from the same statistics).
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Optional

from profiles.errors import ProfileError

if TYPE_CHECKING:
    from profiles.jax_fdo import JaxFdoStats
    from profiles.plan_file import Plan
    from tpu_embed.core.model import ModelConfig

# The planner, the report, the jax writer and the store are imported by the function that uses them: each
# command loads only its own (the report's plotting is the slowest).


def make_plan(profiles: str, model_config: Optional[ModelConfig] = None, *, quantile: str = "max",
              headroom: float = 1.0, partition_quantile: str = "max", min_steps: int = 100,
              model: Optional[str] = None) -> Plan:
    """The plan of the profile in `profiles` for `model_config` (default: the profiled one), with its balance;
    the planner's warnings are in `Plan.warnings`, not raised."""
    from profiles.balance_figures import with_balance
    from profiles.planner import plan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the caller shows them from the plan, once each
        p = plan(profiles, model_config, quantile=quantile, headroom=headroom,
                 partition_quantile=partition_quantile, min_steps=min_steps, model=model)
    return with_balance(p, profiles, quantile=quantile, partition_quantile=partition_quantile, headroom=headroom)


def propose(p: Plan, profiles: str, plan_path: str, tensor_core_max_bytes: Optional[int] = None) -> str:
    """Attach the placement comparison to plan `p` and write the chosen configurations beside the plan file
    `plan_path` (PLAN_proposal.py); returns that file's path."""
    from profiles.jsonio import atomic_write_text
    from profiles.planner.placements import TENSOR_CORE_MAX_TABLE_BYTES
    from profiles.planner.proposal import proposal_snippet, propose_placements
    from profiles.store import ProfileStore
    from profiles.whatif_steps import read_what_if_steps, what_if_path
    profile = ProfileStore(profiles).read(model=p.model_key)
    if profile.model.key != p.model_key:
        raise ProfileError(f"--propose compares placements of the profiled configuration only: {profiles} "
                           f"holds no profile of the planned one ({p.model_key}); drop --spec")
    steps = read_what_if_steps(profiles, profile.model)
    if steps is None:
        raise ProfileError(f"--propose needs the recorded steps {what_if_path(profiles, profile.model.key)}, "
                           "which the profile job writes beside the profile: re-run `tpu-embed run` (or `tpu-embed "
                           "profile`) with this version")
    limit = TENSOR_CORE_MAX_TABLE_BYTES if tensor_core_max_bytes is None else tensor_core_max_bytes
    p.proposal = propose_placements(profile, steps, tensor_core_max_bytes=limit).to_json()
    path = os.path.splitext(plan_path)[0] + "_proposal.py"
    atomic_write_text(path, proposal_snippet(p.proposal, p.model_key))
    return path


def write_fdo_files(stats: JaxFdoStats, output: str, model_config: Optional[ModelConfig] = None,
                    spec_path: Optional[str] = None) -> None:
    """Write jax-tpu-embedding's FDO files of `stats` to `output`; `model_config` (read from `spec_path`), where
    given, must be the profiled configuration: the exact per-partition figures exist for it alone."""
    from profiles.jax_fdo import write_jax_fdo
    if model_config is not None and model_config.key != stats.model.key:
        raise ProfileError(
            f"--spec {spec_path} is another configuration than the profiled one ({stats.model.key}): jax's "
            "exact per-partition figures exist only for the profiled tables, features and topology")
    write_jax_fdo(stats, output)


def report(profiles: str, plan_path: Optional[str], output: str, model: Optional[str] = None) -> str:
    """Write OUTPUT/index.html and its PNGs for the profile in `profiles` (the model `model` where it holds
    several) and the plan file `plan_path` (None: planned here); returns the HTML path."""
    from profiles.report import write_report
    from profiles.store import ProfileStore
    source = ProfileStore(profiles).read(model=model) if model and not plan_path else profiles
    return write_report(source, plan_path, output)
