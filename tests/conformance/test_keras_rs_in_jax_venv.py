"""keras-rs' DistributedEmbedding (JAX backend) fed from the shards: examples/train_keras_rs.py, run in .venv-jax.

keras-rs' `preprocess` hands its layer one `ShardedCooMatrix` per stacked table, made from jax-tpu-embedding's
preprocessing of the batch; the example makes the same structure from `tpu_embed.jax.input_iterator`
(`keras_inputs`) and gives the layer's `TableConfig`s the exact limits of `tpu-embed plan --artifact ...
--format jax-fdo`. Checked on CPU up to the device boundary: the FeatureSpecs keras-rs' build makes of those
configs stack as the records were written, with the planned limits; every step equals keras-rs' own
preprocessing of the step's host batch with those specs (`create_feature_samples` + `stack_and_shard_samples`,
what `preprocess` runs on a TPU): shard starts and ends whole, the COO arrays where jax writes them, shapes and
dtypes; keras-rs drops nothing. The side that runs in the jax venv is tests/conformance/keras_rs_helper.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipelines import child_pipe
from tests.conformance import jax_oracle
from tests.conformance.jax_examples import differing_stacks, fdo_artifacts, host_features
from tpu_embed.artifact.jax_records import segment_sizes
from tpu_embed.sparsecore.jax_layout import PAD_ID

pytestmark = pytest.mark.conformance

HELPER = Path(__file__).with_name("keras_rs_helper.py")
# criteo: one host, 2 devices; movielens_stacks: two hosts, TF's stacks unlike jax's (some exact limits from the
# manifest's maxima), mean and sqrtn combiners.
EXAMPLES = {"criteo": ("criteo", "jax", None), "movielens_stacks": ("movielens", "jax", differing_stacks)}


@pytest.fixture(scope="module")
def helper():
    env = dict(jax_oracle.jax_env(), XLA_FLAGS="--xla_force_host_platform_device_count=2", KERAS_BACKEND="jax")
    h = child_pipe.Helper([jax_oracle.jax_python(), str(HELPER)], env, name="keras-rs-helper")
    yield h
    h.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return fdo_artifacts(tmp_path_factory, EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_keras_inputs_are_keras_rs_preprocessing_with_the_planned_limits(helper, artifacts, name):
    from tpu_embed.artifact.manifest import read_manifest

    spec, out, steps, fdo = artifacts(name)
    fj = read_manifest(out).shard_format.jax
    recorded = {s["name"]: s for s in fj["stacks"]}
    for h in range(spec.topology.num_hosts):
        got = helper({"op": "compare", "artifact": out, "fdo_dir": fdo, "host_index": h,
                      "steps": host_features(spec, out, steps, h), "local_devices": int(fj["local_devices"]),
                      "num_devices": int(fj["num_devices"]), "num_sc_per_device": int(fj["num_sc_per_device"])})
        assert "error" not in got, got["error"]
        # keras-rs' build stacks the tables as the records were written, each stack with the planned limits
        # (every table of a stack carries them: the layer takes the stack's maximum).
        assert got["stacks"] == {n: [s["max_ids_per_partition"], s["max_unique_ids_per_partition"]]
                                 for n, s in recorded.items()}
        for s in fj["stacks"]:
            for t in s["tables"]:
                assert got["tables"][t["name"]] == got["stacks"][s["name"]]
        assert len(got["steps"]) == len(steps)
        for i, step in enumerate(got["steps"]):
            where = f"{name} host {h} step {i}"
            assert set(step["dropped"].values()) == {0}, where
            assert sorted(step["ours"]) == sorted(step["keras_rs"]) == sorted(recorded), where
            for st, ours in step["ours"].items():
                theirs = step["keras_rs"][st]
                for k in ours:
                    assert ours[k].shape == theirs[k].shape and ours[k].dtype == theirs[k].dtype, (where, st, k)
                for k in ("shard_starts", "shard_ends"):
                    np.testing.assert_array_equal(ours[k], theirs[k], err_msg=f"{where} {st} {k}")
                seg = segment_sizes(ours["shard_ends"], fj).reshape(-1)
                for k in ("col_ids", "row_ids", "values"):
                    x = ours[k].reshape(seg.size, -1).view(np.int32)
                    y = theirs[k].reshape(seg.size, -1).view(np.int32)
                    pad = np.float32(np.nan).view(np.int32) if k == "values" else PAD_ID
                    for j, n in enumerate(seg.tolist()):
                        np.testing.assert_array_equal(x[j, :n], y[j, :n], err_msg=f"{where} {st} {k} segment {j}")
                        assert np.all(x[j, n:] == pad), (where, st, k, j)


def test_train_keras_rs_dry_run_reaches_the_device_boundary(helper, artifacts):
    """examples/train_keras_rs.py --dry-run: the configs with the planned limits, the layer's FeatureSpecs,
    8 steps of the iterator (a second, shuffled epoch past the artifact's 6) in keras-rs' form, one shape."""
    from tpu_embed.artifact.manifest import read_manifest

    spec, out, steps, fdo = artifacts("criteo")
    fj = read_manifest(out).shard_format.jax
    got = helper({"op": "dry_run", "argv": ["--artifact", out, "--fdo", fdo, "--dry-run", "--steps", "8",
                                            "--shuffle-steps", "3"]})
    assert "error" not in got, got["error"]
    assert got["steps"] == 8 > len(steps) and len(got["shapes"]) == 1 and got["ids"] > 0
    assert got["features"] == sorted(f.name for f in spec.sparse_core_features)
    assert got["stacks"] == {s["name"]: [s["max_ids_per_partition"], s["max_unique_ids_per_partition"]]
                             for s in fj["stacks"]}
