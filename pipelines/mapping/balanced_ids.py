"""Balanced ids for a spec's frequency vocabularies (`partition: {ids: balanced}`), Beam-free.

The vocabulary job makes a `VocabularyDraft` of every frequency vocabulary: its tokens as frequency order (or
the mode's order: a base's ids, then the new tokens) would number them, with this run's lookups of each and of
the OOV buckets. `assign` puts the drafts of every stack together, as the layout being written stacks their
tables (TensorFlow's `stack_tables`; jax-tpu-embedding's `auto_stack_tables` for `shards.layout: jax`; both:
TensorFlow's), and numbers each stack's tokens with `tpu_embed.sparsecore.balance.assign_ids` for the spec's
topology (S = chips x SparseCores per chip, the table rotations of that layout):

* `rebuild`, and `append` without a base: every token's id is chosen;
* `append` with a base: the base's tokens keep their ids (their lookups are where the stack starts from) and the
  new tokens take the next ids, in the order that keeps the balance;
* `frozen`: the base's vocabulary as it is (its lookups count for the stack's other tables);
* the OOV buckets keep their ids after the tokens (or the capacity); their lookups count where they are: the
  lookups of this run's tokens out of the vocabulary, split evenly over the buckets;
* tables without a frequency vocabulary (identity, hashing) keep their ids; the vocabulary job counts their
  tokens too (`fixed_chunk_tokens`) and maps them to ids as the shard job does (`fixed_table_ids`), so their
  lookups count where they are (a sequence feature's values past its length included);
* tensor-core tables are on no SparseCore and keep frequency order.

`apply` then gives the tokens in id order (the vocabulary file), a lineage's token counts in id order, and
`frequency_ids`: for each id, the id the draft gave its token (what the profile compares against).
"""

from __future__ import annotations

import dataclasses
import io
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipelines.mapping import vocabulary as pvocab
from pipelines.mapping import vocabulary_modes as modes
from pipelines.mapping.ids import fingerprint64_buckets, parse_ints
from pipelines.token_index import concat_encoded
from tpu_embed.artifact import io as tio
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.sparsecore.balance import TableDemand, assign_ids, destination_loads

FREQUENCY_IDS_SUFFIX = ".frequency_ids.npy"
FREQUENCY_IDS_KIND = "frequency_ids"
_EMPTY = np.zeros(0, np.int64)


def frequency_ids_filename(key: str) -> str:
    """The file of vocabulary key `key`'s frequency-order ids, under the artifact's `vocab/`."""
    return f"{key}{FREQUENCY_IDS_SUFFIX}"


@dataclasses.dataclass
class VocabularyDraft:
    """A frequency vocabulary before its ids are balanced.

    `tokens` in the draft's id order (frequency order; under append / frozen the mode's: the base's ids, then the
    new tokens), `counts[k]` this run's lookups of `tokens[k]`; tokens before `first_free` keep their ids (a
    base's); `size`: the rows before the OOV buckets (the tokens, or the capacity); `oov_counts[b]`: this run's
    lookups of OOV bucket b. `mode`: the lineage mode's result (None for rebuild); `kept`, `distinct`, `total`: the
    vocabulary info's figures."""

    key: str
    tokens: List[bytes]
    counts: np.ndarray
    first_free: int
    size: int
    oov_counts: np.ndarray
    kept: int
    distinct: int
    total: int
    mode: Optional[modes.ModeResult] = None

    def without_tokens(self) -> "VocabularyDraft":
        """What `assign` needs of the draft (its counts): what goes to the one place that assigns the ids."""
        return dataclasses.replace(self, tokens=[], mode=None)


def _int64(col) -> np.ndarray:
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    return np.asarray(arr.to_numpy(zero_copy_only=False), np.int64)


