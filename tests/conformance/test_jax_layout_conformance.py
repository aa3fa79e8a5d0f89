"""jax-tpu-embedding's SparseCore layout (tpu_embed.jax) against the installed jax-tpu-embedding 0.2.0 on CPU.

The oracle (jax_layout_server.py, in .venv-jax) stacks and preprocesses each case with jax's own code;
we compare its stacking, its statistics and its four arrays per stack bit for bit (gains as raw bits),
for hypothesis-generated models and for every step of the example specs' shards.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conformance.jax_examples import example_artifact, oracle_request
from tests.conformance.jax_oracle import JaxOracle
from tpu_embed.core.model import FeatureConfig, ModelConfig, OptimizerConfig, TableConfig
from tpu_embed.core.topology import Topology
from tpu_embed.jax import layout as J

pytestmark = pytest.mark.conformance

SERVER = Path(__file__).with_name("jax_layout_server.py")


@pytest.fixture(scope="module")
def jax_oracle():
    o = JaxOracle(SERVER, name="jax-layout-oracle")
    yield o
    o.close()


# ------------------------------------------------------------------ cases

@st.composite
def jax_cases(draw, max_devices=8):
    nsc = draw(st.sampled_from([4, 2]))
    devices = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= max_devices]))
    hosts = draw(st.sampled_from([h for h in (1, 2) if devices % h == 0]))
    per_chip = nsc * draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    n_tables = draw(st.integers(1, 4))
    tables = []
    for i in range(n_tables):
        tables.append({"name": f"t{i}" + draw(st.sampled_from(["", "_a", "_long_table_name_to_make_stack_names_long"])),
                       "vocabulary_size": draw(st.one_of(st.integers(1, 40), st.integers(40, 3000))),
                       "dim": draw(st.sampled_from([4, 8, 12, 16, 64])),
                       "combiner": draw(st.sampled_from(["sum", "mean", "sqrtn"])),
                       "optimizer": draw(st.sampled_from([("sgd", 0.1), ("sgd", 0.1), ("sgd", 0.5),
                                                          ("adagrad", 0.1)]))})
    n_features = draw(st.integers(1, 5))
    weighted = draw(st.booleans())
    tiny = weighted and draw(st.booleans())  # weights near and below float32's smallest normal, 2**-126
    steps = draw(st.integers(1, 2))
    features, dense = [], []
    for j in range(n_features):
        t = tables[draw(st.integers(0, n_tables - 1))]
        mult = draw(st.sampled_from([1, 1, 2]))  # a feature with more samples (a sequence's positions)
        features.append({"name": f"f{j:02d}", "table": t["name"], "samples": per_chip * mult * devices,
                         "per_chip": per_chip * mult, "max_len": draw(st.sampled_from([1, 1, 3, 6])),
                         "skew": draw(st.booleans()), "weighted": weighted and draw(st.booleans())})
        if features[-1]["max_len"] == 1 and draw(st.booleans()):
            dense.append(f"f{j:02d}")
    by_name = {t["name"]: t for t in tables}
    data = []
    for _ in range(steps):
        hosts_data = []
        for _h in range(hosts):
            host = {}
            for f in features:
                n = f["samples"] // hosts
                vocab = by_name[f["table"]]["vocabulary_size"]
                per = np.ones(n, np.int64) if f["name"] in dense else rng.integers(0, f["max_len"] + 1, size=n)
                splits = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
                hot = min(vocab, 5)
                ids = rng.integers(0, hot if f["skew"] else vocab, size=int(splits[-1])).astype(np.int64)
                w = None
                if f["weighted"]:
                    w = rng.uniform(-2, 2, size=ids.size).astype(np.float32)
                    w[rng.random(ids.size) < 0.1] = 0.0
                    if tiny:
                        w = np.where(rng.random(ids.size) < 0.4, tiny_weights(rng, ids.size), w).astype(np.float32)
                host[f["name"]] = (splits, ids, w)
            hosts_data.append(host)
        data.append(hosts_data)
    return {"tables": tables, "features": features, "num_devices": devices, "num_sc_per_device": nsc,
            "num_hosts": hosts, "dense": dense, "steps": data,
            "has_leading_dimension": draw(st.booleans())}


def tiny_weights(rng, n: int) -> np.ndarray:
    """float32 weights of either sign where jax's flushing of denormals shows: subnormals; normals within 4x of
    2**-126 (quotients and sums of them fall below it); ~1e-20 (their squares underflow float32)."""
    kind = rng.integers(0, 3, n)
    mag = np.where(kind == 0, rng.uniform(0, 1, n) * 2.0 ** -126,
                   np.where(kind == 1, rng.uniform(1, 4, n) * 2.0 ** -126, rng.uniform(0.5, 2, n) * 1e-20))
    return (mag * rng.choice([-1.0, 1.0], n)).astype(np.float32)


def model_of(case) -> ModelConfig:
    tables = {t["name"]: TableConfig(t["name"], t["vocabulary_size"], t["dim"], t["combiner"],
                                     OptimizerConfig.from_dict({"optimizer": t["optimizer"][0],
                                                                "learning_rate": t["optimizer"][1]}))
              for t in case["tables"]}
    feats = tuple(FeatureConfig(f["name"], tables[f["table"]], (f["per_chip"],)) for f in case["features"])
    return ModelConfig(feats, Topology(case["num_devices"], case["num_sc_per_device"], case["num_hosts"]))


def request_of(case) -> dict:
    return {"tables": case["tables"], "features": [{k: f[k] for k in ("name", "table", "samples")}
                                                   for f in case["features"]],
            "num_devices": case["num_devices"], "num_sc_per_device": case["num_sc_per_device"],
            "num_hosts": case["num_hosts"], "dense": case["dense"], "steps": case["steps"],
            "has_leading_dimension": case["has_leading_dimension"]}


def assert_matches(jl: J.JaxLayout, ours: dict, theirs: dict, buffer_size: int, lead: bool, where: str) -> None:
    """Our batch of one stack against jax's arrays: row pointers whole, COO buffers where jax writes them."""
    rp, eid, sid, g = ours.buffers(buffer_size, has_leading_dimension=lead)
    assert rp.shape == theirs["row_pointers"].shape and rp.dtype == theirs["row_pointers"].dtype, where
    for a, name in ((eid, "embedding_ids"), (sid, "sample_ids"), (g, "gains")):
        assert a.shape == theirs[name].shape and a.dtype == theirs[name].dtype, (where, name)
    np.testing.assert_array_equal(rp, theirs["row_pointers"], err_msg=where)
    L, nsc = ours.segment_sizes.shape
    per_sc = buffer_size // nsc
    for name, a in (("embedding_ids", eid), ("sample_ids", sid), ("gains", g)):
        mine = a.reshape(L * nsc, per_sc).view(np.int32)
        them = np.asarray(theirs[name]).reshape(L * nsc, per_sc).view(np.int32)
        for k, n in enumerate(ours.segment_sizes.reshape(-1)):
            np.testing.assert_array_equal(mine[k, :n], them[k, :n], err_msg=f"{where} {name} segment {k}")
    np.testing.assert_array_equal(ours.max_ids_per_partition, theirs["max_ids_per_partition"], err_msg=where)
    np.testing.assert_array_equal(ours.max_unique_ids_per_partition, theirs["max_unique_ids_per_partition"],
                                  err_msg=where)
    np.testing.assert_array_equal(ours.required_buffer_size, theirs["required_buffer_size"], err_msg=where)
    assert theirs["dropped_ids"] == 0 and np.all(np.asarray(theirs["num_minibatches"]) == 1)


