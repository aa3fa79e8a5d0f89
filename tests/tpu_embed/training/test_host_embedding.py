"""HostEmbedding: activations and gradients from SparseCore CSR equal TensorFlow's lookups on the raw ids.

The CSR comes from `tpu_embed.sparsecore.preprocess` (bit-exact with TF's
kernels, tests/conformance), one chip at a time; the reference is
`tf.nn.safe_embedding_lookup_sparse` over the whole global batch on the
same table values, and `tf.GradientTape` through it for the gradients.
Set HOST_EMBEDDING_STATS=<file> to append the largest differences seen.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, List, Optional

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import event, given, settings
from hypothesis import strategies as st

import tpu_embed
from tests.helpers import ROOT
from tests.helpers.plain_reference import plain_ids, plain_vocabulary, raw_rows, raw_values
from tpu_embed.artifact import shard_records, tfrecord
from tpu_embed.artifact.shard_format import ShardFormat
from tpu_embed.compat.from_spec import feature_columns
from tpu_embed.core.model import FeatureConfig, ModelConfig, OptimizerConfig, TableConfig, to_tf_feature_config
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore import RaggedIds, SparseIds, layout_of, preprocess
from tpu_embed.training.host_embedding import HostEmbedding
from tpu_embed.training.input import input_fn

ADAGRAD = OptimizerConfig.from_dict({"optimizer": "adagrad", "learning_rate": 0.1})
SGD = OptimizerConfig.from_dict({"optimizer": "sgd", "learning_rate": 0.1})
BIG = 1 << 20
KINDS = ("dense", "sparse", "ragged", "tf_sparse", "tf_ragged")


# ---------------------------------------------------------------- random models and global batches

@dataclasses.dataclass
class Feat:
    config: FeatureConfig
    kind: str
    ids: List[List[int]]  # per global sample (chip-major; a sequence sample is (example, position))
    weights: Optional[List[List[float]]]


@dataclasses.dataclass
class Case:
    model: ModelConfig
    feats: List[Feat]
    chip_format: str
    seed: int

    @property
    def topology(self) -> Topology:
        return self.model.topology


def _draw_ids(rng, vocab, n, mode):
    if mode == "edges":  # first row and the last row (a frequency vocabulary's OOV bucket)
        return rng.choice([0, vocab - 1], size=n)
    if mode == "hot":
        return rng.integers(0, min(vocab, 3), size=n)
    return rng.integers(0, vocab, size=n)


@st.composite
def cases(draw):
    chips = draw(st.sampled_from([1, 2, 4]))
    nsc = draw(st.sampled_from([1, 2, 4]))
    hosts = draw(st.sampled_from([h for h in (1, 2) if chips % h == 0]))
    per_chip = nsc * draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    tables = [TableConfig(f"t{i}", draw(st.one_of(st.integers(1, 20), st.integers(20, 400))),
                          draw(st.sampled_from([4, 8, 12, 16])), draw(st.sampled_from(["sum", "mean", "sqrtn"])),
                          draw(st.sampled_from([ADAGRAD, ADAGRAD, SGD])))
              for i in range(draw(st.integers(1, 4)))]
    feats = []
    for j in range(draw(st.integers(1, 5))):
        table = tables[draw(st.integers(0, len(tables) - 1))]
        seq = draw(st.sampled_from([0, 0, 0, 0, 2, 3]))
        kind = draw(st.sampled_from(KINDS))
        weighted = draw(st.booleans())
        mode = draw(st.sampled_from(["uniform", "edges", "hot"]))
        shape = (per_chip, seq) if seq else (per_chip,)
        n = chips * per_chip * (seq or 1)
        counts = np.ones(n, int) if kind == "dense" else rng.integers(0, draw(st.integers(1, 5)) + 1, size=n)
        ids = [list(_draw_ids(rng, table.vocabulary_size, k, mode)) for k in counts]
        weights = [list(rng.uniform(0.1, 3.0, size=k).astype(np.float32)) for k in counts] if weighted else None
        feats.append(Feat(FeatureConfig(f"f{j:02d}", table, shape, seq), kind, ids, weights))
    model = ModelConfig(tuple(f.config for f in feats), Topology(chips, nsc, hosts))
    fmt = draw(st.sampled_from(["csr_batch", "prefixes", "dequeue_inputs", "records"]))
    return Case(model, feats, fmt, seed)


def _chip_input(f: Feat, chip: int):
    shape = f.config.output_shape
    n = int(np.prod(shape))
    ids = f.ids[chip * n:(chip + 1) * n]
    ws = f.weights[chip * n:(chip + 1) * n] if f.weights else None
    flat_ids = np.array([i for row in ids for i in row], np.int64)
    flat_w = np.array([w for row in ws for w in row], np.float32) if ws else None
    if f.kind == "dense":
        return flat_ids.reshape(shape), None if ws is None else flat_w.reshape(shape)
    lengths = np.array([len(r) for r in ids])
    if f.kind in ("ragged", "tf_ragged"):
        splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        if f.kind == "tf_ragged":
            return (tf.RaggedTensor.from_row_splits(flat_ids, splits),
                    None if ws is None else tf.RaggedTensor.from_row_splits(flat_w, splits))
        return RaggedIds(flat_ids, splits), None if ws is None else RaggedIds(flat_w, splits)
    rows = np.repeat(np.arange(n), lengths)
    cols = np.concatenate([np.arange(k) for k in lengths]) if flat_ids.size else np.zeros(0, np.int64)
    width = max(1, int(lengths.max(initial=0)))
    if len(shape) == 2:  # sequence: rank-3 [example, position, id]
        idx = np.stack([rows // shape[1], rows % shape[1], cols], 1).astype(np.int64).reshape(-1, 3)
        dshape = np.array([shape[0], shape[1], width], np.int64)
    else:
        idx = np.stack([rows, cols], 1).astype(np.int64).reshape(-1, 2)
        dshape = np.array([n, width], np.int64)
    if f.kind == "tf_sparse":
        return tf.SparseTensor(idx, flat_ids, dshape), None if ws is None else tf.SparseTensor(idx, flat_w, dshape)
    return SparseIds(idx, flat_ids, dshape), None if ws is None else SparseIds(idx, flat_w, dshape)


def _csr_per_chip(case: Case):
    layout = layout_of(case.model)
    big = {s: BIG for s in layout.stacks}
    out = []
    for c in range(case.topology.num_chips):
        inputs, weights = {}, {}
        for f in case.feats:
            inputs[f.config.name], weights[f.config.name] = _chip_input(f, c)
        w = weights if any(f.weights for f in case.feats) else None
        if w is not None:
            w = {k: (v if v is not None else _ones_like(inputs[k])) for k, v in w.items()}
        out.append(preprocess(inputs, case.model, case.topology, weights=w, max_ids_per_table=big,
                              max_unique_ids_per_table=big))
    return out


def _ones_like(value):
    if isinstance(value, np.ndarray):
        return np.ones(value.shape, np.float32)
    if isinstance(value, RaggedIds):
        return RaggedIds(np.ones(value.values.shape, np.float32), value.row_splits)
    if isinstance(value, SparseIds):
        return SparseIds(value.indices, np.ones(value.values.shape, np.float32), value.dense_shape)
    if isinstance(value, tf.RaggedTensor):
        return tf.ones_like(value, tf.float32)
    return tf.SparseTensor(value.indices, tf.ones_like(value.values, tf.float32), value.dense_shape)


def _step_input(case: Case, per_chip):
    """The step in the chip format the case asks for (records go through the real shard bytes)."""
    if case.chip_format == "csr_batch":
        return per_chip
    if case.chip_format == "dequeue_inputs":
        return [{s: b.to_partitioned_csr() for s, b in chip.items()} for chip in per_chip]
    if case.chip_format == "prefixes":
        return [{s: {**b.prefixes(), "row_pointers_unpadded_size": b.row_pointers_unpadded_size,
                     "ids_unpadded_size": b.ids_unpadded_size, "sample_count": b.sample_count}
                 for s, b in chip.items()} for chip in per_chip]
    topo = case.topology
    cph = topo.chips_per_host
    fmt = ShardFormat(topo.num_hosts, cph, case.model.per_chip_batch * cph, (), (),
                      tuple((s, b.row_pointers_buffer_size, b.ids_buffer_size) for s, b in per_chip[0].items()))
    records = []
    for h in range(topo.num_hosts):
        hb = fmt.host_batch_size
        data = shard_records.encode_step_record(step=0, host=h, label=np.zeros(hb), mask=np.ones(hb),
                                                dense=np.zeros((hb, 0)), tensor_core={},
                                                chips=per_chip[h * cph:(h + 1) * cph])
        records.append(shard_records.decode_record(data, fmt))
    return records


def _sparse_global(f: Feat):
    lengths = [len(r) for r in f.ids]
    idx = [[i, j] for i, k in enumerate(lengths) for j in range(k)]
    idx = np.array(idx, np.int64).reshape(-1, 2)
    shape = [len(f.ids), max(1, max(lengths, default=0))]
    ids = tf.SparseTensor(idx, np.array([i for r in f.ids for i in r], np.int64), shape)
    w = None
    if f.weights:
        w = tf.SparseTensor(idx, np.array([x for r in f.weights for x in r], np.float32), shape)
    return ids, w


def _reference(f: Feat, table, chips: int):
    """safe_embedding_lookup_sparse over the global batch (per position for a sequence feature)."""
    ids, w = _sparse_global(f)
    out = tf.nn.safe_embedding_lookup_sparse(table, ids, w, combiner=f.config.table.combiner)
    shape = (chips * f.config.output_shape[0],) + f.config.output_shape[1:] + (f.config.table.dim,)
    return tf.reshape(out, shape)


STATS: Dict[str, float] = {"examples": 0, "act_abs": 0.0, "act_rel": 0.0, "grad_abs": 0.0, "grad_rel": 0.0}


def _diff(a, b, key):
    """Largest |a - b|, and largest |a - b| relative to the largest |b| of the tensor."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.size == 0:
        return
    d = np.abs(a - b)
    STATS[key + "_abs"] = max(STATS[key + "_abs"], float(d.max()))
    STATS[key + "_rel"] = max(STATS[key + "_rel"], float(d.max() / max(np.abs(b).max(), 1e-30)))


