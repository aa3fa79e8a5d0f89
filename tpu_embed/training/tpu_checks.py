"""What an artifact's shards promise `TPUEmbeddingV2`, checked before it is configured.

TF must stack the tables as the shards were packed (`check_tf_stacking`); it gets the limits the shards were
packed with, which a plan given must equal (`checked_limits`); an optimizer replacing the spec's must keep the
stacking (`checked_feature_config`).  Each mismatch is an `ArtifactMismatchError` naming the fix.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping, Tuple

import tensorflow as tf

from tpu_embed.artifact import io as tio
from tpu_embed.artifact.manifest import Manifest, ManifestError
from tpu_embed.core.model import ModelConfig, from_tf_feature_config, to_tf_feature_config
from tpu_embed.sparsecore.csr_types import DEFAULT_MAX_IDS_PER_TABLE, DEFAULT_MAX_UNIQUE_IDS_PER_TABLE
from tpu_embed.sparsecore.layout import SparseCoreLayout, layout_of, stack_tables


class ArtifactMismatchError(ValueError):
    """The shards cannot be fed to this TPUEmbeddingV2 / strategy / plan; the message says how to fix it."""


# ---------------------------------------------------------------- the artifact's model, as TF will stack it

def check_tf_stacking(model: ModelConfig) -> None:
    """TF 2.20/2.21 must compute the stacking the shards were packed with (`tpu_embed.artifact.load` checks ours)."""
    ours = layout_of(model)
    tf_layout = stack_tables(model, tf_first_feature_only=True)
    if {k: s.tables for k, s in tf_layout.stacks.items()} != {k: s.tables for k, s in ours.stacks.items()}:
        raise ArtifactMismatchError(
            f"TensorFlow 2.20/2.21 will stack this model as {list(tf_layout.stacks)}, not as the shards are packed "
            f"({list(ours.stacks)}): its stacker sizes the 2 MiB activation limit from the first feature only "
            "(DESIGN.md). TPUEmbeddingV2 cannot consume these shards; split the stacks in the spec (different "
            "optimizers or widths) so that both agree.")


# ---------------------------------------------------------------- limits (manifest, plan)

_LIMIT_KEYS = ("max_ids_per_chip_per_sample", "max_ids_per_table", "max_unique_ids_per_table", "allow_id_dropping")


def _shard_limits(m: Manifest) -> Dict[str, Any]:
    lim = m.limits
    assert lim is not None
    return {"max_ids_per_chip_per_sample": int(lim.max_ids_per_chip_per_sample),
            "max_ids_per_table": {k: int(v) for k, v in lim.max_ids_per_table.items()},
            "max_unique_ids_per_table": {k: int(v) for k, v in lim.max_unique_ids_per_table.items()},
            "allow_id_dropping": bool(lim.allow_id_dropping)}


def _plan_kwargs(plan: Any) -> Tuple[str, Dict[str, Any]]:
    """(name for messages, SparseCoreEmbeddingConfig kwargs) of a plan path or a `profiles.Plan`-like object."""
    if isinstance(plan, str) or hasattr(plan, "__fspath__"):
        path = os.fspath(plan)
        try:
            d = json.loads(tio.read_text(path))
        except FileNotFoundError:
            raise FileNotFoundError(f"plan file {path} does not exist.") from None
        except ValueError as e:
            raise ValueError(f"{path} is not a plan file (not JSON: {e}). Re-run `tpu-embed plan`.") from None
        if not isinstance(d, dict) or d.get("kind") != "plan" or "sparse_core_config" not in d:
            raise ValueError(f"{path} is not a tpu_embed plan file (kind != 'plan'). Pass the file written by "
                             "`tpu-embed plan`.")
        return path, dict(d["sparse_core_config"])
    if hasattr(plan, "sparse_core_kwargs"):
        return "the given plan", dict(plan.sparse_core_kwargs())
    raise TypeError(f"plan must be a plan file path or a profiles Plan, got {type(plan).__name__}.")


def _effective(kwargs: Mapping[str, Any], stacks: List[str]) -> Dict[str, Any]:
    """Limits as TPUEmbeddingV2 applies them: stacks missing from the dicts get TF's defaults (256)."""
    mids = dict(kwargs.get("max_ids_per_table") or {})
    muids = dict(kwargs.get("max_unique_ids_per_table") or {})
    return {"max_ids_per_chip_per_sample": int(kwargs.get("max_ids_per_chip_per_sample", 64)),
            "max_ids_per_table": {s: int(mids.get(s, DEFAULT_MAX_IDS_PER_TABLE)) for s in stacks},
            "max_unique_ids_per_table": {s: int(muids.get(s, DEFAULT_MAX_UNIQUE_IDS_PER_TABLE)) for s in stacks},
            "allow_id_dropping": bool(kwargs.get("allow_id_dropping", False))}


