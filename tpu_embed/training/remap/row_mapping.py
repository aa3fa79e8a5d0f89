"""The row mapping of a remap: which row of artifact A's table every row of artifact B's table takes.

A table of a frequency vocabulary of size V (the manifest's: its tokens, or its `capacity` when one
reserves rows) and N OOV buckets has V + N rows: row i is the token on line i of the vocabulary file
(rows past its last line are reserved, unused), row V + k is OOV bucket k (`Fingerprint64(token) % N`,
a function of the token alone, so bucket k holds the same tokens under every vocabulary).  Between
artifact A (size V_A) and artifact B (size V_B) of one spec:

* a token in both keeps its trained row: B's row of it takes A's row of it;
* a token only in B is new: its row starts from the table's initializer (`NEW`), as does a reserved row;
* a token only in A is dropped: its row is in no B row;
* OOV bucket k keeps its row: B's row V_B + k takes A's row V_A + k;
* identity and hashing tables (`num_buckets` rows, ids independent of any vocabulary) keep every row.

`RowMapping.source` holds that as one int64 array, B row -> A row or `NEW`; `destination()` is its
inverse, A row -> B row or `DROPPED`.  `row_mappings(a, b)` builds one mapping per table of two
artifacts, after checking that they are artifacts of one spec's features and tables.  Nothing here
reads or writes a checkpoint (`tpu_embed.training.remap.checkpoint` does).

Matching 10^7 tokens: a vocabulary file is read as one Arrow binary array over the file's bytes (each
token keeps its line break, which every token of both files has, so equal tokens stay equal); every
token gets a 64-bit FNV-1a hash (numpy, one pass per byte position), A's hashes are sorted, B's are
looked up with `searchsorted`, and every match is confirmed byte for byte (a hash collision never
joins two tokens).  This holds a few int64 per token: pyarrow's `index_in` on the same 10^7 tokens
took 4x the time and 1.5 GB more.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tpu_embed.artifact import io as tio
from tpu_embed.artifact import verify as tverify
from tpu_embed.artifact.load import Artifact, load_artifact
from tpu_embed.artifact.spec import FrequencyVocabulary, Spec, vocabulary_filename

NEW = -1  # a B row no A row maps to: the initializer's value, the slots' initial values
DROPPED = -1  # an A row no B row takes


class RemapError(ValueError):
    """Two artifacts, or a checkpoint and an artifact, that cannot be remapped; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class RowMapping:
    """One table's rows from artifact A to artifact B.

    `source[j]` is the A row that B row j takes, or `NEW`.  `kind` is the vocabulary type of the
    table's features ("frequency", "identity" or "hashing"); `vocabulary_a` / `vocabulary_b` are a
    frequency vocabulary's sizes, its first OOV ids (0 for the others), `num_oov_buckets` its OOV buckets.
    """

    table: str
    kind: str
    rows_a: int
    rows_b: int
    dim: int
    source: np.ndarray
    vocabulary_a: int = 0
    vocabulary_b: int = 0
    num_oov_buckets: int = 0

    @property
    def identity(self) -> bool:
        """Every row stays where it is (identity and hashing tables, or two equal vocabularies)."""
        return self.rows_a == self.rows_b and bool(np.array_equal(self.source, np.arange(self.rows_b)))

    @property
    def kept(self) -> int:
        """B rows that take an A row (kept tokens, OOV buckets, or every row of an identity mapping)."""
        return int(np.count_nonzero(self.source != NEW))

    @property
    def new(self) -> int:
        return self.rows_b - self.kept

    @property
    def dropped(self) -> int:
        return self.rows_a - self.kept

    @property
    def kept_tokens(self) -> int:
        return self.kept - (self.num_oov_buckets if self.kind == "frequency" else 0)

    def destination(self) -> np.ndarray:
        """int64 [rows_a]: the B row of every A row, `DROPPED` where none takes it."""
        dest = np.full(self.rows_a, DROPPED, np.int64)
        rows = np.flatnonzero(self.source != NEW)
        dest[self.source[rows]] = rows
        return dest


