"""Runs TensorFlow's own SparseCore host kernels; executed inside the oracle venv.

Protocol: `pipelines.child_pipe` (length-prefixed pickles on stdin/stdout).  Each
request is a dict of plain Python/numpy data (tables, features, inputs,
topology, limits); each response is plain data too, or {"error": message}.
Of tpu_embed it imports only that protocol (standard library alone): it is
the independent side of the comparison.

`tensorflow-tpu` 2.20 registers CPU kernels for the SparseCore preprocessing
ops; libtpu is kept from loading with TPU_LIBRARY_PATH (see DESIGN.md).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TPU_LIBRARY_PATH", "/nonexistent/libtpu.so")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: pipelines.child_pipe, not installed here

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.tpu import tpu_embedding_v3 as v3  # noqa: E402
from tensorflow.python.util import nest  # noqa: E402

from pipelines import child_pipe  # noqa: E402

E = tf.tpu.experimental.embedding
_OPTIMIZERS = {"sgd": E.SGD, "adagrad": E.Adagrad, "adam": E.Adam}


def _feature_config(req):
    tables = {}
    for t in req["tables"]:
        kind, lr = t.get("optimizer", ("sgd", 0.1))
        tables[t["name"]] = E.TableConfig(
            vocabulary_size=t["vocabulary_size"], dim=t["dim"], name=t["name"], combiner=t["combiner"],
            optimizer=_OPTIMIZERS[kind](learning_rate=lr))
    fc = {}
    for f in req["features"]:
        fc[f["name"]] = E.FeatureConfig(table=tables[f["table"]], output_shape=list(f["output_shape"]),
                                        name=f["name"])
    # As TPUEmbeddingBase does: the tables are those the features use, deduplicated.
    used = []
    for f in nest.flatten(fc):
        if f.table not in used:
            used.append(f.table)
    return fc, used


def _tensor(spec):
    kind = spec["kind"]
    if kind is None:
        return None
    if kind == "dense":
        return tf.constant(spec["values"])
    if kind == "sparse":
        return tf.SparseTensor(tf.constant(spec["indices"], tf.int64), tf.constant(spec["values"]),
                               tf.constant(spec["dense_shape"], tf.int64))
    if kind == "ragged":
        return tf.RaggedTensor.from_row_splits(tf.constant(spec["values"]),
                                               tf.constant(spec["row_splits"], tf.int64))
    raise ValueError(kind)


def _stacking(req):
    fc, tables = _feature_config(req)
    flat = nest.flatten_with_joined_string_paths(fc)
    s = v3._stack_tables_with_same_table_dim_and_optimizer(
        tables, flat, req["num_chips"], req["num_sc_per_chip"], None)
    return fc, flat, s


def handle(req):
    op = req["op"]
    if op in _EMBEDDING_V2_OPS:
        return _EMBEDDING_V2_OPS[op](req)
    fc, flat, s = _stacking(req)
    if op == "stack":
        return {
            "stacks": {k: [t.name for t in v] for k, v in s.stacked_table_to_tables.items()},
            "table_to_stacked_table_offset": dict(s.table_to_stacked_table_offset),
            "feature_to_sample_offset": dict(s.feature_to_sample_offset),
            "table_to_sample_count": dict(s.table_to_sample_count),
        }
    names = [f["name"] for f in req["features"]]
    inputs = {n: _tensor(req["inputs"][n]) for n in names}
    weights = {n: _tensor(req["weights"][n]) if req.get("weights") else None for n in names}
    flat_inputs = nest.flatten(inputs)
    flat_weights = [weights[p] for p, _ in flat]
    if op == "stats":
        ids, uniq = v3.TPUEmbeddingV2.compute_sparse_core_stats(
            inputs, fc, req["num_chips"], req["num_sc_per_chip"])
        return {"max_ids": {k: int(v) for k, v in ids.items()},
                "max_unique_ids": {k: int(v) for k, v in uniq.items()}}
    assert op in ("preprocess", "bench")
    emb = object.__new__(v3.TPUEmbeddingV2)
    stacks = list(s.stacked_table_to_tables)
    emb._table_to_max_ids_per_sparse_core = {k: req.get("max_ids_per_table", {}).get(k, 256) for k in stacks}
    emb._table_to_max_unique_ids_per_sparse_core = {
        k: req.get("max_unique_ids_per_table", {}).get(k, 256) for k in stacks}
    emb._sparse_core_embedding_config = v3.SparseCoreEmbeddingConfig(
        max_ids_per_chip_per_sample=req["max_ids_per_chip_per_sample"],
        allow_id_dropping=req["allow_id_dropping"])
    num_sc = req["num_chips"] * req["num_sc_per_chip"]

    def run(flat_inputs, flat_weights):
        return emb._preprocess_features(
            req["num_chips"], req["max_ids_per_chip_per_sample"], 64, req["num_sc_per_chip"], num_sc,
            s.stacked_table_to_tables, s.table_to_stacked_table_offset, s.table_to_sample_count,
            s.feature_to_sample_offset, flat, flat_inputs, flat_weights)

    if op == "bench":
        return _bench(run, req, flat_inputs, flat_weights)
    out = run(flat_inputs, flat_weights)
    result = {}
    for name, (csr, rp, n) in out.items():
        rp, n = int(rp), int(n)
        result[name] = {
            "row_pointers": csr.row_pointers.numpy()[:rp],
            "sorted_sample_ids": csr.sorted_sample_ids.numpy()[:n],
            "sorted_token_ids": csr.sorted_token_ids.numpy()[:n],
            "sorted_gains": csr.sorted_gains.numpy()[:n],
            "row_pointers_unpadded_size": rp,
            "ids_unpadded_size": n,
            "sample_count": int(csr.sample_count),
            "num_minibatches": int(csr.num_minibatches_per_physical_sparse_core),
            "row_pointers_size": int(csr.row_pointers.shape[0]),
            "ids_size": int(csr.sorted_token_ids.shape[0]),
        }
    return result


def _bench(run, req, flat_inputs, flat_weights):
    """Seconds per call of TF's preprocessing, eager and inside tf.function (as enqueue runs it)."""
    import time
    batches = [[_tensor(b[f["name"]]) for f in sorted(req["features"], key=lambda f: f["name"])]
               for b in req["batches"]]
    result = {}
    compiled = tf.function(lambda xs: run(xs, [None] * len(xs)))
    for mode, fn in (("eager", lambda xs: run(xs, [None] * len(xs))), ("tf_function", compiled)):
        fn(batches[0])  # warm up (tracing for tf.function)
        best = float("inf")
        for _ in range(req.get("repeats", 3)):
            t0 = time.perf_counter()
            for b in batches:
                out = fn(b)
            for v in out.values():
                v[2].numpy()
            best = min(best, (time.perf_counter() - t0) / len(batches))
        result[mode] = best
    return result


