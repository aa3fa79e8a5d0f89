"""An artifact's shards decoded back to examples, and the same entries made from the serving layer's ids: what
the equivalence tests compare.

`shard_examples(artifact)` gives, for every example the shards hold (in example order: input file and record,
no shuffle), its dense values, every SparseCore feature's entries {(position, id): gain} (position 0 of a bag,
p of a sequence; equal ids of a bag merged, gains as the CSR holds them) and every tensor-core feature's ids and
weights. `served_entries` makes the same entries from one row of `map_raw`'s output with the table's combiner.
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np

from tests.helpers.plain_reference import decode_chip
from tpu_embed.artifact import shard_records, tfrecord
from tpu_embed.artifact.manifest import read_manifest


def shard_examples(d: str) -> list:
    m = read_manifest(d)
    raw = json.load(open(os.path.join(d, "manifest.json")))
    assert raw["batching"]["shuffle"] is None, "decode in example order: the spec must not shuffle"
    fmt = m.shard_format
    topo, layout = raw["topology"], raw["layout"]
    seq = {f["path"]: f for f in layout["features"]}
    B = raw["batch_sizes"]["global"]
    H = topo["num_hosts"]
    hb, per_chip, cph = B // H, raw["batch_sizes"]["per_chip"], raw["batch_sizes"]["chips_per_host"]
    steps = raw["shards"]["steps"]
    out = [None] * (steps * B)
    for h in range(H):
        for path in shard_records.shard_files(d, h, m):
            for data in tfrecord.read_records(path):
                r = shard_records.decode_record(data, fmt)
                for pos in range(hb):
                    k = r["step"] * B + h * hb + pos
                    if not r["mask"][pos]:
                        continue
                    out[k] = {"dense": r["dense"][pos], "sc": collections.defaultdict(dict), "tc": {}}
                for name, tc in r["tensor_core"].items():
                    starts = np.concatenate([[0], np.cumsum(tc["lengths"])])
                    for pos in range(hb):
                        k = r["step"] * B + h * hb + pos
                        if out[k] is not None:
                            w = None if tc["weights"] is None else tc["weights"][starts[pos]:starts[pos + 1]]
                            out[k]["tc"][name] = (tc["ids"][starts[pos]:starts[pos + 1]].tolist(),
                                                  None if w is None else w.tolist())
                for c in range(cph):
                    g = h * cph + c
                    for (name, sample, ident), gain in decode_chip(r["sparse_core"][c], layout, topo).items():
                        shape = seq[name]["output_shape"]
                        length = shape[1] if len(shape) == 2 else 0
                        local, p = (sample // length, sample % length) if length else (sample, 0)
                        k = r["step"] * B + g * per_chip + local
                        assert out[k] is not None, (name, k)
                        out[k]["sc"][name][(p, ident)] = gain
    return [e for e in out if e is not None]


def served_entries(ids, weights, combiner: str, sequence: bool) -> dict:
    """{(position, id): gain} of one example's ids and weights (float32 arithmetic, the CSR's)."""
    ids = [int(i) for i in ids]
    w = np.ones(len(ids), np.float32) if weights is None else np.asarray(weights, np.float32)
    out: dict = {}
    if sequence:
        for p, (i, x) in enumerate(zip(ids, w, strict=True)):
            s = x if combiner == "sum" else (x * x if combiner == "sqrtn" else x)
            scale = np.float32(1) if combiner == "sum" else (
                np.float32(0) if s == 0 else np.float32(1 / float(s)) if combiner == "mean"
                else np.float32(1 / float(np.sqrt(s))))
            out[(p, i)] = float(x if combiner == "sum" else np.float32(x * scale))
        return out
    total = np.float32(0)
    for x in w:
        total = np.float32(total + (x * x if combiner == "sqrtn" else x))
    scale = np.float32(1) if combiner == "sum" else (
        np.float32(0) if total == 0 else np.float32(1 / float(total)) if combiner == "mean"
        else np.float32(1 / float(np.sqrt(total))))
    merged: dict = {}
    for i, x in zip(ids, w, strict=True):
        merged[i] = np.float32(merged.get(i, np.float32(0)) + x)
    for i, x in merged.items():
        out[(0, i)] = float(x if combiner == "sum" else np.float32(x * scale))
    return out


def shard_steps(d: str) -> list:
    """[[one decoded record per host] per step] of an artifact's shards: what `HostEmbedding.dequeue` takes."""
    m = read_manifest(d)
    hosts = [[shard_records.decode_record(r, m.shard_format) for p in shard_records.shard_files(d, h, m)
              for r in tfrecord.read_records(p)] for h in range(m.topology.num_hosts)]
    return [[hosts[h][s] for h in range(len(hosts))] for s in range(len(hosts[0]))]


def _as_lists(out):
    return ({k: v.to_list() for k, v in out["ids"].items()}, {k: v.to_list() for k, v in out["weights"].items()})


def assert_serves_the_shards(spec, d, out):
    """`out` (map_raw's output for every input record in file order) against the shards' examples; returns the
    number of examples compared."""
    shards = shard_examples(d)
    valid = out["valid"].numpy()
    rows_ = np.flatnonzero(valid)
    if spec.policies.tail == "drop":  # the last partial step is not in the shards
        assert 0 <= rows_.size - len(shards) < spec.global_batch_size, (rows_.size, len(shards))
        rows_ = rows_[:len(shards)]
    assert rows_.size == len(shards), (rows_.size, len(shards))
    ids, weights = _as_lists(out)
    dense = out["dense"].numpy()
    for k, e in zip(rows_.tolist(), shards, strict=True):
        np.testing.assert_array_equal(dense[k], e["dense"], err_msg=f"row {k}")
        for f in spec.categorical:
            w = weights[f.name][k] if f.name in weights else None
            if f.on_sparse_core:
                got = served_entries(ids[f.name][k], w, spec.table(f.table).combiner, f.sequence_length > 0)
                assert got == dict(e["sc"].get(f.name, {})), (k, f.name, ids[f.name][k], w)
            else:
                tc_ids, tc_w = e["tc"][f.name]
                assert tc_ids == ids[f.name][k], (k, f.name)
                if tc_w is not None:
                    np.testing.assert_array_equal(np.asarray(tc_w, np.float32), np.asarray(w, np.float32))
    return len(shards)


def from_transformed(out, spec) -> dict:
    """A tf.Transform output's features (`tpu_embed.serving.tft_output`) as `map_raw`'s output."""
    import tensorflow as tf

    from tpu_embed.serving.tft_output import VALID, WEIGHTS_SUFFIX
    return {"ids": {f.name: tf.RaggedTensor.from_sparse(out[f.name]) for f in spec.categorical},
            "weights": {f.name: tf.RaggedTensor.from_sparse(out[f.name + WEIGHTS_SUFFIX])
                        for f in spec.categorical if f.weight_column},
            "dense": tf.stack([out[x.name] for x in spec.dense], axis=1),
            "valid": tf.cast(out[VALID], tf.bool)}