def _events(case: Case):
    layout = layout_of(case.model)
    for st_layout in layout.stacks.values():
        if len(st_layout.tables) > 1:
            event("a stack with several tables")
            if any(layout.tables[t].rotation for t in st_layout.tables):
                event("a stack with rotated tables")
    for f in case.feats:
        event(f"input {f.kind}")
        event("sequence feature" if len(f.config.output_shape) == 2 else "bag feature")
        event(f"combiner {f.config.table.combiner}" + (" weighted" if f.weights else ""))
    if len({f.config.table.name for f in case.feats}) < len(case.feats):
        event("a table shared by several features")
    event(f"chips x SCs = {case.topology.num_chips} x {case.topology.num_sc_per_chip}, "
          f"hosts {case.topology.num_hosts}")
    event(f"chips given as {case.chip_format}")


@pytest.fixture(scope="module", autouse=True)
def _write_stats():
    yield
    path = os.environ.get("HOST_EMBEDDING_STATS")
    if path and STATS["examples"]:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(STATS) + "\n")


@settings(max_examples=200)
@given(case=cases())
def test_activations_and_gradients_equal_tensorflow_on_raw_ids(case):
    _events(case)
    per_chip = _csr_per_chip(case)
    emb = HostEmbedding(case.model, seed=case.seed)
    activations, preserved = emb.dequeue(_step_input(case, per_chip))
    chips = case.topology.num_chips
    rng = np.random.default_rng(case.seed)
    upstream, ref_vars = {}, {}
    for f in case.feats:
        name = f.config.name
        ref = _reference(f, emb.tables[f.config.table.name], chips)
        np.testing.assert_allclose(activations[name].numpy(), ref.numpy(), rtol=1e-5, atol=2e-6, err_msg=name)
        _diff(activations[name], ref, "act")
        upstream[name] = tf.constant(rng.normal(size=ref.shape).astype(np.float32))
    # Gradients: tape through the reference lookup, densified, summed over features and chips.
    for t in case.model.tables:
        ref_vars[t.name] = tf.Variable(emb.tables[t.name].read_value())
    with tf.GradientTape() as tape:
        loss = tf.add_n([tf.reduce_sum(upstream[f.config.name] * _reference(f, ref_vars[f.config.table.name], chips))
                         for f in case.feats])
    expected = dict(zip(ref_vars, tape.gradient(loss, list(ref_vars.values())), strict=True))
    ours = emb.sparse_gradients(upstream, preserved)
    assert set(ours) == set(expected)
    for t, g in ours.items():
        want = tf.convert_to_tensor(expected[t]) if expected[t] is not None else tf.zeros_like(ref_vars[t])
        got = tf.convert_to_tensor(g)
        # float32 sums of upstream terms: the rounding error scales with the terms' magnitude, so an entry
        # that cancels to ~0 may differ by ~eps * n * max|term| (CI found 1.2e-5 beside entries of 31).
        scale = max(1.0, float(np.abs(want.numpy()).max())) if want.shape.num_elements() else 1.0
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5 * scale, err_msg=t)
        _diff(got, want, "grad")
    STATS["examples"] += 1


