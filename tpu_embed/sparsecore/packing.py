"""One chip's batch -> `{stacked table: CsrBatch}`: the entry points over the packers of `csr`.

`preprocess` stacks the tables of a feature configuration (remembered by `layout_cache`) and packs;
`preprocess_with_layout` packs for a layout made once (the shard job's); `feature_ids_for` matches a batch to
the layout's features and validates it as `inputs.to_feature_ids`.
"""

from __future__ import annotations

import operator
from itertools import repeat
from typing import Any, Dict, Optional

from tpu_embed.core.nest import flatten_with_paths
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore import csr
from tpu_embed.sparsecore.csr_reference import preprocess_stack_reference
from tpu_embed.sparsecore.csr_types import (
    DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE,
    CsrBatch,
    stack_limits_remembered,
)
from tpu_embed.sparsecore.inputs import FeatureIds, to_feature_ids
from tpu_embed.sparsecore.layout import SparseCoreLayout
from tpu_embed.sparsecore.layout_cache import layout_for

__all__ = ["IMPLEMENTATIONS", "feature_ids_for", "preprocess", "preprocess_with_layout"]

# "auto" uses the C kernel when it was built at install time, else numpy; all three give
# identical bytes (tests/tpu_embed/sparsecore/test_sparsecore.py) and match TF (tests/conformance).
IMPLEMENTATIONS = ("auto", "native", "numpy", "reference")


def feature_ids_for(features: Any, layout: SparseCoreLayout, weights: Any = None,
                    check_ids: bool = True) -> Dict[str, FeatureIds]:
    """Validate and normalise every feature of a batch to (rows, ids, weights)."""
    return _per_feature(features, layout, weights, lambda value, weight, feat: to_feature_ids(
        value, weight, path=feat.path, sample_count=feat.sample_count,
        vocabulary_size=feat.vocabulary_size, check_ids=check_ids))


def _per_feature(features: Any, layout: SparseCoreLayout, weights: Any, convert) -> Dict[str, Any]:
    flat_inputs, flat_weights = _flat_batch(features, layout, weights)
    return {feat.path: convert(value, weight, feat)
            for feat, value, weight in zip(layout.features, flat_inputs, flat_weights)}


def _flat_batch(features: Any, layout: SparseCoreLayout, weights: Any):
    """(inputs, weights) of every feature in the layout's order; weights None: a list of None."""
    paths = _paths_of(layout)
    take = layout.__dict__["_take_by_path"]
    flat_inputs = _flat_like(features, paths, "features", take)
    flat_weights = _flat_like(weights, paths, "weights", take) if weights is not None else [None] * len(paths)
    if not all(map(operator.is_not, flat_inputs, repeat(None))):
        path = paths[next(i for i, value in enumerate(flat_inputs) if value is None)]
        raise ValueError(f"Feature {path!r} is missing from the batch (got None).")
    return flat_inputs, flat_weights


def _paths_of(layout: SparseCoreLayout) -> list:
    """The layout's feature paths in its order, kept on the (immutable) layout: made once, not per batch."""
    paths = layout.__dict__.get("_feature_paths")
    if paths is None:
        paths = [f.path for f in layout.features]
        object.__setattr__(layout, "_feature_paths", paths)
        # A flat dict's values in the layout's order, in one C call (several paths: itemgetter gives a tuple).
        object.__setattr__(layout, "_take_by_path", operator.itemgetter(*paths) if len(paths) > 1 else None)
    return paths


def _flat_like(structure: Any, paths, what: str, take=None):
    # Fast path: a flat dict keyed by feature name (the common case, and every shard-job batch).
    if isinstance(structure, dict) and len(structure) == len(paths):
        try:
            return take(structure) if take is not None else [structure[p] for p in paths]
        except KeyError:
            pass
    if len(paths) == 1 and paths[0] == "" and not isinstance(structure, (dict, list, tuple)):
        return [structure]
    got = flatten_with_paths(structure)
    got_paths = [p for p, _ in got]
    if got_paths != paths:
        missing = sorted(set(paths) - set(got_paths))
        extra = sorted(set(got_paths) - set(paths))
        raise ValueError(
            f"{what} do not have the structure of feature_config: missing features {missing}, "
            f"unexpected features {extra}. Pass one entry per configured feature, nested the same way.")
    return [leaf for _, leaf in got]


