"""Tokens to ids in TensorFlow ops, one op per rule: a vocabulary's lookup, a hash per `num_buckets`, identity.

`token_ids` maps the tokens of features laid out by `feature_layout.Layout` (grouped by rule), and says which
ids to keep and which rows to flag, as `pipelines.mapping.ids` does offline.
"""

from __future__ import annotations

from typing import AbstractSet, Any, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from tpu_embed.serving import number_text
from tpu_embed.serving.columns import block_of_rows, per_row
from tpu_embed.serving.feature_layout import runs
from tpu_embed.serving.rules import FeaturePlan

__all__ = ["policy", "token_ids"]


def policy(features: Sequence[FeaturePlan], name: str) -> str:
    """The features' `policies.<name>` (one for a plan: the spec's), "drop" for no feature."""
    values = {getattr(f, name) for f in features}
    if len(values) > 1:
        raise ValueError(f"features of one plan have different policies.{name}: {sorted(values)}")
    return values.pop() if values else "drop"


def _groups(features: Sequence[FeaturePlan]) -> List[Tuple[int, int, str, Any]]:
    """(start, end, rule, its argument) of consecutive features mapped by one op: frequency features of one
    vocabulary ("lookup", key), hashing features of one `num_buckets` ("hash", n), identity features."""
    out: List[Tuple[int, int, str, Any]] = []
    for start, end, kind in runs([f.kind for f in features]):
        part = features[start:end]
        if kind == "frequency":
            out += [(start + s, start + e, "lookup", k) for s, e, k in runs([f.vocabulary_key for f in part])]
        elif kind == "hashing":
            out += [(start + s, start + e, "hash", n) for s, e, n in runs([f.num_buckets for f in part])]
        else:
            out.append((start, end, "identity", None))
    return out


def _given_tokens(features: Sequence[FeaturePlan], direct: Optional[Mapping[str, tf.Tensor]]) -> Optional[tf.Tensor]:
    """The tokens of `features` (consecutive ones), in their order, from their columns' values as given
    (`Stacked.string_columns`): where none splits its values at a delimiter; else None."""
    if direct is None or any(f.delimiter is not None for f in features):
        return None
    values = [direct[f.column] for f in features]
    return values[0] if len(values) == 1 else tf.concat(values, axis=0)


def token_ids(features: Sequence[FeaturePlan], tokens: tf.RaggedTensor, rowids: tf.Tensor, tables: Mapping[str, Any],
         nrows: tf.Tensor, direct: Optional[Mapping[str, tf.Tensor]] = None, utf8: AbstractSet[str] = frozenset()
         ) -> Tuple[tf.Tensor, Optional[tf.Tensor], Optional[tf.Tensor], Optional[tf.Tensor]]:
    """(int64 id, keep or None, flag or None, known or None) of every token of `tokens` ([len(features) * nrows,
    None], features grouped by rule as `Layout` orders them). Per group of `_groups` one op (a vocabulary's
    lookup, a hash); what follows a lookup (the OOV id, dropping unknown tokens) once for every vocabulary of 0
    or 1 OOV buckets. keep: False where the value is dropped (an unknown token without OOV buckets, an identity
    value that is no id and has no default); flag: True where such an identity value stops the job
    (`policies.invalid_ids: error`); known: True where the token is a line of a vocabulary of `utf8` (keys whose
    files are UTF-8 text: the token is UTF-8); None: never."""
    groups = _groups(features)
    flat = tokens.flat_values
    if len(groups) == 1:
        pieces, at, sizes = [flat], None, None
    else:
        at = tf.gather(tokens.row_splits, tf.constant([g[0] for g in groups] + [len(features)], tf.int64) * nrows)
        sizes = at[1:] - at[:-1]
        given = [_given_tokens(features[s:e], direct) if rule == "lookup" else None for s, e, rule, _ in groups]
        if any(g is None for g in given):
            pieces = tf.split(flat, sizes, num=len(groups))
            pieces = [p if g is None else g for p, g in zip(pieces, given, strict=True)]
        else:  # every vocabulary looks up its columns' values as they were given
            pieces = given
    parts: List[Tuple[tf.Tensor, Optional[tf.Tensor], Optional[tf.Tensor], Optional[tf.Tensor]]] = []
    lookups: List[int] = []  # groups of vocabularies with 0 or 1 OOV buckets, finished together
    for k, (piece, (start, end, rule, arg)) in enumerate(zip(pieces, groups, strict=True)):
        part = features[start:end]
        if rule == "lookup":
            table = tables[str(arg)]
            found_id = table.lookup(piece)
            n = part[0].num_oov_buckets
            if n <= 1:
                lookups.append(k)
                parts.append((found_id, None, None, None))
                continue
            size = _vocabulary_size(part[0], table)
            found = found_id >= 0
            parts.append((tf.where(found, found_id, size + tf.strings.to_hash_bucket_fast(piece, n)),
                          None, None, found if arg in utf8 else None))
        elif rule == "hash":
            parts.append((tf.strings.to_hash_bucket_fast(piece, int(arg)), None, None, None))
        else:
            parts.append((*_identity_ids(part, piece, rowids, len(features), nrows, start, at, k), None))
    if lookups:
        every_utf8 = all(groups[k][3] in utf8 for k in lookups)
        parts = [_finish_lookups(features, groups, lookups, parts, tables, rowids, nrows, every_utf8)] + \
            parts[len(lookups):]

    def joined(i: int, fill: bool) -> Optional[tf.Tensor]:
        if all(p[i] is None for p in parts):
            return None
        full = [tf.fill(tf.shape(p[0]), fill) if p[i] is None else p[i] for p in parts]
        return full[0] if len(full) == 1 else tf.concat(full, axis=0)

    ids = parts[0][0] if len(parts) == 1 else tf.concat([p[0] for p in parts], axis=0)
    return ids, joined(1, True), joined(2, False), joined(3, False)