# ---------------------------------------------------------------- TPUEmbeddingV2 itself (tpu_embed.training)
#
# Requests: {"op": "tpu_embedding_v2" | "tpu_embedding_v2_enqueue", "num_chips", "num_sc_per_chip",
#   "container": "dict" | "list", "tables": [{"name", "vocabulary_size", "dim", "combiner",
#   "optimizer": (class name, attribute dict)}], "features": [{"name", "table", "output_shape",
#   "max_sequence_length"}] (flattened order), "optimizer": None | (class name, attribute dict),
#   "sparse_core_config": {SparseCoreEmbeddingConfig fields}, "pipeline_execution_with_tensor_core": bool,
#   and for "tpu_embedding_v2_enqueue": "inputs": {feature: tensor spec as in `_tensor`}}.
# TPUEmbeddingV2's real constructor runs under a stand-in TPUStrategy (there is no TPU): the strategy
# only answers num_replicas_in_sync, the SparseCores per chip and the TPU device names.

def _fake_tpu_strategy(num_chips, num_sc_per_chip):
    import types

    from tensorflow.python.distribute import tpu_strategy

    ext = types.SimpleNamespace(
        tpu_hardware_feature=types.SimpleNamespace(num_embedding_devices_per_chip=num_sc_per_chip),
        _tpu_devices=np.array([[f"/job:localhost/replica:0/task:0/device:TPU:{i}"] for i in range(num_chips)],
                              dtype=object))

    class StandInTPUStrategy(tpu_strategy.TPUStrategyV2):
        def __init__(self):  # no TPU to connect to
            pass

        num_replicas_in_sync = property(lambda self: num_chips)
        extended = property(lambda self: ext)

    return StandInTPUStrategy()


def _tf_optimizer(spec):
    if spec is None:
        return None
    cls_name, attrs = spec
    opt = object.__new__(getattr(E, cls_name))
    opt.__dict__.update(attrs)  # the same attributes, hence the same hash(optimizer) grouping
    return opt