def compare_case(case, oracle) -> dict:
    jl = J.jax_layout(model_of(case))
    got = oracle(request_of(case))
    assert "error" not in got, got
    # Stacking: every feature's stack and id transformation.
    for st_ in jl.stacks:
        for f in st_.features:
            t = got["features"][f.name]
            assert (st_.name, f.row_offset, f.col_offset, f.col_shift) == (
                t["stack"], t["row_offset"], t["col_offset"], t["col_shift"]), f.name
    assert sorted(s.name for s in jl.stacks) == sorted(got["stacks"])
    for i, step in enumerate(case["steps"]):
        for h, host in enumerate(step):
            feats = {n: J.HostFeature(*v) for n, v in host.items()}
            ours = J.pack_host(jl, feats)
            for name, theirs in got["steps"][i][h].items():
                info = got["stacks"][name]
                assert ours[name].required_buffer_size_per_device <= info["coo_buffer_size_per_device"]
                assert_matches(jl, ours[name], theirs, info["coo_buffer_size_per_device"],
                               case["has_leading_dimension"], f"step {i} host {h} stack {name}")
    return got


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=jax_cases())
def test_layout_matches_jax(case, jax_oracle):
    compare_case(case, jax_oracle)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=jax_cases(max_devices=4))
def test_reference_matches_fast_path(case):
    jl = J.jax_layout(model_of(case))
    for step in case["steps"]:
        for host in step:
            feats = {n: J.HostFeature(*v) for n, v in host.items()}
            a, b = J.pack_host(jl, feats), J.pack_host_reference(jl, feats)
            for name in a:
                for field in ("row_pointers", "embedding_ids", "sample_ids", "segment_sizes", "max_ids_per_partition",
                              "max_unique_ids_per_partition", "required_buffer_size"):
                    np.testing.assert_array_equal(getattr(a[name], field), getattr(b[name], field), err_msg=field)
                np.testing.assert_array_equal(a[name].gains.view(np.int32), b[name].gains.view(np.int32))