# ---------------------------------------------------------------- the layout inversion itself

@pytest.mark.parametrize("S", [1, 2, 4, 8, 16])
def test_inverse_of_the_column_rewrite(S):
    """id -> (dest, token) by TF's rewrite, and back by the formula HostEmbedding uses."""
    log2 = S.bit_length() - 1
    for rotation in range(S):
        for row_offset in (0, 3, 17):
            ids = np.arange(64 * S)
            col = ((ids + rotation) & (S - 1)) + (ids & ~(S - 1)) + row_offset * S
            dest, token = col & (S - 1), col >> log2
            back = (token - row_offset) * S + (dest - rotation) % S
            np.testing.assert_array_equal(back, ids)


def _small_model(chips=2, nsc=2, hosts=1):
    a = TableConfig("a", 37, 8, "mean", ADAGRAD)
    b = TableConfig("b", 11, 4, "sum", ADAGRAD)  # stacks with a (same padded width and optimizer)
    feats = (FeatureConfig("x", a, (4,)), FeatureConfig("y", b, (4,)), FeatureConfig("z", a, (4, 2), 2))
    return ModelConfig(feats, Topology(chips, nsc, hosts))


def _small_batch(model, rng):
    x, y, z = (f.name for f in model.features)
    out = []
    for _ in range(model.topology.num_chips):
        out.append(preprocess({
            x: RaggedIds(rng.integers(0, 37, 6), np.array([0, 1, 3, 3, 6])),
            y: rng.integers(0, 11, 4),
            z: rng.integers(0, 37, (4, 2))}, model, model.topology))
    return out