def _even(total: int, buckets: int) -> np.ndarray:
    """`total` lookups split evenly over `buckets` (the remainder on the first ones)."""
    out = np.full(buckets, total // buckets if buckets else 0, np.int64)
    out[:total % buckets if buckets else 0] += 1
    return out


def draft(spec, key: str, counts: pa.Table, base: Optional[pa.Table] = None, day: int = 0) -> VocabularyDraft:
    """The draft of vocabulary `key` from this run's `counts` (Table(token, count)), and for modes append / frozen
    the base's token counts (`tpu_embed.artifact.lineage.BaseArtifact.token_counts`; None: the first day)."""
    v = spec.vocabulary_groups()[key][0].vocabulary
    total = int(pc.sum(counts.column("count")).as_py() or 0)
    if v.mode == "rebuild":
        tokens, token_counts, distinct = pvocab.finalize(counts, v.top_k, v.frequency_threshold)
        kept = int(sum(token_counts))
        return VocabularyDraft(key, tokens, np.asarray(token_counts, np.int64), 0, max(1, len(tokens)),
                               _even(total - kept, v.num_oov_buckets), kept, distinct, total)
    r = modes.apply_mode(counts, base, mode=v.mode, day=day, top_k=v.top_k, frequency_threshold=v.frequency_threshold,
                         capacity=v.capacity)
    tokens = r.vocabulary
    run = np.zeros(len(tokens), np.int64)  # this run's lookups of each vocabulary token (0: not seen here)
    if tokens:
        at = pc.index_in(pa.array(tokens, pa.large_binary()),
                         value_set=pa.array(counts.column("token").combine_chunks(), pa.large_binary()))
        seen = at.is_valid().to_numpy(zero_copy_only=False)
        run[seen] = _int64(counts.column("count"))[_int64(at.fill_null(0))[seen]]
    size = v.capacity if v.capacity is not None else max(1, len(tokens))
    first_free = len(tokens) if v.mode == "frozen" else r.base_tokens
    return VocabularyDraft(key, tokens, run, first_free, size, _even(r.not_admitted_count, v.num_oov_buckets),
                           r.covered_count, counts.num_rows, total, r)


@dataclasses.dataclass(frozen=True)
class KeyAssignment:
    """The ids of one vocabulary: `ids[k]` is the id of the draft's token k; `info`: the manifest's record."""

    ids: np.ndarray
    info: dict


def _layout_stacks(spec, sizes: Mapping[str, int]) -> Tuple[str, List[Tuple[str, List[Tuple[str, int]]]]]:
    """(the layout balanced for, [(stack, [(table, rotation)])]) of the layout the shards are written with."""
    model = spec.model(sizes)
    if spec.shards.layout == "jax":
        from tpu_embed.sparsecore.jax_layout import jax_layout  # jax-tpu-embedding's stacking (numpy only)
        return "jax", [(s.name, [(t.name, t.shard_rotation) for t in s.tables]) for s in jax_layout(model).stacks]
    layout = spec.layout(sizes)
    return "tensorflow", [(name, [(t, layout.tables[t].rotation) for t in s.tables])
                          for name, s in layout.stacks.items()]


def _demand(d: VocabularyDraft, table: str, rotation: int) -> TableDemand:
    n = d.counts.size
    fixed_ids = np.concatenate([np.arange(d.first_free, dtype=np.int64),
                                d.size + np.arange(d.oov_counts.size, dtype=np.int64)])
    fixed_counts = np.concatenate([d.counts[:d.first_free], d.oov_counts])
    return TableDemand(table, rotation, d.counts[d.first_free:n], d.first_free, fixed_ids, fixed_counts)


def _balance(load: np.ndarray) -> float:
    total = int(load.sum())
    return float(load.max()) * load.size / total if total else 1.0


def fixed_tables(spec) -> Dict[str, list]:
    """{table: its features} of the SparseCore tables whose ids nobody chooses (identity, hashing)."""
    out: Dict[str, list] = {}
    for f in spec.sparse_core_features:
        if f.vocabulary.type != "frequency":
            out.setdefault(f.table, []).append(f)
    return out


def fixed_chunk_tokens(chunk, spec) -> List[Tuple[str, pa.Array]]:
    """[(table, every token of the chunk's features of that table)] for the `fixed_tables`: counted as the
    vocabularies' tokens are (`pvocab.chunk_tokens`)."""
    return [(table, concat_encoded([chunk.features[f.name].as_tokens() for f in feats]))
            for table, feats in fixed_tables(spec).items()]


def fixed_table_ids(spec, table: str, counts: pa.Table) -> Tuple[np.ndarray, np.ndarray]:
    """(ids, lookups of each) of a `fixed_tables` table from its token counts (Table(token, count)): its tokens
    mapped as the shard job maps them (`pipelines.mapping.ids`: identity values parsed, invalid ones to the
    default value or left out; hashing by Fingerprint64)."""
    v = fixed_tables(spec)[table][0].vocabulary
    tokens = pa.array(counts.column("token").combine_chunks(), pa.large_binary())
    n = _int64(counts.column("count"))
    if v.type == "hashing":
        ids = fingerprint64_buckets(tokens, int(v.num_buckets))
    else:
        ids, ok = parse_ints(tokens)
        ok &= (ids >= 0) & (ids < int(v.num_buckets))
        if v.default_value is not None:
            ids = np.where(ok, ids, int(v.default_value))
        else:
            ids, n = ids[ok], n[ok]
    if not ids.size:
        return _EMPTY, _EMPTY
    u, inverse = np.unique(ids, return_inverse=True)
    return u.astype(np.int64), np.bincount(inverse.reshape(-1), weights=n, minlength=u.size).astype(np.int64)


def assign(spec, drafts: Mapping[str, VocabularyDraft],
           fixed: Optional[Mapping[str, Tuple[np.ndarray, np.ndarray]]] = None) -> Dict[str, KeyAssignment]:
    """{vocabulary key: its ids} for every draft (one per frequency vocabulary of `spec`), balanced per stack.
    `fixed`: {table: (ids, lookups)} of the `fixed_tables` (`fixed_table_ids`), the loads their stacks start
    from (absent: not counted)."""
    fixed = fixed or {}
    sizes = {k: d.size for k, d in drafts.items()}
    key_of = {f.table: spec.vocabulary_key(f) for f in spec.categorical if f.vocabulary.type == "frequency"}
    S = spec.topology.num_sparse_cores
    out: Dict[str, KeyAssignment] = {}
    layout_name, stacks = _layout_stacks(spec, sizes)
    for stack, members in stacks:
        keyed = [(key_of[t], t, r) for t, r in members if t in key_of]
        if not keyed:
            continue
        demands = [_demand(drafts[k], t, r) for k, t, r in keyed]
        demands += [TableDemand(t, r, _EMPTY, 0, *fixed[t]) for t, r in members if t in fixed]
        ids = assign_ids(demands, S)
        frequency = {dm.name: np.arange(dm.first_id, dm.first_id + dm.counts.size) for dm in demands}
        before, after = destination_loads(demands, frequency, S), destination_loads(demands, ids, S)
        for k, t, r in keyed:
            d = drafts[k]
            out[k] = KeyAssignment(
                np.concatenate([np.arange(d.first_free, dtype=np.int64), ids[t]]),
                {"order": "balanced", "layout": layout_name, "stack": stack, "num_sparse_cores": S,
                 "rotation": int(r), "fixed_ids": int(d.first_free),
                 "frequency_ids": "vocab/" + frequency_ids_filename(k),
                 "stack_lookups_balance": {"frequency": round(_balance(before), 4),
                                           "balanced": round(_balance(after), 4)}})
    for k, d in drafts.items():  # on no SparseCore stack: tensor-core tables
        if k not in out:
            out[k] = KeyAssignment(np.arange(d.counts.size, dtype=np.int64),
                                   {"order": "frequency", "why": "a tensor-core table: on no SparseCore"})
    return out


@dataclasses.dataclass(frozen=True)
class Numbered:
    """A vocabulary in its final id order: `tokens` (the vocabulary file's lines), a lineage's `table` (its
    token counts, the vocabulary's rows in id order; None for rebuild), `frequency_ids[i]`: the draft's id of
    the token with id i."""

    tokens: List[bytes]
    table: Optional[pa.Table]
    frequency_ids: np.ndarray


def apply(d: VocabularyDraft, a: KeyAssignment) -> Numbered:
    n = len(d.tokens)
    if a.ids.size != n or n and not np.array_equal(np.sort(a.ids), np.arange(n)):
        raise ValueError(f"vocabulary {d.key!r}: the ids are not a bijection onto [0, {n})")
    frequency_ids = np.empty(n, np.int64)
    frequency_ids[a.ids] = np.arange(n, dtype=np.int64)
    tokens = [d.tokens[i] for i in frequency_ids.tolist()]
    table = None
    if d.mode is not None:
        t = d.mode.table
        table = pa.concat_tables([t.slice(0, n).take(pa.array(frequency_ids)), t.slice(n)]).combine_chunks()
        table = table.set_column(table.schema.get_field_index("id"), "id", t.column("id"))
    return Numbered(tokens, table, frequency_ids)


def frequency_ids_bytes(frequency_ids: np.ndarray) -> bytes:
    """The `.npy` bytes of a vocabulary's frequency-order ids (int64, one per line of its vocabulary file)."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(frequency_ids, np.int64), allow_pickle=False)
    return buf.getvalue()


def parse_frequency_ids(data: bytes, source: str = "<frequency ids>") -> np.ndarray:
    try:
        arr = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError) as e:
        raise ValueError(f"{source} is not a frequency-ids file ({e}): the artifact is damaged; re-run its vocabulary "
                         "job.") from None
    return np.asarray(arr, np.int64).reshape(-1)


def load_frequency_ids(spec, vocab_dir: str) -> Dict[str, np.ndarray]:
    """{table: frequency_ids} of the balanced vocabularies of the artifact whose vocabularies are in `vocab_dir`
    (none where its ids are in frequency order): what the profile counts its steps with a second time."""
    out: Dict[str, np.ndarray] = {}
    vocabs = read_manifest(vocab_dir).vocabularies or {}
    for key, feats in spec.vocabulary_groups().items():
        ids = getattr(vocabs.get(key), "ids", None) or {}
        if ids.get("order") != "balanced" or not feats[0].on_sparse_core:
            continue
        path = tio.join(vocab_dir, ids["frequency_ids"])
        out[feats[0].table] = parse_frequency_ids(tio.read_bytes(path), path)
    return out