def identity_mapping(table: str, kind: str, rows: int, dim: int) -> RowMapping:
    return RowMapping(table, kind, rows, rows, dim, np.arange(rows, dtype=np.int64))


def frequency_source(tokens_a: pa.Array, tokens_b: pa.Array, num_oov_buckets: int, size_a: Optional[int] = None,
                     size_b: Optional[int] = None) -> np.ndarray:
    """int64 [size_b + num_oov_buckets]: the A row of every B row of a frequency vocabulary's table.

    `tokens_a` / `tokens_b`: the vocabularies' tokens in id order (Arrow binary arrays);
    `size_a` / `size_b`: their sizes, the first OOV id (default: the tokens; larger under a capacity).
    """
    va, vb = len(tokens_a), len(tokens_b)
    size_a = va if size_a is None else size_a
    size_b = vb if size_b is None else size_b
    if va > size_a or vb > size_b:
        raise ValueError(f"more tokens than rows: {va} > {size_a} or {vb} > {size_b}")
    source = np.full(size_b + num_oov_buckets, NEW, np.int64)
    if vb and va:
        source[:vb] = index_in(tokens_b, tokens_a)
    source[size_b:] = size_a + np.arange(num_oov_buckets, dtype=np.int64)
    kept = source[source != NEW]
    taken = np.zeros(size_a + num_oov_buckets, bool)
    taken[kept] = True
    if int(np.count_nonzero(taken)) != kept.size:  # a token listed twice in B, or twice in A and matched by both
        raise RemapError("a vocabulary file lists a token twice: it is damaged (the vocabulary job never writes "
                         "one). Re-run `tpu-embed run` for that artifact.")
    return source


_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def _offsets_and_data(tokens: pa.Array) -> Tuple[np.ndarray, np.ndarray]:
    if not (pa.types.is_binary(tokens.type) or pa.types.is_large_binary(tokens.type)):
        tokens = tokens.cast(pa.large_binary())
    width = np.int64 if pa.types.is_large_binary(tokens.type) else np.int32
    n = len(tokens)
    offsets = np.frombuffer(tokens.buffers()[1], width, count=n + 1, offset=tokens.offset * np.dtype(width).itemsize)
    data = tokens.buffers()[2]
    return offsets, (np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8))


def token_hashes(tokens: pa.Array, chunk: int = 1 << 20) -> np.ndarray:
    """uint64 FNV-1a of every token's bytes, `chunk` tokens at a time, one vectorized step per byte position."""
    offsets, data = _offsets_and_data(tokens)
    out = np.empty(len(tokens), np.uint64)
    with np.errstate(over="ignore"):
        for s in range(0, len(tokens), chunk):
            starts = offsets[s:s + chunk + 1].astype(np.int64)
            lengths = np.diff(starts)
            starts = starts[:-1]
            h = np.full(lengths.size, _FNV_OFFSET, np.uint64)
            active = np.flatnonzero(lengths > 0)
            k = 0
            while active.size:
                h[active] = (h[active] ^ data[starts[active] + k]) * _FNV_PRIME
                k += 1
                active = active[lengths[active] > k]
            out[s:s + lengths.size] = h
    return out