def preprocess_with_layout(
    features: Any,
    layout: SparseCoreLayout,
    *,
    weights: Any = None,
    max_ids_per_chip_per_sample: int = DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE,
    max_ids_per_table: Optional[Dict[str, int]] = None,
    max_unique_ids_per_table: Optional[Dict[str, int]] = None,
    allow_id_dropping: bool = False,
    implementation: str = "auto",
) -> Dict[str, CsrBatch]:
    """`preprocess` for a precomputed layout (the shard job stacks once, packs many batches).

    Args:
      features: as for `preprocess`, or `{path: FeatureIds}` already made by `feature_ids_for` /
        `split_global_batch` (the shard job's batches).
      layout: the `SparseCoreLayout` of `stack_tables` / `layout_of`.
      weights: as for `preprocess`.
      max_ids_per_chip_per_sample: as for `preprocess`.
      max_ids_per_table: as for `preprocess`.
      max_unique_ids_per_table: as for `preprocess`.
      allow_id_dropping: as for `preprocess`.
      implementation: as for `preprocess`.

    Returns:
      `{stacked table name: CsrBatch}`.

    Raises:
      ValueError: an unknown `implementation`, or features that do not match the layout.
      LimitExceededError: a batch over the limits (without `allow_id_dropping`).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    limits = stack_limits_remembered(layout, max_ids_per_table, max_unique_ids_per_table,
                                     max_ids_per_chip_per_sample, allow_id_dropping)
    native = implementation == "native" or (implementation == "auto" and csr.native_available())
    prevalidated = (isinstance(features, dict) and features
                    and all(isinstance(v, FeatureIds) for v in features.values()))
    if native and not prevalidated:
        # The inputs' buffers go to the C kernel as they are; it checks every id, weight and row.
        flat_inputs, flat_weights = _flat_batch(features, layout, weights)
        if weights is None:
            flat_weights = None  # (no weights: the entries are made without looking at them)
        return {name: csr.preprocess_stack_inputs(stack, layout, flat_inputs, flat_weights, limits[name])
                for name, stack in layout.stacks.items()}
    fids = features if prevalidated else feature_ids_for(features, layout, weights, check_ids=not native)
    if implementation == "reference":
        return {name: preprocess_stack_reference(stack, layout, fids, limits[name])
                for name, stack in layout.stacks.items()}
    return {name: csr.preprocess_stack(stack, layout, fids, limits[name], native)
            for name, stack in layout.stacks.items()}


def preprocess(
    features: Any,
    feature_config: Any,
    topology: Topology,
    *,
    weights: Any = None,
    max_ids_per_chip_per_sample: int = DEFAULT_MAX_IDS_PER_CHIP_PER_SAMPLE,
    max_ids_per_table: Optional[Dict[str, int]] = None,
    max_unique_ids_per_table: Optional[Dict[str, int]] = None,
    allow_id_dropping: bool = False,
    implementation: str = "auto",
) -> Dict[str, CsrBatch]:
    """One chip's batch -> `{stacked_table_name: CsrBatch}`, as `TPUEmbeddingV2.enqueue` computes it.

    Limits are keyed by stacked table name (see `stack_tables`).

    Args:
      features: the nested structure of `feature_config` with, per feature, a dense
        tensor/array (one id per sample), a `tf.SparseTensor` / `SparseIds`, or a
        `tf.RaggedTensor` / `RaggedIds`.
      feature_config: a `tpu_embed.core.model.ModelConfig`, or the nested TF `FeatureConfig`s
        (per-chip `output_shape`s).
      topology: the `Topology` the batch is packed for.
      weights: like `features`, or None (every weight 1).
      max_ids_per_chip_per_sample: TF's `SparseCoreEmbeddingConfig` limit of the same name.
      max_ids_per_table: `{stacked table name: max ids per SparseCore partition}`; missing
        stacks get TF's 256.
      max_unique_ids_per_table: `{stacked table name: max unique ids per partition}`; missing
        stacks get TF's 256.
      allow_id_dropping: drop the ids that do not fit the id buffer (counted in
        `CsrBatch.dropped_ids`) instead of raising.
      implementation: "auto" (the C kernel when it was built, else numpy), "native", "numpy" or
        "reference"; all give the same bytes.

    Returns:
      `{stacked table name: CsrBatch}`.

    Raises:
      ValueError: features that do not match `feature_config`, or ids out of range.
      LimitExceededError: a batch over the limits (without `allow_id_dropping`), naming the stack
        and the fix.
    """
    layout = layout_for(feature_config, topology)
    return preprocess_with_layout(
        features, layout, weights=weights,
        max_ids_per_chip_per_sample=max_ids_per_chip_per_sample, max_ids_per_table=max_ids_per_table,
        max_unique_ids_per_table=max_unique_ids_per_table, allow_id_dropping=allow_id_dropping,
        implementation=implementation)