def _embedding_v2(req):
    tables = {t["name"]: E.TableConfig(vocabulary_size=t["vocabulary_size"], dim=t["dim"], name=t["name"],
                                       combiner=t["combiner"], optimizer=_tf_optimizer(t["optimizer"]))
              for t in req["tables"]}
    feats = [E.FeatureConfig(table=tables[f["table"]], output_shape=list(f["output_shape"]),
                             max_sequence_length=f.get("max_sequence_length", 0), name=f["name"])
             for f in req["features"]]
    fc = {f.name: f for f in feats} if req.get("container", "dict") == "dict" else feats
    strategy = _fake_tpu_strategy(req["num_chips"], req["num_sc_per_chip"])
    saved = v3.distribute_lib.get_strategy
    v3.distribute_lib.get_strategy = lambda: strategy
    try:
        emb = v3.TPUEmbeddingV2(fc, _tf_optimizer(req.get("optimizer")),
                                pipeline_execution_with_tensor_core=req["pipeline_execution_with_tensor_core"],
                                sparse_core_embedding_config=v3.SparseCoreEmbeddingConfig(
                                    **req["sparse_core_config"]))
    finally:
        v3.distribute_lib.get_strategy = saved
    return emb, fc


def _embedding_v2_config(req):
    emb, fc = _embedding_v2(req)
    # TF's stacker on its own, as the conformance of tpu_embed.sparsecore.stack_tables calls it.
    used = []
    for f in nest.flatten(fc):
        if f.table not in used:
            used.append(f.table)
    s = v3._stack_tables_with_same_table_dim_and_optimizer(
        used, nest.flatten_with_joined_string_paths(fc), req["num_chips"], req["num_sc_per_chip"],
        v3.SparseCoreEmbeddingConfig(**req["sparse_core_config"]))
    return {
        "stacks": {k: [t.name for t in v] for k, v in emb._stacked_table_to_tables.items()},
        "stacker_stacks": {k: [t.name for t in v] for k, v in s.stacked_table_to_tables.items()},
        "table_to_stacked_table_offset": {k: tuple(v) for k, v in emb._table_to_stacked_table_offset.items()},
        "feature_to_sample_offset": dict(emb._feature_to_sample_offset),
        "table_to_sample_count": dict(emb._table_to_sample_count),
        "max_ids_per_table": dict(emb._table_to_max_ids_per_sparse_core),
        "max_unique_ids_per_table": dict(emb._table_to_max_unique_ids_per_sparse_core),
        "max_ids_per_chip_per_sample": int(emb.max_ids_per_chip_per_sample),
        "allow_id_dropping": bool(emb._sparse_core_embedding_config.allow_id_dropping),
        "num_sc_per_chip": int(emb._num_sc_per_chip),
        "pipelining": bool(emb._pipelining),
        "optimizers": {t.name: (type(t.optimizer).__name__, dict(vars(t.optimizer))) for t in emb._table_config},
        "flat_features": [p for p, _ in emb._flat_features],
    }


def _embedding_v2_enqueue(req):
    """What `TPUEmbeddingV2.enqueue` (outside a TPU context) returns for one chip's batch."""
    emb, fc = _embedding_v2(req)
    inputs = {f["name"]: _tensor(req["inputs"][f["name"]]) for f in req["features"]}
    if req.get("container", "dict") != "dict":
        inputs = [inputs[f["name"]] for f in req["features"]]
    traced = tf.function(lambda x: emb.enqueue(x)).get_concrete_function(inputs).structured_outputs
    values = emb.enqueue(inputs)
    result = {}
    for name, (csr, rp, n) in values.items():
        t_csr, t_rp, t_n = traced[name]
        rp_v, n_v = int(rp), int(n)
        fields = {}
        for field in csr._fields:
            v, t = getattr(csr, field), getattr(t_csr, field)
            if isinstance(v, int):
                fields[field] = {"python": type(v).__name__, "value": v, "traced_python": type(t).__name__}
                continue
            arr = v.numpy()
            cut = rp_v if field == "row_pointers" else n_v
            fields[field] = {"dtype": v.dtype.name, "static_shape": t.shape.as_list(), "shape": list(arr.shape),
                             "prefix": arr[:cut] if arr.ndim else arr}
        result[name] = {
            "type": type(csr).__name__, "fields_order": list(csr._fields), "tuple_len": len(values[name]),
            "fields": fields,
            "row_pointers_unpadded_size": {"dtype": rp.dtype.name, "static_shape": t_rp.shape.as_list(),
                                           "value": rp_v},
            "ids_unpadded_size": {"dtype": n.dtype.name, "static_shape": t_n.shape.as_list(), "value": n_v},
        }
    return {"order": list(values), "stacks": result}


_EMBEDDING_V2_OPS = {"tpu_embedding_v2": _embedding_v2_config, "tpu_embedding_v2_enqueue": _embedding_v2_enqueue}


if __name__ == "__main__":
    child_pipe.serve(handle)  # an error is answered as {"error": ...}: it is part of the conformance result