def test_small_model_stacks_tables_and_rotates():
    layout = layout_of(_small_model())
    assert list(layout.stacks) == ["a_b"]
    assert {t.rotation for t in layout.tables.values()} == {0, 2}


def test_bad_inputs_are_named():
    model = _small_model()
    emb = HostEmbedding(model)
    chips = _small_batch(model, np.random.default_rng(0))
    with pytest.raises(ValueError, match="stacks"):
        emb.prepare([{"other": chips[0]["a_b"]}])
    corrupt = chips[0]["a_b"].prefixes()
    corrupt = {**corrupt, "sorted_token_ids": corrupt["sorted_token_ids"] + 1000,
               "row_pointers_unpadded_size": chips[0]["a_b"].row_pointers_unpadded_size,
               "ids_unpadded_size": chips[0]["a_b"].ids_unpadded_size}
    with pytest.raises(ValueError, match="in no table"):
        emb.prepare([{"a_b": corrupt}])
    other = _small_model(chips=4)  # made for another topology: row pointer block size differs
    with pytest.raises(ValueError, match="topology|sample_count|in no table"):
        HostEmbedding(other).prepare([chips[0]])
    with pytest.raises(ValueError, match="dequeue first"):
        emb.apply_gradients({"x": None, "y": None, "z": None})
    acts, _ = emb.dequeue(chips)
    with pytest.raises(ValueError, match=r"missing"):
        emb.apply_gradients({"x": acts["x"]})
    with pytest.raises(ValueError, match="shape"):
        emb.apply_gradients({"x": acts["y"], "y": acts["y"], "z": acts["z"]})


def test_tf_feature_config_nest_in_and_out():
    model = _small_model()
    tf_fc = to_tf_feature_config(model)
    fc = {"outer": {"x": tf_fc["x"], "y": tf_fc["y"]}, "z": tf_fc["z"]}
    renamed = ModelConfig(tuple(dataclasses.replace(f, name=p) for f, p in
                                zip(model.features, ["outer/x", "outer/y", "z"], strict=True)), model.topology)
    chips = _small_batch(renamed, np.random.default_rng(1))
    emb = HostEmbedding(fc, topology=model.topology)
    acts, pres = emb.dequeue(chips)
    assert set(acts) == {"outer", "z"} and set(acts["outer"]) == {"x", "y"}
    flat = HostEmbedding(renamed)
    for t in flat.model.tables:  # same tables, so the same activations
        flat.tables[t.name].assign(emb.tables[t.name])
    ref, _ = flat.dequeue(chips)
    np.testing.assert_array_equal(acts["outer"]["x"].numpy(), ref["outer/x"].numpy())
    emb.apply_gradients(tf.nest.map_structure(tf.ones_like, acts), pres)
    assert int(emb.iterations.numpy()) == 1


# ---------------------------------------------------------------- tensor-core features

