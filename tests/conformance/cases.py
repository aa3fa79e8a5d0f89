"""Random SparseCore preprocessing cases as plain data, shared by the oracle and us.

A case is a dict: tables, features, per-feature inputs (dense / sparse /
ragged arrays), optional weights, topology and limits.  `request(case, op)`
is what the oracle gets; `to_ours(case)` builds the same thing for
`tpu_embed.sparsecore.preprocess`.
"""

from __future__ import annotations

import types

import numpy as np
from hypothesis import strategies as st

from tpu_embed.sparsecore import RaggedIds, SparseIds, Topology


def request(case: dict, op: str) -> dict:
    req = {k: case[k] for k in ("tables", "features", "num_chips", "num_sc_per_chip")}
    req.update(op=op, inputs=case["inputs"], weights=case.get("weights"),
               max_ids_per_table=case.get("max_ids_per_table", {}),
               max_unique_ids_per_table=case.get("max_unique_ids_per_table", {}),
               max_ids_per_chip_per_sample=case.get("max_ids_per_chip_per_sample", 64),
               allow_id_dropping=case.get("allow_id_dropping", False))
    return req


_OPT = {}


def _optimizer(spec):
    # Real TF optimizer objects, so stacking groups by hash(optimizer) exactly as TF does.
    import tensorflow as tf
    key = tuple(spec)
    if key not in _OPT:
        kind, lr = spec
        cls = {"sgd": tf.tpu.experimental.embedding.SGD, "adagrad": tf.tpu.experimental.embedding.Adagrad,
               "adam": tf.tpu.experimental.embedding.Adam}[kind]
        _OPT[key] = cls(learning_rate=lr)
    return _OPT[key]


def feature_config(case: dict, use_tf: bool = True):
    tables = {}
    for t in case["tables"]:
        if use_tf:
            import tensorflow as tf
            tables[t["name"]] = tf.tpu.experimental.embedding.TableConfig(
                vocabulary_size=t["vocabulary_size"], dim=t["dim"], name=t["name"], combiner=t["combiner"],
                optimizer=_optimizer(t.get("optimizer", ("sgd", 0.1))))
        else:
            tables[t["name"]] = types.SimpleNamespace(
                name=t["name"], vocabulary_size=t["vocabulary_size"], dim=t["dim"], combiner=t["combiner"],
                optimizer=tuple(t.get("optimizer", ("sgd", 0.1))))
    fc = {}
    for f in case["features"]:
        if use_tf:
            import tensorflow as tf
            fc[f["name"]] = tf.tpu.experimental.embedding.FeatureConfig(
                table=tables[f["table"]], output_shape=list(f["output_shape"]), name=f["name"])
        else:
            fc[f["name"]] = types.SimpleNamespace(table=tables[f["table"]], output_shape=list(f["output_shape"]),
                                                  name=f["name"])
    return fc


def _ours(spec):
    if spec is None or spec["kind"] is None:
        return None
    if spec["kind"] == "dense":
        return np.asarray(spec["values"])
    if spec["kind"] == "sparse":
        return SparseIds(np.asarray(spec["indices"]), np.asarray(spec["values"]), np.asarray(spec["dense_shape"]))
    return RaggedIds(np.asarray(spec["values"]), np.asarray(spec["row_splits"]))


def to_ours(case: dict, use_tf: bool = True):
    fc = feature_config(case, use_tf)
    inputs = {n: _ours(s) for n, s in case["inputs"].items()}
    weights = None
    if case.get("weights"):
        weights = {n: _ours(s) for n, s in case["weights"].items()}
    kwargs = dict(
        weights=weights,
        max_ids_per_chip_per_sample=case.get("max_ids_per_chip_per_sample", 64),
        max_ids_per_table=case.get("max_ids_per_table") or None,
        max_unique_ids_per_table=case.get("max_unique_ids_per_table") or None,
        allow_id_dropping=case.get("allow_id_dropping", False))
    return inputs, fc, Topology(case["num_chips"], case["num_sc_per_chip"]), kwargs


def tf_inputs(case: dict, int32: bool = False):
    """The case's inputs and weights as the TF tensors a user has (tf.Tensor, tf.SparseTensor, tf.RaggedTensor);
    `int32`: int32 ids and row_splits (as tf.constant of Python ints and tf.io.RaggedFeature make them)."""
    import tensorflow as tf

    def convert(spec, ids):
        if spec is None or spec["kind"] is None:
            return None
        values = np.asarray(spec["values"])
        if ids and int32:
            values = values.astype(np.int32)
        if spec["kind"] == "dense":
            return tf.constant(values)
        if spec["kind"] == "sparse":
            return tf.SparseTensor(tf.constant(spec["indices"], tf.int64), tf.constant(values),
                                   tf.constant(spec["dense_shape"], tf.int64))
        return tf.RaggedTensor.from_row_splits(
            tf.constant(values), tf.constant(spec["row_splits"], tf.int32 if int32 else tf.int64))

    inputs = {n: convert(s, True) for n, s in case["inputs"].items()}
    weights = {n: convert(s, False) for n, s in case["weights"].items()} if case.get("weights") else None
    return inputs, weights


