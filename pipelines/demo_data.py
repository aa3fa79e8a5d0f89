"""A synthetic Criteo-like data set for `tpu-embed demo`: TFRecord files of `tf.train.Example`, seeded.

    paths = write_dataset("build/demo/data", num_examples=500_000, seed=1234)

Every example has

* `label` (float 0/1): a logistic function of some dense features and of hidden per-token
  effects of some categorical features, so a model can learn it (base rate ~25 %);
* `I1`..`I13` (float): count-like dense features (log-normal, some blank -> 0);
* `C1`..`C26` (bytes, one 8-hex-digit token): Zipf-distributed over vocabularies shaped like
  Criteo's (cardinalities 3 .. 10^6);
* `tags` (bytes, 1..6 tokens) and `categories` (bytes, 0..3 tokens): multivalent;
* `query` (bytes, 1..4 tokens) with `query_weights` (float, one per token): weighted;
* `history` (bytes, 0..12 tokens, the spec keeps the first 10): a sequence feature.

Encoding is vectorised: the fixed-width part of every record (univalent tokens, floats) is one
numpy byte matrix, the variable-width features are slices of pre-encoded value buffers, so
500 k examples take seconds, not the minutes per-field protobuf building would.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tpu_embed.artifact import tfrecord
from tpu_embed.artifact.example_wire import length_delimited, varint

# Criteo Kaggle's categorical cardinalities, capped at 10^6 (the demo's tables stay in memory).
CARDINALITIES = (1460, 583, 1_000_000, 1_000_000, 305, 24, 12517, 633, 3, 93145, 5683, 1_000_000, 3194, 27,
                 14992, 1_000_000, 10, 5652, 2173, 4, 1_000_000, 18, 15, 286181, 105, 142572)
ZIPF = tuple(1.05 + 0.35 * ((7 * i) % 26) / 25 for i in range(26))  # 1.05 .. 1.40
DENSE = tuple(f"I{i}" for i in range(1, 14))
CATEGORICAL = tuple(f"C{i}" for i in range(1, 27))
# (name, vocabulary cardinality, min values, max values, Zipf exponent)
MULTIVALENT = (("tags", 20_000, 1, 6, 1.2), ("categories", 500, 0, 3, 1.3))
WEIGHTED = ("query", 50_000, 1, 4, 1.15)
SEQUENCE = ("history", 100_000, 0, 12, 1.1)
# Features whose tokens move the label (hidden effects), and dense ones that do.
INFORMATIVE = ("C1", "C2", "C5", "C6", "C9", "C14", "C17", "C20", "C23", "C25", "tags", "history")
DENSE_WEIGHTS = {"I1": 0.35, "I3": -0.25, "I6": 0.2, "I11": 0.3}


# ---------------------------------------------------------------- protobuf pieces

def _entry(key: str, feature: bytes) -> bytes:
    """One `Features.feature` map entry (field 1 of Features)."""
    return length_delimited(1, length_delimited(1, key.encode()) + length_delimited(2, feature))


def _fixed_prefix(key: str, kind: int, value_len: int) -> bytes:
    """Bytes of a map entry before a fixed-size value: kind 1 = one bytes value, 2 = one float."""
    if kind == 1:
        lst = length_delimited(1, b"\0" * value_len)
        full = _entry(key, length_delimited(1, lst))
    else:
        full = _entry(key, length_delimited(2, length_delimited(1, b"\0" * value_len)))
    return full[:-value_len]


def _hex_tokens(ids: np.ndarray, salt: int) -> np.ndarray:
    """[n, 8] uint8: 8 lowercase hex digits of a bijective 32-bit scramble of each id."""
    h = ((ids.astype(np.uint64) * np.uint64(2654435761) + np.uint64(salt * 97 + 12345)) & np.uint64(0xFFFFFFFF))
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    return digits[((h[:, None] >> shifts[None, :]) & np.uint64(0xF)).astype(np.int64)]


def _zipf_ids(rng: np.random.Generator, a: float, cardinality: int, n: int) -> np.ndarray:
    return ((rng.zipf(a, size=n) - 1) % cardinality).astype(np.int64)


def _effects(name: str, ids: np.ndarray, scale: float) -> np.ndarray:
    """A deterministic hidden effect per token id (what an embedding can learn)."""
    salt = sum(ord(c) for c in name) * 1_000_003
    h = (ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(salt)) >> np.uint64(40)
    u = h.astype(np.float64) / float(1 << 24)
    return scale * (2.0 * u - 1.0) * np.sqrt(3.0)  # uniform, variance scale^2


# ---------------------------------------------------------------- generation

def _ragged(rng, n: int, lo: int, hi: int, a: float, card: int) -> Tuple[np.ndarray, np.ndarray]:
    lengths = rng.integers(lo, hi + 1, size=n)
    ids = _zipf_ids(rng, a, card, int(lengths.sum()))
    return lengths, ids


def generate(num_examples: int, seed: int = 1234) -> Dict[str, Any]:
    """Columns of the data set: numpy arrays (ragged ones as (lengths, values))."""
    rng = np.random.default_rng(seed)
    n = int(num_examples)
    cols: Dict[str, Any] = {}
    logit = np.full(n, -0.4)
    for name in DENSE:
        x = np.floor(rng.lognormal(mean=1.0, sigma=1.2, size=n))
        x[rng.random(n) < 0.15] = 0.0  # Criteo's blanks, filled
        cols[name] = x.astype(np.float32)
        if name in DENSE_WEIGHTS:
            z = np.log1p(x)
            logit += DENSE_WEIGHTS[name] * (z - z.mean()) / (z.std() + 1e-9)
    for i, name in enumerate(CATEGORICAL):
        ids = _zipf_ids(rng, ZIPF[i], CARDINALITIES[i], n)
        cols[name] = ids
        if name in INFORMATIVE:
            logit += _effects(name, ids, 0.45)
    for name, card, lo, hi, a in MULTIVALENT + (WEIGHTED, SEQUENCE):
        lengths, ids = _ragged(rng, n, lo, hi, a, card)
        cols[name] = (lengths, ids)
        if name in INFORMATIVE:
            rows = np.repeat(np.arange(n), lengths)
            logit += np.bincount(rows, weights=_effects(name, ids, 0.45), minlength=n) / np.maximum(lengths, 1)
    wl, wv = cols[WEIGHTED[0]]
    cols[WEIGHTED[0] + "_weights"] = (wl, rng.uniform(0.1, 2.0, size=wv.size).astype(np.float32))
    cols["label"] = (rng.random(n) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    return cols


# ---------------------------------------------------------------- encoding

def _salt(name: str) -> int:
    return sum((i + 1) * ord(c) for i, c in enumerate(name))


def encode_examples(cols: Dict[str, Any], start: int, stop: int) -> List[bytes]:
    """Serialized `tf.train.Example`s of rows [start, stop), bytes-identical to protobuf's encoding
    of the same Example (keys in this fixed order)."""
    n = stop - start
    fixed_parts: List[np.ndarray] = []

    def add_fixed(prefix: bytes, values: np.ndarray):
        fixed_parts.append(np.broadcast_to(np.frombuffer(prefix, np.uint8), (n, len(prefix))))
        fixed_parts.append(values.reshape(n, -1))

    add_fixed(_fixed_prefix("label", 2, 4), np.ascontiguousarray(cols["label"][start:stop]).view(np.uint8))
    for name in DENSE:
        add_fixed(_fixed_prefix(name, 2, 4), np.ascontiguousarray(cols[name][start:stop]).view(np.uint8))
    for name in CATEGORICAL:
        add_fixed(_fixed_prefix(name, 1, 8), _hex_tokens(cols[name][start:stop], _salt(name)))
    fixed = np.ascontiguousarray(np.concatenate(fixed_parts, axis=1))
    width = fixed.shape[1]
    fixed_bytes = fixed.tobytes()

    # Variable-width features: per value pre-encoded bytes, sliced per example; headers by length.
    variable = []
    for name, *_ in MULTIVALENT + (WEIGHTED, SEQUENCE):
        lengths, ids = cols[name]
        off = np.concatenate([[0], np.cumsum(lengths)])
        lo, hi = int(off[start]), int(off[stop])
        toks = _hex_tokens(ids[lo:hi], _salt(name))
        enc = np.concatenate([np.tile(np.array([0x0A, 0x08], np.uint8), (toks.shape[0], 1)), toks], axis=1)
        heads = {k: _entry(name, length_delimited(1, b"\0" * (10 * k)))[:-10 * k or None]
                 for k in range(int(lengths.max()) + 1)}
        variable.append((enc.tobytes(), 10, (off[start:stop + 1] - lo).tolist(), heads))
    wl, wv = cols[WEIGHTED[0] + "_weights"]
    woff = np.concatenate([[0], np.cumsum(wl)])
    lo, hi = int(woff[start]), int(woff[stop])
    wname = WEIGHTED[0] + "_weights"
    wheads = {k: _entry(wname, length_delimited(2, length_delimited(1, b"\0" * (4 * k))))[:-4 * k or None]
              for k in range(int(wl.max()) + 1)}
    variable.append((wv[lo:hi].tobytes(), 4, (woff[start:stop + 1] - lo).tolist(), wheads))

    out = []
    for i in range(n):
        parts = [fixed_bytes[i * width:(i + 1) * width]]
        for buf, size, offs, heads in variable:
            a, b = offs[i], offs[i + 1]
            parts.append(heads[b - a])
            parts.append(buf[a * size:b * size])
        features = b"".join(parts)
        out.append(b"\x0a" + varint(len(features)) + features)
    return out


def _write_rows(directory: str, cols: Dict[str, object], start: int, stop: int, num_files: int,
                progress=None) -> List[str]:
    """Rows [start, stop) of `cols` as `num_files` TFRecord files `part-NNNNN-of-NNNNN.tfrecord`, in order."""
    os.makedirs(directory, exist_ok=True)
    bounds = np.linspace(start, stop, num_files + 1).astype(int)
    paths = []
    for k in range(num_files):
        path = os.path.join(directory, f"part-{k:05d}-of-{num_files:05d}.tfrecord")
        tmp = path + ".tmp"
        a, b = int(bounds[k]), int(bounds[k + 1])
        step = 16384
        with open(tmp, "wb") as fh:
            for s in range(a, b, step):
                e = min(b, s + step)
                fh.write(b"".join(tfrecord.frame(r) for r in encode_examples(cols, s, e)))
                if progress is not None:
                    progress(e - s)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def write_dataset(directory: str, num_examples: int = 500_000, *, seed: int = 1234, num_files: int = 8,
                  progress=None) -> List[str]:
    """Write `num_files` TFRecord files `part-NNNNN-of-NNNNN.tfrecord`; returns their paths."""
    return _write_rows(directory, generate(num_examples, seed), 0, num_examples, num_files, progress)


def write_days(directory: str, num_examples: int, days: int, *, seed: int = 1234, num_files: int = 8,
               progress=None) -> List[List[str]]:
    """One data set of `num_examples` split in `days` consecutive parts, `directory/day<k>/part-*.tfrecord`
    (`num_files` per day): the same tokens keep their hidden effects from day to day, and each day brings
    tokens the earlier ones had not seen (the Zipf tails). Returns the paths per day."""
    cols = generate(num_examples, seed)
    bounds = np.linspace(0, num_examples, days + 1).astype(int)
    return [_write_rows(os.path.join(directory, f"day{d + 1}"), cols, int(bounds[d]), int(bounds[d + 1]),
                        num_files, progress) for d in range(days)]


SPEC_TEMPLATE = """\
# Synthetic Criteo-like data (pipelines/demo_data.py): TFRecord files of tf.train.Example.
# Written by `tpu-embed demo`; run it again with
#   tpu-embed run --spec {spec_path} --output OTHER_DIR
name: criteo-synthetic
inputs:
  format: tfrecord
  patterns: [{patterns}]     # relative to this file; --input replaces it
