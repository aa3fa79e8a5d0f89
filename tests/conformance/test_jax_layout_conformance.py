"""jax-tpu-embedding's SparseCore layout (tpu_embed.sparsecore.jax_layout) against the installed jax-tpu-embedding
0.2.0 on CPU.

The oracle (jax_layout_server.py, in .venv-jax) stacks and preprocesses each case with jax's own code;
we compare its stacking, its statistics and its four arrays per stack bit for bit (gains as raw bits),
for hypothesis-generated models (`tests.conformance.jax_cases`) and for every step of the example specs' shards.
The vectorised packing against its per-id reference, without jax: tests/tpu_embed/sparsecore/test_jax_layout.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from tests.conformance.jax_cases import jax_cases, model_of
from tests.conformance.jax_examples import example_artifact, oracle_request
from tests.conformance.jax_oracle import JaxOracle
from tpu_embed.sparsecore import jax_layout as J

pytestmark = pytest.mark.conformance

SERVER = Path(__file__).with_name("jax_layout_server.py")


@pytest.fixture(scope="module")
def jax_oracle():
    o = JaxOracle(SERVER, name="jax-layout-oracle")
    yield o
    o.close()


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


# ------------------------------------------------------------------ the example specs' shards

@pytest.mark.parametrize("name", ["criteo", "movielens"])
@pytest.mark.parametrize("lead", [False, True])
def test_example_shards_decode_to_jax_preprocessing(tmp_path, jax_oracle, name, lead):
    """decode_step of every step record of an example spec's shards == jax's own preprocessing of that
    step's global batch (its stacking of the spec's model, its limits from its own statistics)."""
    from tpu_embed.artifact import jax_records as R
    from tpu_embed.artifact import shard_records, tfrecord
    from tpu_embed.artifact.manifest import read_manifest

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
    from tpu_embed.artifact import jax_records as R
    from tpu_embed.artifact import shard_records, tfrecord
    from tpu_embed.artifact.manifest import read_manifest
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
