"""`plan()`: the planner's stages run on profiles, in order, and their results assembled into a `Plan`.

The warnings the stages raise are recorded in the plan as well as re-emitted to the caller.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any, Dict, Optional, Sequence, Tuple, Union

from profiles.errors import InsufficientDataWarning, LimitOverflowWarning, ProfileError
from profiles.histogram import parse_quantile, quantile_label
from profiles.model_file import load_model_config
from profiles.plan_file import Plan
from profiles.planner.assemble import assemble
from profiles.planner.enumerate import check_policy, enumerate_options
from profiles.planner.partition import stacking_comparison, table_balance, topology_comparison
from profiles.planner.propose import propose
from profiles.planner.sources import StatisticsIndex, matching_profile, resolve
from profiles.planner.types import Policy, Proposal, StackFigures
from profiles.planner.variants import what_if as what_if_of
from profiles.profile import Profile
from profiles.store import ProfileStore
from profiles.units import CandidateUnavailable
from profiles.whatif_steps import read_what_if_steps, steps_of
from tpu_embed.core.model import ModelConfig, from_tf_feature_config

Source = Union[str, os.PathLike, Profile, Sequence[Profile]]


def plan(source: Source, spec: Any = None, *, quantile: str = "max", headroom: float = 1.0,
         partition_quantile: str = "max", min_steps: int = 100, model: Optional[str] = None,
         what_if: bool = True) -> Plan:
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
    requested = _target_from_spec(spec)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        index, target = _statistics(source, requested, model)
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
    out = assemble(target, figures, proposal, policy, balance, stacking, topologies,
                   [f"{w.category.__name__}: {w.message}" for w in caught])
    if what_if:
        out.what_if = _what_if(target, source, index)
    return out


def _target_from_spec(spec: Any) -> Optional[ModelConfig]:
    if spec is None or isinstance(spec, ModelConfig):
        return spec
    if isinstance(spec, (tuple, list)) and len(spec) == 2:  # (feature_config, topology)
        return from_tf_feature_config(spec[0], spec[1])
    if isinstance(spec, (str, os.PathLike)):
        return load_model_config(os.fspath(spec))
    raise TypeError(f"spec must be a ModelConfig, (feature_config, Topology) or a spec/layout file path; got "
                    f"{type(spec).__name__}.")


def _statistics(source: Source, target: Optional[ModelConfig], model: Optional[str]
                ) -> Tuple[StatisticsIndex, ModelConfig]:
    """The statistics `source` holds, and the configuration to plan: `target`, else the one profiled model."""
    if isinstance(source, Profile):
        return StatisticsIndex.from_profiles([source]), target or source.model
    if isinstance(source, (list, tuple)) and source and all(isinstance(p, Profile) for p in source):
        index = StatisticsIndex.from_profiles(list(source))
        if target is None:
            if len(source) != 1:
                raise ValueError("plan(): several profiles given; pass spec= to say which configuration to plan.")
            target = source[0].model
        return index, target
    if isinstance(source, (str, os.PathLike)):
        store = ProfileStore(os.fspath(source))
        if target is None:
            prof = store.read(model=model)
            return StatisticsIndex.from_profiles([prof]), prof.model
        return StatisticsIndex.from_store(store), target
    raise TypeError(f"plan(): source must be a profile directory, a Profile or a non-empty list of them; "
                    f"got {type(source).__name__}.")


def _what_if(target: ModelConfig, source: Source, index: StatisticsIndex) -> Optional[dict]:
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


def _check_overflow(proposal: Proposal) -> None:
    for name, e in proposal.chosen.items():
        if not e.failure_free:
            warnings.warn(LimitOverflowWarning(
                f"stack {name!r}: max_ids_per_table={e.option.max_ids_per_table} / max_unique_ids_per_table="
                f"{e.option.max_unique_ids_per_table} are below what {e.steps_over_max_ids:.3%} / "
                f"{e.steps_over_max_unique_ids:.3%} of profiled steps need. TF raises on those steps (it does not "
                "drop ids over these limits, even with allow_id_dropping). Use partition_quantile='max'."),
                stacklevel=3)


def _check_data(figures: Dict[str, StackFigures], policy: Policy) -> None:
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