def test_tensor_core_features_dense_lookup_with_combiner():
    model = _small_model(chips=2, nsc=2, hosts=2)
    tc_table = TableConfig("tc", 9, 4, "sqrtn", SGD)
    tc_feat = FeatureConfig("tc_f", tc_table, (4,))
    emb = HostEmbedding(model, tensor_core_features=[tc_feat])
    rng = np.random.default_rng(3)
    chips = _small_batch(model, rng)
    lengths = [np.array([2, 0, 1, 3]), np.array([1, 1, 0, 2])]
    ids = [rng.integers(0, 9, int(x.sum())) for x in lengths]
    ws = [rng.uniform(0.5, 2, int(x.sum())).astype(np.float32) for x in lengths]
    records = [{"host": h, "sparse_core": [chips[h]],
                "tensor_core": {"tc_f": {"lengths": lengths[h], "ids": ids[h], "weights": ws[h]}}}
               for h in range(2)]
    acts, pres = emb.dequeue(records)
    all_len = np.concatenate(lengths)
    idx = np.array([[i, j] for i, k in enumerate(all_len) for j in range(k)], np.int64)
    sp = tf.SparseTensor(idx, np.concatenate(ids), [8, 3])
    sw = tf.SparseTensor(idx, np.concatenate(ws), [8, 3])
    ref = tf.nn.safe_embedding_lookup_sparse(emb.tables["tc"], sp, sw, combiner="sqrtn")
    np.testing.assert_allclose(acts["tc_f"].numpy(), ref.numpy(), rtol=1e-6, atol=1e-6)
    # input_fn's form: a RaggedTensor and "<name>/weights".
    splits = np.concatenate([[0], np.cumsum(all_len)])
    tc_ragged = {"tc_f": tf.RaggedTensor.from_row_splits(np.concatenate(ids), splits),
                 "tc_f/weights": tf.RaggedTensor.from_row_splits(np.concatenate(ws), splits)}
    acts2, _ = emb.dequeue(chips, tensor_core=tc_ragged)
    np.testing.assert_allclose(acts2["tc_f"].numpy(), acts["tc_f"].numpy(), rtol=1e-7)
    # Gradients of the dense lookup, and an SGD step on the tensor-core table.
    g = tf.constant(rng.normal(size=(8, 4)).astype(np.float32))
    var = tf.Variable(emb.tables["tc"].read_value())
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(g * tf.nn.safe_embedding_lookup_sparse(var, sp, sw, combiner="sqrtn"))
    want = tf.convert_to_tensor(tape.gradient(loss, var))
    grads = {"x": None, "y": None, "z": None, "tc_f": g}
    got = tf.convert_to_tensor(emb.sparse_gradients(grads, pres)["tc"])
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    before = emb.tables["tc"].numpy()
    emb.apply_gradients(grads, pres)
    np.testing.assert_allclose(emb.tables["tc"].numpy(), before - 0.1 * want.numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="tensor-core"):
        emb.prepare(chips)


# ---------------------------------------------------------------- checkpoints and serving

def _train_a_step(emb, chips):
    acts, pres = emb.dequeue(chips)
    emb.apply_gradients({k: tf.ones_like(v) * 0.3 for k, v in acts.items()}, pres)


def test_checkpoint_round_trip(tmp_path):
    adam = OptimizerConfig.from_dict({"optimizer": "adam", "learning_rate": 0.01})
    ftrl = OptimizerConfig.from_dict({"optimizer": "ftrl", "learning_rate": 0.05})
    a, b = TableConfig("a", 30, 8, "mean", adam), TableConfig("b", 20, 4, "sum", ftrl)
    model = ModelConfig((FeatureConfig("x", a, (4,)), FeatureConfig("y", b, (4,))), Topology(1, 2))
    rng = np.random.default_rng(5)
    chips = [preprocess({"x": rng.integers(0, 30, 4), "y": rng.integers(0, 20, 4)}, model, model.topology)]
    emb = HostEmbedding(model, seed=1)
    _train_a_step(emb, chips)
    path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / "ckpt"))
    names = {n for n, _ in tf.train.list_variables(path)}
    assert {"embedding/tables/a/.ATTRIBUTES/VARIABLE_VALUE", "embedding/slots/a/momenta/.ATTRIBUTES/VARIABLE_VALUE",
            "embedding/slots/b/linears/.ATTRIBUTES/VARIABLE_VALUE"} <= names
    fresh = HostEmbedding(model, seed=2)
    fresh.build()
    assert not np.array_equal(fresh.tables["a"].numpy(), emb.tables["a"].numpy())
    tf.train.Checkpoint(embedding=fresh).restore(path).assert_consumed()
    late = HostEmbedding(model, seed=3)  # restored before its variables exist: deferred restore
    tf.train.Checkpoint(embedding=late).restore(path)
    late.build()
    for other in (fresh, late):
        for name, group in emb.variables_by_table.items():
            for slot, var in group.items():
                np.testing.assert_array_equal(other.variables_by_table[name][slot].numpy(), var.numpy())
        assert int(other.iterations.numpy()) == 1
    # Training continues identically from the restored state.
    _train_a_step(emb, chips)
    _train_a_step(fresh, chips)
    np.testing.assert_array_equal(fresh.tables["b"].numpy(), emb.tables["b"].numpy())


def test_initialisation_is_deterministic_and_mirrors_tf_default():
    model = ModelConfig((FeatureConfig("x", TableConfig("big", 4000, 16, "sum", SGD), (4,)),), Topology(1))
    one, two, other = HostEmbedding(model, seed=7), HostEmbedding(model, seed=7), HostEmbedding(model, seed=8)
    for e in (one, two, other):
        e.build()
    t = one.tables["big"].numpy()
    np.testing.assert_array_equal(t, two.tables["big"].numpy())
    assert not np.array_equal(t, other.tables["big"].numpy())
    stddev = 1 / np.sqrt(16)
    assert np.abs(t).max() <= 2 * stddev + 1e-6 and 0.75 * stddev < t.std() < 0.95 * stddev
    custom = HostEmbedding(model, initializers={"big": tf.constant_initializer(0.5)})
    custom.build()
    assert np.all(custom.tables["big"].numpy() == 0.5)


