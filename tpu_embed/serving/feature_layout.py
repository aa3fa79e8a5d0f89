"""How the serving mapping lays a plan's features out, TensorFlow-free: `Layout`, the features grouped by rule.

`Layout.of(plan)` orders the features so that every rule runs once over the features that take it (frequency by
vocabulary, then hashing by `num_buckets`, then identity), and says where each feature's tokens and weights come
from among the stacked columns (`tpu_embed.serving.columns`), one split per delimiter.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tpu_embed.serving.rules import FeaturePlan, MappingPlan

__all__ = ["Layout", "Source", "runs"]

_KIND_ORDER = {"frequency": 0, "hashing": 1, "identity": 2}
Source = Tuple[int, Optional[str]]  # (column's place among the stacked columns, delimiter)


def _sources(pairs: Sequence[Tuple[str, Optional[str]]], columns: Sequence[str]
            ) -> Tuple[Tuple[Source, ...], List[int]]:
    """(distinct (column, delimiter) sources, grouped by delimiter: no delimiter first, then each in order of
    first use; the source of each pair)."""
    delimiters = list(dict.fromkeys([None] + [d for _, d in pairs]))
    distinct = list(dict.fromkeys(pairs))
    ordered = sorted(distinct, key=lambda p: (delimiters.index(p[1]), distinct.index(p)))
    where = {p: i for i, p in enumerate(ordered)}
    return tuple((columns.index(c), d) for c, d in ordered), [where[p] for p in pairs]


def runs(values: Sequence[Any]) -> List[Tuple[int, int, Any]]:
    """(start, end, value) of each run of equal consecutive values."""
    out: List[Tuple[int, int, Any]] = []
    for i, v in enumerate(values):
        if out and out[-1][2] == v:
            out[-1] = (out[-1][0], i + 1, v)
        else:
            out.append((i, i + 1, v))
    return out


@dataclasses.dataclass(frozen=True)
class Layout:
    """How `map_stacked` lays a plan's features out (TensorFlow-free): the features grouped by rule (frequency by
    vocabulary, then hashing by `num_buckets`, then identity; spec order otherwise), the columns read as
    categorical values and as numbers, and where each feature's tokens and weights come from."""

    features: Tuple[FeaturePlan, ...]
    token_columns: Tuple[str, ...]
    token_sources: Tuple[Source, ...]
    feature_token_source: Tuple[int, ...]
    number_columns: Tuple[str, ...]  # dense columns, then weight columns
    number_sources: Tuple[Source, ...]
    dense_sources: Tuple[int, ...]  # the number source of each dense feature
    weighted: Tuple[int, ...]  # features (by position) with a weight column
    weight_sources: Tuple[int, ...]  # their number source

    @classmethod
    def of(cls, plan: MappingPlan) -> "Layout":
        firsts: Dict[Tuple[Any, ...], int] = {}
        for i, f in enumerate(plan.features):
            firsts.setdefault((f.kind, f.vocabulary_key, f.num_buckets), i)

        def rule(i: int):
            f = plan.features[i]
            k = _KIND_ORDER[f.kind]
            if f.kind == "frequency":
                return (k, f.num_oov_buckets, firsts[(f.kind, f.vocabulary_key, f.num_buckets)], i)
            if f.kind == "hashing":
                return (k, int(f.num_buckets or 0), i, i)
            return (k, 0, i, i)

        features = tuple(plan.features[i] for i in sorted(range(len(plan.features)), key=rule))
        token_columns = tuple(dict.fromkeys(f.column for f in features))
        token_sources, feature_token_source = _sources([(f.column, f.delimiter) for f in features], token_columns)
        number_columns = tuple(dict.fromkeys([d.column for d in plan.dense]
                                             + [f.weight_column for f in features if f.weight_column]))
        weighted = tuple(i for i, f in enumerate(features) if f.weight_column)
        pairs = [(d.column, None) for d in plan.dense] + [(features[i].weight_column, features[i].delimiter)
                                                          for i in weighted]
        number_sources, where = _sources(pairs, number_columns)  # type: ignore[arg-type]
        return cls(features, token_columns, token_sources, tuple(feature_token_source), number_columns,
                   number_sources, tuple(where[:len(plan.dense)]), weighted, tuple(where[len(plan.dense):]))