def index_in(tokens_b: pa.Array, tokens_a: pa.Array, chunk: int = 1 << 20) -> np.ndarray:
    """int64 [len(tokens_b)]: the index of every B token in `tokens_a`, `NEW` where it is not there.

    Both hash arrays are sorted, so the lookup walks them in order (numpy's `searchsorted` is fast on
    sorted needles, ~20x slower on random ones); each match is then confirmed by comparing the two
    tokens' bytes (`chunk` at a time).
    """
    if not len(tokens_a) or not len(tokens_b):
        return np.full(len(tokens_b), NEW, np.int64)
    index = np.int32 if max(len(tokens_a), len(tokens_b)) < 1 << 31 else np.int64
    ha = token_hashes(tokens_a)
    order_a = np.argsort(ha).astype(index)
    ha = ha[order_a]
    hb = token_hashes(tokens_b)
    order_b = np.argsort(hb).astype(index)
    hb = hb[order_b]
    pos = np.searchsorted(ha, hb)
    np.minimum(pos, ha.size - 1, out=pos)
    hit = ha[pos] == hb
    del hb
    out = np.full(len(tokens_b), NEW, np.int64)
    out[order_b[hit]] = order_a[pos[hit]]
    del order_b, pos, hit
    collided = []
    for s in range(0, len(tokens_b), chunk):
        rows = np.flatnonzero(out[s:s + chunk] != NEW)
        if not rows.size:
            continue
        mine = tokens_b.slice(s, chunk).take(pa.array(rows))
        theirs = tokens_a.take(pa.array(out[rows + s]))
        ok = np.asarray(pc.equal(mine, theirs).to_numpy(zero_copy_only=False), bool)
        bad = rows[~ok] + s
        out[bad] = NEW
        collided += bad.tolist()  # another A token has its hash (found first): look at all of them
    for i in collided:  # rare: a 64-bit collision; the A tokens of that hash compared one by one
        h = token_hashes(tokens_b.slice(i, 1))[0]
        same = order_a[np.searchsorted(ha, h, "left"):np.searchsorted(ha, h, "right")]
        token = tokens_b[i].as_py()
        out[i] = next((int(r) for r in same if tokens_a[int(r)].as_py() == token), NEW)
    return out


def read_vocabulary(path: str, scan_bytes: int = 16 << 20) -> pa.Array:
    """The tokens of a vocabulary file in id order, each with its line break, as one Arrow binary array
    over the file's bytes (the line breaks are found `scan_bytes` at a time)."""
    data = tio.read_bytes(path)
    if data and not data.endswith(b"\n"):
        data += b"\n"
    buf = np.frombuffer(data, np.uint8)
    spans = range(0, buf.size, scan_bytes)
    counts = [int(np.count_nonzero(buf[s:s + scan_bytes] == 10)) for s in spans]
    large = buf.size >= 1 << 31
    offsets = np.zeros(sum(counts) + 1, np.int64 if large else np.int32)
    at = 1
    for s, c in zip(spans, counts):
        offsets[at:at + c] = np.flatnonzero(buf[s:s + scan_bytes] == 10) + (s + 1)
        at += c
    return pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), offsets.size - 1,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(data)])


# ---------------------------------------------------------------- two artifacts

def _describe_tables(spec: Spec) -> Dict[str, Tuple]:
    return {t.name: (t.dim, (t.optimizer or spec.optimizer or {}).get("type")) for t in spec.tables}


def _describe_features(spec: Spec) -> Dict[str, Tuple]:
    out = {}
    for f in spec.categorical:
        v = f.vocabulary
        out[f.name] = (f.table, v.type, v.num_oov_buckets, v.num_buckets, f.on_sparse_core)
    return out


def check_compatible(a: Artifact, b: Artifact) -> None:
    """RemapError unless `a` and `b` are artifacts of one spec's features and tables (the vocabularies,
    their top_k / frequency_threshold, the topology, batch sizes and limits may differ)."""
    sa, sb = a.spec, b.spec
    fa, fb = _describe_features(sa), _describe_features(sb)
    if set(fa) != set(fb):
        only_a, only_b = sorted(set(fa) - set(fb)), sorted(set(fb) - set(fa))
        raise RemapError(f"{a.directory} and {b.directory} have other categorical features (only in A: {only_a}, "
                         f"only in B: {only_b}): remap maps a checkpoint between artifacts of one spec's features. "
                         "Pass two artifacts of the same spec.")
    what = ("table", "vocabulary type", "num_oov_buckets", "num_buckets", "lookup device")
    for name in sorted(fa):
        for i, (x, y) in enumerate(zip(fa[name], fb[name])):
            if x != y:
                raise RemapError(f"feature {name!r} has {what[i]} {x!r} in {a.directory} but {y!r} in "
                                 f"{b.directory}: its ids mean other rows. Remap between artifacts of one spec.")
    ta, tb = _describe_tables(sa), _describe_tables(sb)
    for name in sorted(ta):
        (da, oa), (db, ob) = ta[name], tb[name]
        if da != db:
            raise RemapError(f"table {name!r} has dim {da} in {a.directory} but {db} in {b.directory}: remap "
                             "moves rows, it cannot change their width. Keep the dim, or train the table afresh.")
        if oa != ob:
            raise RemapError(f"table {name!r} has optimizer {oa!r} in {a.directory} but {ob!r} in {b.directory}: "
                             "the checkpoint's slot variables are those of A's. Keep the optimizer's type.")