def test_serving_export_gives_identical_lookups():
    ada = OptimizerConfig.from_dict({"optimizer": "adagrad", "learning_rate": 0.5})
    a, b = TableConfig("a", 50, 8, "mean", ada), TableConfig("b", 23, 12, "sqrtn", ada)
    feats = (FeatureConfig("bag", a, (4,)), FeatureConfig("seq", a, (4, 3), 3), FeatureConfig("w", b, (4,)))
    model = ModelConfig(feats, Topology(1, 2))
    rng = np.random.default_rng(11)
    bag_splits = np.array([0, 2, 2, 5, 6])
    bag = rng.integers(0, 50, 6)
    seq_len = np.array([3, 1, 0, 2])
    seq = rng.integers(0, 50, int(seq_len.sum()))
    w_splits = np.array([0, 1, 4, 4, 6])
    w_ids, w_w = rng.integers(0, 23, 6), rng.uniform(0.2, 2, 6).astype(np.float32)
    # The CSR input: one id per sequence position (the position's sample), empty positions empty.
    seq_samples = np.zeros(12, np.int64)
    pos_splits = [0]
    k = 0
    for ex, n in enumerate(seq_len):
        for p in range(3):
            if p < n:
                seq_samples[k] = seq[int(seq_len[:ex].sum()) + p]
                k += 1
            pos_splits.append(k)
    chips = [preprocess({"bag": RaggedIds(bag, bag_splits), "seq": RaggedIds(seq_samples[:k], np.array(pos_splits)),
                         "w": RaggedIds(w_ids, w_splits)}, model, model.topology,
                        weights={"bag": RaggedIds(np.ones(6, np.float32), bag_splits),
                                 "seq": RaggedIds(np.ones(k, np.float32), np.array(pos_splits)),
                                 "w": RaggedIds(w_w, w_splits)})]
    emb = HostEmbedding(model, seed=4)
    _train_a_step(emb, chips)  # trained tables, not the initial ones
    ours = emb.lookup(chips)
    serving = emb.to_serving()
    theirs = serving.embedding_lookup(
        {"bag": tf.RaggedTensor.from_row_splits(bag, bag_splits),
         "seq": tf.RaggedTensor.from_row_lengths(seq, seq_len),
         "w": tf.RaggedTensor.from_row_splits(w_ids, w_splits)},
        {"bag": None, "seq": None, "w": tf.RaggedTensor.from_row_splits(w_w, w_splits)})
    for name in ("bag", "seq", "w"):
        np.testing.assert_allclose(ours[name].numpy(), theirs[name].numpy(), rtol=1e-6, atol=1e-6, err_msg=name)


def test_exported_from_the_package():
    assert tpu_embed.HostEmbedding is HostEmbedding


# ---------------------------------------------------------------- the two example specs, end to end

EXAMPLES = os.path.join(ROOT, "examples")


@pytest.fixture(scope="module")
def example_artifacts(tmp_path_factory):
    from tests.helpers import jobs
    from tpu_embed.artifact.spec import load_spec
    out = {}
    for name in ("criteo", "movielens"):
        d = str(tmp_path_factory.mktemp(name))
        spec = load_spec(os.path.join(EXAMPLES, name, "spec.yaml"))
        jobs.run(spec, d)
        out[name] = (spec, d)
    return out


def _raw_input(spec, f, rows, vocabs):
    """A DenseFeatures input for one column: raw tokens (frequency vocabularies) or ids, as a SparseTensor."""
    lists = []
    for row in rows:
        if row is None:
            lists.append([])
        elif f.vocabulary.type == "frequency":
            lists.append(raw_values(f, row))
        else:
            lists.append(plain_ids(spec, f, row, vocabs))
    idx = np.array([[i, j] for i, v in enumerate(lists) for j in range(len(v))], np.int64).reshape(-1, 2)
    values = [x for v in lists for x in v]
    dtype = tf.string if f.vocabulary.type == "frequency" else tf.int64
    return tf.SparseTensor(idx, tf.constant(values, dtype), [len(lists), max(1, max(map(len, lists)))])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["criteo", "movielens"])
