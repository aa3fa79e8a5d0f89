"""profiles: lookup statistics of SparseCore inputs, computed offline, and plans built from them.

TF's `EmbeddingConfigSpec.profile_data_directory` holds lookup statistics per
table, which TPU runtimes sample from ~3% of inputs at run time.  We compute
them exactly, over the whole dataset, before the first step, at the shards'
exact batching, and use them:

    collector = profiles.ProfileCollector(feature_config, tpu_embed.Topology(8, 4))
    acc = collector.create_accumulator()
    for step, batch in enumerate(global_batches):          # {feature path: FeatureIds}
        acc = collector.add_step(acc, batch, step=step)
    profiles.ProfileStore(directory).write(collector.extract_output(acc))
    plan = profiles.plan(directory, quantile="max")          # limits, buffer, balance, stacking
    plan.write("plan.json"); profiles.load_plan("plan.json").to_sparse_core_config()

Stages, TorchRec-planner style, with plain dataclasses between them:
collect (collector, counting, stats) -> store (store, SCHEMA.md) ->
plan (planner: enumerate, estimate, propose, partition) -> report.
Dependencies point one way: profiles -> tpu_embed (core), never back.
"""

from profiles.collector import DEFAULT_CANDIDATE_CHIP_COUNTS, ProfileCollector
from profiles.errors import (
    ConfigurationMismatchWarning,
    ConservativeBoundWarning,
    CorruptProfileError,
    InsufficientDataWarning,
    LimitOverflowWarning,
    MissingProfileError,
    ProfileError,
    ProfileMismatchError,
    ProfileWarning,
    SchemaVersionError,
    StaleProfileWarning,
)
from profiles.histogram import Histogram
from profiles.plan_file import Plan, StackPlan, load_plan
from profiles.planner import plan
from profiles.profile import Profile, ProfileAccumulator, StackProfile, TableProfile, merge, merge_profiles
from profiles.store import SCHEMA_VERSION, ProfileStore
from profiles.units import GlobalConfig, StackUnit, TableUnit

__all__ = [
    "ConfigurationMismatchWarning", "ConservativeBoundWarning", "CorruptProfileError",
    "DEFAULT_CANDIDATE_CHIP_COUNTS", "GlobalConfig", "Histogram", "InsufficientDataWarning",
    "LimitOverflowWarning", "MissingProfileError", "Plan", "Profile", "ProfileAccumulator",
    "ProfileCollector", "ProfileError", "ProfileMismatchError", "ProfileStore", "ProfileWarning", "SCHEMA_VERSION",
    "SchemaVersionError", "StackPlan", "StackProfile", "StackUnit", "StaleProfileWarning", "TableProfile",
    "TableUnit", "load_plan", "merge", "merge_profiles", "plan"
]