def _vocabulary_tokens(artifact: Artifact, key: str, feature: str) -> pa.Array:
    m = artifact.manifest
    info = m.features.get(feature)
    rel = info.vocabulary_file if info is not None and info.vocabulary_file else \
        f"vocab/{vocabulary_filename(feature)}"
    path = rel if tio.is_absolute(rel) else tio.join(artifact.directory, rel)
    try:
        tokens = read_vocabulary(path)
    except FileNotFoundError:
        raise RemapError(f"{path} is missing: the artifact {artifact.directory} is incomplete. Re-run "
                         "`tpu-embed run` (or vocab) for it.") from None
    size = m.vocabulary_sizes[key]
    # Under a capacity (vocabulary modes) the file lists the tokens in use, fewer than the rows it reserves.
    in_use = getattr(m.vocabularies[key], "tokens", None) if m.vocabularies else None
    if len(tokens) > size or (in_use is None and len(tokens) != size):
        raise RemapError(f"{path} has {len(tokens)} tokens but the manifest of {artifact.directory} says {size}: "
                         "the vocabulary was changed after the jobs ran. Re-run `tpu-embed run` for it.")
    return tokens


def row_mappings(a: Artifact, b: Artifact, tables: Optional[List[str]] = None) -> Dict[str, RowMapping]:
    """{table: RowMapping} from artifact `a` to artifact `b` (both `tpu_embed.artifact.load.Artifact`s) for
    every table of the spec (SparseCore and tensor-core), or those named in `tables`."""
    check_compatible(a, b)
    sa, sb = a.spec, b.spec
    mappings: Dict[str, RowMapping] = {}
    for t in sa.tables:
        if tables is not None and t.name not in tables:
            continue
        f = next(f for f in sa.categorical if f.table == t.name)
        rows_a = sa.table_vocabulary_size(t.name, a.manifest.vocabulary_sizes)
        rows_b = sb.table_vocabulary_size(t.name, b.manifest.vocabulary_sizes)
        v = f.vocabulary
        if not isinstance(v, FrequencyVocabulary):
            mappings[t.name] = identity_mapping(t.name, v.type, rows_a, t.dim)
            continue
        key = sa.vocabulary_key(f)
        tokens_a = _vocabulary_tokens(a, key, f.name)
        tokens_b = _vocabulary_tokens(b, key, f.name)
        size_a, size_b = a.manifest.vocabulary_sizes[key], b.manifest.vocabulary_sizes[key]
        source = frequency_source(tokens_a, tokens_b, v.num_oov_buckets, size_a, size_b)
        if source.size != rows_b or size_a + v.num_oov_buckets != rows_a:
            raise AssertionError(f"table {t.name}: rows {rows_a} -> {rows_b}, mapping {source.size}")
        mappings[t.name] = RowMapping(t.name, "frequency", rows_a, rows_b, t.dim, source, size_a, size_b,
                                  v.num_oov_buckets)
    return mappings


def load(artifact_dir: str) -> Artifact:
    """An artifact for remapping: its manifest, spec and vocabulary files checked (no shards needed)."""
    artifact = load_artifact(artifact_dir, verify="none")
    tverify.check_files(artifact_dir, artifact.manifest, "size", kinds=("vocabulary",))
    return artifact