# ------------------------------------------------------------------ strategies

@st.composite
def ids_for(draw, rng_seed, vocab, n, skew):
    rng = np.random.default_rng(rng_seed)
    if skew:  # Zipf-like: plenty of duplicates, adjacent and not
        hot = max(1, min(vocab, draw(st.integers(1, 6))))
        return rng.integers(0, hot, size=n)
    return rng.integers(0, vocab, size=n)


@st.composite
def cases(draw, max_chips=16, allow_sequence=True, weighted=None, max_features=5, max_tables=4,
          limit_modes=("default", "default", "tight", "buffer"), batch_mult=(1, 6)):
    num_chips = draw(st.sampled_from([c for c in (1, 2, 4, 8, 16) if c <= max_chips]))
    nsc = draw(st.sampled_from([4, 4, 4, 2, 1]))
    batch = nsc * draw(st.integers(*batch_mult))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    n_tables = draw(st.integers(1, max_tables))
    tables = []
    for i in range(n_tables):
        tables.append({
            "name": f"t{i}_" + draw(st.sampled_from(["a", "b", "emb", "x"])),
            "vocabulary_size": draw(st.one_of(st.integers(1, 40), st.integers(40, 700))),
            "dim": draw(st.sampled_from([4, 8, 12, 16, 32])),
            "combiner": draw(st.sampled_from(["sum", "mean", "sqrtn"])),
            "optimizer": draw(st.sampled_from([("sgd", 0.1), ("sgd", 0.1), ("sgd", 0.5), ("adagrad", 0.1)])),
        })
    n_features = draw(st.integers(1, max_features))
    features, inputs, weights = [], {}, {}
    is_weighted = draw(st.booleans()) if weighted is None else weighted
    for j in range(n_features):
        t = tables[draw(st.integers(0, n_tables - 1))]
        name = f"f{j:02d}"
        seq = draw(st.integers(2, 3)) if (allow_sequence and draw(st.integers(0, 5)) == 0) else 0
        samples = batch * seq if seq else batch
        shape = [batch, seq] if seq else [batch]
        kind = draw(st.sampled_from(["dense", "sparse", "ragged"]))
        skew = draw(st.booleans())
        vocab = t["vocabulary_size"]
        if kind == "dense":
            vals = draw(ids_for(rng.integers(2**31), vocab, samples, skew)).astype(np.int64)
            spec = {"kind": "dense", "values": vals.reshape(shape)}
            wspec = {"kind": "dense", "values": _weights(rng, samples).reshape(shape)}
        else:
            per = rng.integers(0, draw(st.integers(1, 6)) + 1, size=samples)
            n = int(per.sum())
            vals = draw(ids_for(rng.integers(2**31), vocab, n, skew)).astype(np.int64)
            w = _weights(rng, n)
            if kind == "sparse":
                rows = np.repeat(np.arange(samples), per)
                cols = np.concatenate([np.arange(k) for k in per]) if n else np.zeros(0, np.int64)
                idx = np.stack([rows, cols], 1).astype(np.int64).reshape(-1, 2)
                dshape = np.array([samples, max(1, int(per.max(initial=0)))], np.int64)
                spec = {"kind": "sparse", "indices": idx, "values": vals, "dense_shape": dshape}
                wspec = {"kind": "sparse", "indices": idx, "values": w, "dense_shape": dshape}
            else:
                splits = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
                spec = {"kind": "ragged", "values": vals, "row_splits": splits}
                wspec = {"kind": "ragged", "values": w, "row_splits": splits}
        features.append({"name": name, "table": t["name"], "output_shape": shape})
        inputs[name] = spec
        weights[name] = wspec
    case = {"tables": tables, "features": features, "num_chips": num_chips, "num_sc_per_chip": nsc,
            "inputs": inputs, "weights": weights if is_weighted else None}
    # Limits: default, generous, or tight enough to overflow.
    mode = draw(st.sampled_from(list(limit_modes)))
    if mode == "tight":
        lim = draw(st.integers(1, 12))
        case["limit_mode"] = ("tight", lim)
    elif mode == "buffer":
        case["max_ids_per_chip_per_sample"] = draw(st.sampled_from([1, 2, 4, 8]))
        case["allow_id_dropping"] = draw(st.booleans())
    return case


def _weights(rng, n):
    w = rng.uniform(-2, 2, size=n).astype(np.float32)
    w[rng.random(n) < 0.1] = 0.0
    return w