def _vocabulary_size(f: FeaturePlan, table: Any) -> tf.Tensor:
    """A frequency vocabulary's first OOV id: the manifest's size, or the table's (a plan without sizes)."""
    return table.size() if f.vocabulary_size is None else tf.constant(int(f.vocabulary_size), tf.int64)


def _finish_lookups(features: Sequence[FeaturePlan], groups: Sequence[Tuple[int, int, str, Any]],
                    lookups: Sequence[int], parts: List[Any], tables: Mapping[str, Any], rowids: tf.Tensor,
                    nrows: tf.Tensor, known: bool) -> Tuple[tf.Tensor, Optional[tf.Tensor], None, Optional[tf.Tensor]]:
    """(ids, keep or None, None, found where `known`, else None) of the vocabularies with 0 or 1 OOV buckets from
    their lookups (`parts`): the line, else the vocabulary's size (1 bucket) or dropped (0), over all of them at
    once. They are the first groups (the features `Layout` puts first), so their tokens are the first ones, each
    token's group its row's."""
    firsts = [features[groups[k][0]] for k in lookups]
    raw = parts[lookups[0]][0] if len(lookups) == 1 else tf.concat([parts[k][0] for k in lookups], axis=0)
    found = raw >= 0
    if all(f.vocabulary_size is not None for f in firsts):
        size = tf.constant([int(f.vocabulary_size) for f in firsts], tf.int64)  # type: ignore[arg-type]
    else:
        size = tf.stack([_vocabulary_size(f, tables[str(groups[k][3])]) for f, k in zip(firsts, lookups,
                                                                                         strict=True)])
    oov = [f.num_oov_buckets for f in firsts]
    if len(lookups) == 1:
        per_value, oov_bucket = size[0], None
    else:
        assert list(lookups) == list(range(len(lookups))), lookups
        group_of_feature = [i for i, k in enumerate(lookups) for _ in range(groups[k][0], groups[k][1])]
        group = tf.gather(per_row(group_of_feature, tf.int64, nrows), rowids[:tf.size(raw, out_type=tf.int64)])
        per_value = tf.gather(size, group)
        oov_bucket = tf.gather(tf.constant([n > 0 for n in oov]), group) if 0 in oov else None
    ids = tf.where(found, raw, per_value)
    keep = None
    if 0 in oov:
        keep = found if all(n == 0 for n in oov) else found | oov_bucket
    return ids, keep, None, found if known else None


def _identity_ids(part: Sequence[FeaturePlan], piece: tf.Tensor, rowids: tf.Tensor, nfeat: int, nrows: tf.Tensor,
                  start: int, at: Optional[tf.Tensor], k: int):
    """(ids, keep, flag) of identity features' tokens: the integer where it is in [0, num_buckets), else the
    default, else dropped (and flagged under `policies.invalid_ids: error`)."""
    value, ok = number_text.parse_int64(piece)
    if len(part) == 1:
        buckets: Any = int(part[0].num_buckets or 0)
        default: Any = -1 if part[0].default_value is None else int(part[0].default_value)
    else:  # per token: its feature's bounds and default
        local = tf.gather(block_of_rows(nfeat, nrows), rowids)
        local = (local if at is None else local[at[k]:at[k + 1]]) - start
        buckets = tf.gather(tf.constant([int(f.num_buckets or 0) for f in part], tf.int64), local)
        default = tf.gather(tf.constant([-1 if f.default_value is None else int(f.default_value) for f in part],
                                        tf.int64), local)
    ok &= (value >= 0) & (value < buckets)
    defaults = [f.default_value is not None for f in part]
    error = policy(part, "invalid_ids") == "error"
    if all(defaults):
        return tf.where(ok, value, default), None, None
    if not any(defaults):
        return value, ok, (~ok if error else None)
    has_default = tf.greater_equal(default, 0)
    keep = ok | has_default
    return tf.where(ok | ~has_default, value, default), keep, (~keep if error else None)
