"""The planner: profile statistics -> SparseCore limits, in four small stages.

    sources.resolve      which statistics describe each stack of the target configuration
    enumerate            candidate limit settings per stack (requested quantile, p50..max, TF defaults)
    estimate             expected drops and memory of each setting on the profiled data
    propose              the chosen setting per stack + the one chip-wide id buffer setting
    partition            mod vs div balance, stacking and topology comparisons
    variants             what-if: other chip counts, SparseCores per chip and batches from the recorded steps

`plan(...)` runs them and assembles a `Plan` (profiles/plan_file.py).
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any, Optional, Sequence, Union

from profiles.errors import InsufficientDataWarning, LimitOverflowWarning, ProfileError
from profiles.histogram import parse_quantile, quantile_label
from profiles.model_file import load_model_config
from profiles.plan_file import Plan, StackPlan
from profiles.planner.enumerate import STANDARD_QUANTILES, check_policy, enumerate_options
from profiles.planner.estimate import csr_buffer_bytes_per_sc, partition_bytes_per_sc
from profiles.planner.partition import stacking_comparison, table_balance, topology_comparison
from profiles.planner.propose import propose
from profiles.planner.sources import StatisticsIndex, matching_profile, resolve
from profiles.planner.types import Policy, StackFigures
from profiles.planner.variants import what_if as what_if_of
from profiles.profile import Profile
from profiles.store import ProfileStore
from profiles.units import CandidateUnavailable, GlobalConfig
from profiles.whatif_steps import read_what_if_steps, steps_of
from tpu_embed.core.model import ModelConfig, from_tf_feature_config

# TF's defaults (TPUEmbeddingV2.DEFAULT_MAX_IDS_PER_TABLE & co), defined once in the core.
from tpu_embed.sparsecore.csr_types import (
    DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE,
    DEFAULT_MAX_IDS_PER_TABLE,
    DEFAULT_MAX_UNIQUE_IDS_PER_TABLE,
)

__all__ = ["plan", "Policy"]


def _target_from_spec(spec: Any) -> Optional[ModelConfig]:
    if spec is None or isinstance(spec, ModelConfig):
        return spec
    if isinstance(spec, (tuple, list)) and len(spec) == 2:  # (feature_config, topology)
        return from_tf_feature_config(spec[0], spec[1])
    if isinstance(spec, (str, os.PathLike)):
        return load_model_config(os.fspath(spec))
    raise TypeError(f"spec must be a ModelConfig, (feature_config, Topology) or a spec/layout file path; got "
                    f"{type(spec).__name__}.")


def plan(source: Union[str, os.PathLike, Profile, Sequence[Profile]], spec: Any = None, *,
         quantile: str = "max", headroom: float = 1.0, partition_quantile: str = "max", min_steps: int = 100,
         model: Optional[str] = None, what_if: bool = True) -> Plan:
    """Plan SparseCore limits from profiles.

    `source`: a profile directory, a `Profile`, or several.  `spec`: the
    configuration to plan for (ModelConfig, (feature_config, Topology), or a
    file `profiles.model_file.load_model_config` reads); default: the profiled
    model itself.  `quantile` sizes the chip id buffer
    (max_ids_per_chip_per_sample): 'max' (exact maxima: zero drops on the
    profiled data) or e.g. 'p99.9' (allow_id_dropping, with the drop budget
    stated in the plan).  `partition_quantile` sizes max_ids_per_table and
    max_unique_ids_per_table; keep 'max': TF raises on steps over those
    (LimitOverflowWarning otherwise).  `headroom` multiplies every observed
    figure.  Warns (InsufficientDataWarning, ConfigurationMismatchWarning,
    ConservativeBoundWarning, LimitOverflowWarning) rather than guessing
    silently; the warnings are also recorded in the plan.  `what_if`: the
    plan's `what_if` (`profiles.planner.variants`: other chip counts,
    SparseCores per chip and batches) from the profile job's recorded steps,
    where the profile has them.
    """
    policy = Policy(quantile_label(quantile), float(headroom), quantile_label(partition_quantile), int(min_steps))
    check_policy(policy)
    target = _target_from_spec(spec)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if isinstance(source, Profile):
            index = StatisticsIndex.from_profiles([source])
            target = target or source.model
        elif isinstance(source, (list, tuple)) and source and all(isinstance(p, Profile) for p in source):
            index = StatisticsIndex.from_profiles(list(source))
            if target is None:
                if len(source) != 1:
                    raise ValueError("plan(): several profiles given; pass spec= to say which configuration to plan.")
                target = source[0].model
        elif isinstance(source, (str, os.PathLike)):
            store = ProfileStore(os.fspath(source))
            if target is None:
                prof = store.read(model=model)
                target = prof.model
                index = StatisticsIndex.from_profiles([prof])
            else:
                index = StatisticsIndex.from_store(store)
        else:
            raise TypeError(f"plan(): source must be a profile directory, a Profile or a non-empty list of them; "
                            f"got {type(source).__name__}.")
        figures, tables = resolve(target, index)
        _check_data(figures, policy)
        options = enumerate_options(figures, policy)
        proposal = propose(figures, options)
        _check_overflow(proposal)
        balance = table_balance(tables)
        stacking = stacking_comparison(target, figures, tables, proposal, policy)
        topologies = topology_comparison(target, index.models)
    for w in caught:  # re-emit to the caller, and record in the plan
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    out = _assemble(target, figures, proposal, policy, balance, stacking, topologies,
                    [f"{w.category.__name__}: {w.message}" for w in caught])
    if what_if:
        out.what_if = _what_if(target, source, index)
    return out


def _what_if(target: ModelConfig, source, index: StatisticsIndex) -> Optional[dict]:
    """`variants.what_if` of `target` from the recorded steps of its profile, where there are some."""
    profile = matching_profile(target, index.models)
    if profile is None:
        return None
    try:
        steps = (read_what_if_steps(os.fspath(source), profile.model) if isinstance(source, (str, os.PathLike))
                 else steps_of(profile))
        if steps is None:
            return None
        return what_if_of(target, profile.model, steps, profile.steps)
    except (ProfileError, CandidateUnavailable) as e:
        return {"unavailable": str(e).splitlines()[0]}


def _check_overflow(proposal) -> None:
    for name, e in proposal.chosen.items():
        if not e.failure_free:
            warnings.warn(LimitOverflowWarning(
                f"stack {name!r}: max_ids_per_table={e.option.max_ids_per_table} / max_unique_ids_per_table="
                f"{e.option.max_unique_ids_per_table} are below what {e.steps_over_max_ids:.3%} / "
                f"{e.steps_over_max_unique_ids:.3%} of profiled steps need. TF raises on those steps (it does not "
                "drop ids over these limits, even with allow_id_dropping). Use partition_quantile='max'."),
                stacklevel=3)


def _check_data(figures, policy: Policy) -> None:
    q = min(parse_quantile(policy.quantile), parse_quantile(policy.partition_quantile))
    for name, f in figures.items():
        if f.steps < policy.min_steps:
            warnings.warn(InsufficientDataWarning(
                f"stack {name!r}: the profile covers only {f.steps} steps (< {policy.min_steps}); limits from so "
                "little data will likely overflow on the rest. Profile the whole dataset (or at least "
                f"{policy.min_steps} steps)."), stacklevel=3)
        elif q < 1 and f.steps < math.ceil(10 / (1 - q)):
            warnings.warn(InsufficientDataWarning(
                f"stack {name!r}: a {quantile_label(q)} from {f.steps} steps rests on fewer than 10 steps above it; "
                f"profile at least {math.ceil(10 / (1 - q))} steps, or plan with quantile='max'."), stacklevel=3)


def _observed(f: StackFigures) -> dict:
    return {k: {q: h.quantile(q) for q in STANDARD_QUANTILES}
            for k, h in (("max_ids", f.step_max_ids), ("max_unique_ids", f.step_max_unique_ids),
                         ("chip_buffer_slots", f.step_max_chip_buffer))}


def _estimate_json(e) -> dict:
    return {"option": e.option.label, "max_ids_per_table": e.option.max_ids_per_table,
            "max_unique_ids_per_table": e.option.max_unique_ids_per_table,
            "chip_buffer_slots": e.option.chip_buffer_slots,
            "max_ids_per_chip_per_sample": e.max_ids_per_chip_per_sample,
            "steps_failing": max(e.steps_over_max_ids, e.steps_over_max_unique_ids),
            "steps_over_buffer": e.steps_over_buffer, "drop_rate_at_most": e.drop_rate_at_most,
            "bytes_per_sc": e.partition_bytes_per_sc + e.buffer_bytes_per_sc}


def _assemble(target: ModelConfig, figures, proposal, policy, balance, stacking, topologies, warns) -> Plan:
    v = proposal.max_ids_per_chip_per_sample
    stacks = {}
    total_planned = total_default = 0
    for name, f in figures.items():
        e = proposal.chosen[name]
        planned = e.partition_bytes_per_sc + e.buffer_bytes_per_sc
        default = (partition_bytes_per_sc(f, DEFAULT_MAX_IDS_PER_TABLE, DEFAULT_MAX_UNIQUE_IDS_PER_TABLE)
                   + csr_buffer_bytes_per_sc(f, DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE))
        total_planned += planned
        total_default += default
        stacks[name] = StackPlan(
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
    g = GlobalConfig.of(target)
    ids_total = sum(f.ids for f in figures.values())
    return Plan(
        model_key=target.key, global_config=g.to_json(),
        policy={"quantile": policy.quantile, "partition_quantile": policy.partition_quantile,
                "headroom": policy.headroom, "min_steps": policy.min_steps},
        steps=min((f.steps for f in figures.values()), default=0),
        max_ids_per_table={n: s.max_ids_per_table for n, s in stacks.items()},
        max_unique_ids_per_table={n: s.max_unique_ids_per_table for n, s in stacks.items()},
        max_ids_per_chip_per_sample=v, allow_id_dropping=proposal.allow_id_dropping, disable_table_stacking=False,
        stacks=stacks, tables=balance, stacking=stacking, topologies=topologies,
        memory={"model": "see profiles/SCHEMA.md (Memory model)", "planned_bytes_per_sc": total_planned,
                "tf_default_bytes_per_sc": total_default, "saving_bytes_per_sc": total_default - total_planned,
                "buffer_multiple": proposal.buffer_multiple,
                "drop_rate_at_most": (sum(s.drops["ids_dropped_at_most"] for s in stacks.values()) / ids_total
                                      if ids_total else 0.0),
                "steps_failing": max((max(s.drops["steps_over_max_ids"], s.drops["steps_over_max_unique_ids"])
                                      for s in stacks.values()), default=0.0)},
        warnings=warns, model=target.to_json())