label: {{column: label}}
dense: [{dense}]
defaults:
  categorical:
    # Exact frequency vocabulary; tokens seen once map to the one OOV bucket.
    vocabulary: {{type: frequency, frequency_threshold: 2, num_oov_buckets: 1}}
  table: {{dim: 16, combiner: mean}}
categorical:
{categorical}
tables:
  - {{name: query, combiner: sum}}
optimizer: {{type: adagrad, learning_rate: 0.05, initial_accumulator: 0.1}}
topology: {{num_chips: 4, num_sc_per_chip: 4, num_hosts: 1}}
global_batch_size: {global_batch_size}
profile_data_directory: profiles
policies: {{tail: drop}}
# Ids chosen so that every destination SparseCore receives about the same number of lookups (frequency order puts
# every table's hottest tokens on consecutive SparseCores); docs/how-to/balance-sparsecores.md.
partition: {{ids: balanced}}
# No `limits`: `run` plans them from the profile of the same pass (exact maxima) and records them.
"""


# The multivalent, weighted and sequence entries: (name, the entry's other keys, comment).
SPECIAL_ENTRIES = (("tags", "", "multivalent: 1..6 tokens"), ("categories", "", "multivalent: 0..3 tokens"),
                   ("query", "weight_column: query_weights, table: query", "weighted (sum combiner)"),
                   ("history", "sequence_length: 10", "sequence: [batch, 10, dim]"))


def spec_text(patterns: Sequence[str], spec_path: str, global_batch_size: int = 2048,
              capacities: Optional[Mapping[str, int]] = None) -> str:
    """The demo's spec. With `capacities` ({feature: rows}), every vocabulary has `mode: append` and its
    capacity: a lineage of days whose tables keep their shapes (docs/how-to/daily-retraining.md)."""
    def entry(name: str, keys: str = "") -> str:
        parts = [f"name: {name}"] + ([keys] if keys else [])
        if capacities is not None:
            parts.append(f"vocabulary: {{mode: append, capacity: {capacities[name]}}}")
        return "{" + ", ".join(parts) + "}" if len(parts) > 1 else name

    lines = [f"  - {entry(n)}" for n in CATEGORICAL]
    lines += [f"  - {entry(n, keys)}".ljust(40) + f"  # {comment}" for n, keys, comment in SPECIAL_ENTRIES]
    return SPEC_TEMPLATE.format(patterns=", ".join(patterns), dense=", ".join(DENSE), categorical="\n".join(lines),
                                global_batch_size=global_batch_size, spec_path=spec_path)


def append_capacities(examples_per_day: int) -> Dict[str, int]:
    """Rows reserved per vocabulary for a lineage of days of `examples_per_day`: a quarter of a day's examples
    (at least 1024), never more than the feature's cardinality. The largest vocabularies (`history`, `query`)
    fill theirs, and their further tokens go to the OOV bucket, counted."""
    return {name: min(card, max(1024, examples_per_day // 4)) for name, card in vocabulary_cardinalities().items()}


def vocabulary_cardinalities() -> Dict[str, int]:
    out = dict(zip(CATEGORICAL, CARDINALITIES))
    out.update({m[0]: m[1] for m in MULTIVALENT + (WEIGHTED, SEQUENCE)})
    return out


__all__ = ["generate", "encode_examples", "write_dataset", "write_days", "spec_text", "append_capacities",
           "vocabulary_cardinalities"]