# ------------------------------------------------------------------ the example specs' shards

@pytest.mark.parametrize("name", ["criteo", "movielens"])
@pytest.mark.parametrize("lead", [False, True])
def test_example_shards_decode_to_jax_preprocessing(tmp_path, jax_oracle, name, lead):
    """decode_step of every step record of an example spec's shards == jax's own preprocessing of that
    step's global batch (its stacking of the spec's model, its limits from its own statistics)."""
    from tpu_embed.artifact import shard_records, tfrecord
    from tpu_embed.artifact.manifest import read_manifest
    from tpu_embed.jax import records as R

    spec, out, sizes, steps = example_artifact(tmp_path, name)
    m = read_manifest(out)
    fmt = m.shard_format
    assert fmt.layouts == ("tensorflow", "jax") and fmt.jax is not None
    model = spec.model(sizes)
    jl = J.jax_layout(model)
    assert [s["name"] for s in fmt.jax["stacks"]] == [s.name for s in jl.stacks]
    hosts = spec.topology.num_hosts
    tf_layout = spec.layout(sizes)
    req = oracle_request(spec, sizes, steps, lead)
    got = jax_oracle(req)
    assert "error" not in got, got
    # The static sizes the manifest records are jax's own limits of the run: its suggested COO buffer and
    # largest partitions from its statistics of every step (update_preprocessing_parameters).
    for s in fmt.jax["stacks"]:
        theirs = got["stacks"][s["name"]]
        assert s["coo_buffer_size_per_device"] == theirs["coo_buffer_size_per_device"], s["name"]
        assert s["max_ids_per_partition"] == theirs["max_ids_per_partition"], s["name"]
        assert s["max_unique_ids_per_partition"] == theirs["max_unique_ids_per_partition"], s["name"]
    for h in range(hosts):
        recs = [r for f in shard_records.shard_files(out, h, m) for r in tfrecord.read_records(f)]
        assert len(recs) == len(steps)
        for i, rec in enumerate(recs):
            sizes_ = {s: got["stacks"][s]["coo_buffer_size_per_device"] for s in got["stacks"]}
            decoded = R.decode_step(rec, fmt.jax, has_leading_dimension=lead, coo_buffer_sizes=sizes_)
            recorded = R.decode_step(rec, fmt.jax, has_leading_dimension=lead)  # the manifest's static sizes
            for s in decoded:
                for a, b in zip(decoded[s], recorded[s]):
                    np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32))
            batches = R.decode_batches(rec, fmt.jax)
            assert sorted(decoded) == sorted(got["steps"][i][h])
            for s, theirs in got["steps"][i][h].items():
                assert_matches(jl, batches[s], theirs, sizes_[s], lead, f"{name} step {i} host {h} stack {s}")
                for a, k in zip(decoded[s], ("row_pointers", "embedding_ids", "sample_ids", "gains")):
                    assert a.shape == np.asarray(theirs[k]).shape and a.dtype == np.asarray(theirs[k]).dtype
            # The TF arrays are still there, as with shards.layout: tensorflow.
            assert list(shard_records.decode_record(rec, fmt)["sparse_core"][0]) == list(tf_layout.stacks)


def test_jax_layout_alone_holds_the_same_arrays_and_the_tf_reader_refuses_it(tmp_path):
    """shards.layout: jax writes jax's arrays alone (no sc/ keys): the same decoded steps and static sizes as
    with both; TensorFlow's input_fn refuses the artifact in one line."""
    from tpu_embed.artifact import shard_records, tfrecord
    from tpu_embed.artifact.manifest import read_manifest
    from tpu_embed.jax import records as R
    from tpu_embed.training.input import input_fn

    _, both, _, _ = example_artifact(tmp_path, "criteo", "both")
    _, alone, _, _ = example_artifact(tmp_path, "criteo", "jax")
    mb, ma = read_manifest(both), read_manifest(alone)
    assert ma.shard_format.layouts == ("jax",) and ma.shard_format.stacks == ()
    assert ma.shard_format.jax == mb.shard_format.jax
    recs_b = [r for f in shard_records.shard_files(both, 0, mb) for r in tfrecord.read_records(f)]
    recs_a = [r for f in shard_records.shard_files(alone, 0, ma) for r in tfrecord.read_records(f)]
    assert len(recs_a) == len(recs_b) > 0
    for ra, rb in zip(recs_a, recs_b):
        assert not any(k.startswith("sc/") for k in shard_records.decode_example(ra))
        da, db = R.decode_step(ra, ma.shard_format.jax), R.decode_step(rb, mb.shard_format.jax)
        for s in db:
            for a, b in zip(da[s], db[s]):
                np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32))
    with pytest.raises(ValueError, match="jax-tpu-embedding's arrays only"):
        input_fn(alone)