def test_example_specs_every_record_equals_raw_rows(example_artifacts, name):
    """Every step of every host: HostEmbedding on the shards == TF lookups on the raw CSV rows.

    Two references: `safe_embedding_lookup_sparse` on the rows mapped to ids by
    plain Python (the e2e test's mapper), and `tf_keras.layers.DenseFeatures`
    on the seed-API columns of the spec (`compat.from_spec.feature_columns`) fed the
    raw tokens, with each column's table set to HostEmbedding's.
    """
    import tf_keras
    spec, d = example_artifacts[name]
    with open(os.path.join(d, "manifest.json"), encoding="utf-8") as fh:
        manifest = json.load(fh)
    emb = HostEmbedding.from_artifact(d, seed=5)
    assert set(emb.tensor_core_features) == {f.name for f in spec.tensor_core_features}
    fmt = ShardFormat.from_json(manifest["shards"]["format"])
    per_host = [[shard_records.decode_record(r, fmt) for p in shard_records.shard_files(d, h)
                 for r in tfrecord.read_records(p)] for h in range(spec.topology.num_hosts)]
    vocabs = {k: plain_vocabulary(spec, k) for k in spec.vocabulary_groups()}
    rows = raw_rows(spec)
    B = spec.global_batch_size
    vocab_sizes = {k: int(v["size"]) for k, v in manifest["vocabularies"].items()}
    columns = dict(zip((f.name for f in spec.categorical),
                       feature_columns(spec, os.path.join(d, "vocab"), vocab_sizes), strict=True))
    layers = {n: tf_keras.layers.DenseFeatures([c]) for n, c in columns.items()}
    steps = 0
    for step, records in enumerate(zip(*per_host, strict=True)):
        acts, _ = emb.dequeue(list(records))
        batch = [rows[step * B + i] if step * B + i < len(rows) else None for i in range(B)]
        for f in spec.categorical:
            table = emb.tables[f.table]
            ids = [plain_ids(spec, f, r, vocabs) if r is not None else [] for r in batch]
            if not f.on_sparse_core:
                ids = [i[:f.tensor_core_width] for i in ids]
            idx = np.array([[i, j] for i, v in enumerate(ids) for j in range(len(v))], np.int64).reshape(-1, 2)
            sp = tf.SparseTensor(idx, np.array([x for v in ids for x in v], np.int64),
                                 [B, max(1, max(map(len, ids)))])
            ref = tf.nn.safe_embedding_lookup_sparse(table, sp, None, combiner=spec.table(f.table).combiner)
            np.testing.assert_allclose(acts[f.name].numpy(), ref.numpy(), rtol=1e-6, atol=1e-6,
                                       err_msg=f"{name} step {step} {f.name}")
            layer = layers[f.name]
            inputs = {f.name: _raw_input(spec, f, batch, vocabs)}
            if not layer.built:
                layer(inputs)
                [var] = layer.variables
                assert tuple(var.shape) == tuple(table.shape)
                var.assign(table)
            np.testing.assert_allclose(acts[f.name].numpy(), layer(inputs).numpy(), rtol=1e-6, atol=1e-6,
                                       err_msg=f"{name} step {step} {f.name} (DenseFeatures)")
        steps += 1
    assert steps == manifest["shards"]["steps"]
    if name == "movielens":  # input_fn's tensors give the same activations as the numpy decoder
        elements = [list(input_fn(d, host_index=h)) for h in range(spec.topology.num_hosts)]
        for h_elements, records in zip(zip(*elements, strict=True), zip(*per_host, strict=True), strict=True):
            a, _ = emb.dequeue(list(h_elements))
            b, _ = emb.dequeue(list(records))
            for k in b:
                np.testing.assert_array_equal(a[k].numpy(), b[k].numpy())


# ---------------------------------------------------------------- the compiled step

def _eager_reference(emb, step, upstream):
    """The per-feature eager formulas (the uncompiled lookup and sparse gradients), from the step's index."""
    acts, grads = {}, {}
    for name, fl in step.features.items():
        table = emb.tables[fl.table]
        dim = int(table.shape[1])
        acts[name] = tf.reshape(tf.math.unsorted_segment_sum(tf.gather(table, fl.ids) * fl.gains[:, None], fl.rows,
                                                             fl.num_rows), fl.shape + (dim,))
    for table, feats in step.table_features.items():
        dim = int(emb.tables[table].shape[1])
        parts = [tf.gather(tf.reshape(tf.constant(upstream[n]), (-1, dim)), step.features[n].rows)
                 * step.features[n].gains[:, None] for n in feats]
        unique, inverse = step.tables[table]
        grads[table] = (unique, tf.math.unsorted_segment_sum(tf.concat(parts, 0), inverse, unique.size))
    return acts, grads