def _below(plan_value: int, shard_value: int) -> str:
    if plan_value >= shard_value:
        return ""
    return (f" (below the shards' limit: their steps may hold up to {shard_value}, so TPUEmbeddingV2 would "
            f"overflow or drop ids; raise it to >= {shard_value})")


def _check_plan(plan: Any, shard_limits: Dict[str, Any], stacks: List[str], artifact_dir: str, source: str):
    name, kw = _plan_kwargs(plan)
    fix = (f"The limits and buffer sizes are baked into the shards: re-shard with this plan (`tpu-embed shard "
           f"--spec ... --output {artifact_dir} --plan {name if name != 'the given plan' else 'PLAN'}`, or `tpu-embed "
           "run ... --plan`), or leave plan= out to train with the limits the shards were packed with.")
    if kw.get("disable_table_stacking"):
        raise ArtifactMismatchError(f"{name} disables table stacking, but the shards in {artifact_dir} are packed "
                                    f"for stacked tables {stacks}. {fix}")
    unknown = sorted((set(kw.get("max_ids_per_table") or {}) | set(kw.get("max_unique_ids_per_table") or {}))
                     - set(stacks))
    if unknown:
        raise ArtifactMismatchError(f"{name} has limits for {unknown}, which are not stacked tables of these shards "
                                    f"({stacks}): it was planned for another spec or topology. {fix}")
    planned = _effective(kw, stacks)
    if planned != shard_limits:
        diffs = []
        for k in _LIMIT_KEYS:
            a, b = planned[k], shard_limits[k]
            if isinstance(a, dict):
                diffs += [f"{k}[{s}]: plan {a[s]}, shards {b[s]}{_below(a[s], b[s])}" for s in stacks if a[s] != b[s]]
            elif a != b:
                diffs.append(f"{k}: plan {a}, shards {b}{_below(a, b) if k != 'allow_id_dropping' else ''}")
        raise ArtifactMismatchError(f"{name} differs from the limits the shards in {artifact_dir} were packed with "
                                    f"({source}): {'; '.join(diffs)}. {fix}")
    return planned


def checked_limits(m: Manifest, stacks: List[str], plan: Any, artifact_dir: str) -> Dict[str, Any]:
    """The shards' limits, keyed by the layout's stacks; a `plan` given must equal them."""
    limits = _shard_limits(m)
    if sorted(limits["max_ids_per_table"]) != sorted(stacks) or \
            sorted(limits["max_unique_ids_per_table"]) != sorted(stacks):
        raise ManifestError(f"{m.source}: limits are keyed by {sorted(limits['max_ids_per_table'])}, the stacks are "
                            f"{sorted(stacks)}. Regenerate the shards.")
    assert m.limits is not None
    if plan is not None:
        limits = _check_plan(plan, limits, stacks, artifact_dir, m.limits.source)
    return limits


def checked_feature_config(model: ModelConfig, layout: SparseCoreLayout, optimizer: Any) -> Any:
    """TF's feature config of `model`; with `optimizer`, that one for every table, if the tables still stack as
    the shards are packed."""
    feature_config = to_tf_feature_config(model)
    if optimizer is not None:
        # One optimizer object for every table; TF groups stacks by hash(optimizer), so does our stacker.
        for fc in tf.nest.flatten(feature_config):
            fc.table.optimizer = optimizer
        replaced = layout_of(from_tf_feature_config(feature_config, model.topology))
        if {k: s.tables for k, s in replaced.stacks.items()} != {k: s.tables for k, s in layout.stacks.items()}:
            raise ArtifactMismatchError(
                f"with optimizer={optimizer!r} for every table the tables stack as {list(replaced.stacks)}, but the "
                f"shards are packed as {list(layout.stacks)} (tables stack by optimizer). Leave optimizer= out to use "
                "the spec's per-table optimizers, or change the spec's optimizers and re-shard.")
    return feature_config