def test_compiled_lookup_and_gradients_are_bit_identical_to_the_eager_formulas():
    model = _small_model(chips=4, nsc=2, hosts=2)
    emb = HostEmbedding(model, seed=2)
    rng = np.random.default_rng(21)
    for _ in range(2):  # a second step reuses the compiled functions
        chips = _small_batch(model, rng)
        acts, step = emb.dequeue(chips)
        upstream = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in acts.items()}
        want_acts, want_grads = _eager_reference(emb, step, upstream)
        for name in acts:
            np.testing.assert_array_equal(acts[name].numpy(), want_acts[name].numpy(), err_msg=name)
        got = emb.sparse_gradients(upstream, step)
        for table, (unique, values) in want_grads.items():
            np.testing.assert_array_equal(got[table].indices.numpy(), unique)
            np.testing.assert_array_equal(got[table].values.numpy(), values.numpy(), err_msg=table)
        # Adagrad / SGD through the fused kernels: the same float32 operations as the rule.
        before = {t: emb.tables[t].numpy() for t in ("a", "b")}
        acc = {t: emb.slots[t]["accumulators"].numpy() for t in ("a", "b")}
        emb.apply_gradients(upstream, step)
        for table, (unique, values) in want_grads.items():
            g = values.numpy()
            a = acc[table][unique] + g * g
            w = before[table][unique] - np.float32(0.1) * g / np.sqrt(a)
            np.testing.assert_array_equal(emb.slots[table]["accumulators"].numpy()[unique], a)
            np.testing.assert_allclose(emb.tables[table].numpy()[unique], w, rtol=1e-6, atol=1e-7)


def test_prepare_ahead_gives_prepares_index_in_order():
    model = _small_model()
    emb = HostEmbedding(model)
    rng = np.random.default_rng(8)
    steps = [_small_batch(model, rng) for _ in range(4)]
    got = list(emb.prepare_ahead(iter(steps), depth=2))
    assert [s for s, _ in got] == steps
    for chips, (_, lookup) in zip(steps, got, strict=True):
        want = emb.prepare(chips)
        for name, fl in want.features.items():
            for field in ("rows", "ids", "gains"):
                np.testing.assert_array_equal(getattr(lookup.features[name], field), getattr(fl, field))
    bad = [steps[0], [{"other": steps[0][0]["a_b"]}]]
    it = emb.prepare_ahead(bad)
    next(it)
    with pytest.raises(ValueError, match="stacks"):
        next(it)


def _dense_model(seed):
    import tf_keras as keras
    return keras.Sequential([keras.layers.Dense(3, activation="relu"), keras.layers.Dense(1)], name=f"top{seed}")


def _dense_forward(model):
    def forward(acts, batch):
        x = tf.concat([acts["x"], acts["y"], tf.reshape(acts["z"], (acts["z"].shape[0], -1)), batch["dense"]], 1)
        return model(x)[:, 0]
    return forward


def _loss(batch, logits):
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"], logits=logits))


@pytest.mark.parametrize("pipelining", [False, True])
def test_train_step_equals_the_eager_loop(pipelining):
    import tf_keras as keras
    model = _small_model(chips=2, nsc=2)
    rng = np.random.default_rng(17)
    records = []
    for step in range(4):
        records.append({"step": step, "sparse_core": _small_batch(model, rng),
                        "dense": rng.normal(size=(8, 2)).astype(np.float32),
                        "label": rng.integers(0, 2, 8).astype(np.float32)})
    runs = []
    for compiled in (False, True):
        emb = HostEmbedding(model, seed=6, pipeline_execution_with_tensor_core=pipelining)
        top = _dense_model(0)
        top.build((None, 8 + 4 + 16 + 2))
        top.set_weights([np.random.default_rng(i).normal(size=w.shape).astype(np.float32) * 0.3
                         for i, w in enumerate(top.get_weights())])
        opt = keras.optimizers.SGD(learning_rate=0.2)
        forward = _dense_forward(top)
        losses = []
        if compiled:
            step_fn = emb.train_step(forward, _loss, opt)
            for record, prepared in emb.prepare_ahead(records):
                losses.append(float(step_fn(record, prepared)))
        else:
            for record in records:
                acts, preserved = emb.dequeue(record)
                with tf.GradientTape() as tape:
                    tape.watch(acts)
                    loss = _loss(record, forward(acts, record))
                grads, act_grads = tape.gradient(loss, (top.trainable_variables, acts))
                opt.apply_gradients(zip(grads, top.trainable_variables))
                emb.apply_gradients(act_grads, preserved)
                losses.append(float(loss))
        assert emb.has_pending_update == pipelining
        assert int(emb.iterations.numpy()) == len(records)
        emb.flush()
        runs.append((losses, {t: (emb.tables[t].numpy(), emb.slots[t]["accumulators"].numpy()) for t in ("a", "b")},
                     [w.numpy() for w in top.trainable_variables]))
    (l0, t0, w0), (l1, t1, w1) = runs
    np.testing.assert_allclose(l1, l0, rtol=1e-6)
    for t in t0:
        for got, want in zip(t1[t], t0[t], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=t)
    for got, want in zip(w1, w0, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
