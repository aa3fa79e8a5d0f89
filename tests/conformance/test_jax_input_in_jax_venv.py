"""tpu_embed.jax.input_iterator with jax itself, and tpu_embed.jax.specs.feature_specs: run in .venv-jax.

What a JAX user runs: FeatureSpecs from `feature_specs(artifact, fdo_dir=<tpu-embed plan --artifact artifact
--format jax-fdo>)`, then `input_iterator(artifact, output="jax", feature_specs=specs)`. Each step's
PreprocessedInput (jax-tpu-embedding's own class), as numpy and as jax.Arrays sharded over the host's CPU
devices, equals jax-tpu-embedding's `preprocess_sparse_dense_matmul_input` of the step's host batch with the
same FeatureSpecs (row pointers bit for bit, the COO buffers where jax writes them), with nothing dropped.
The side that runs in the jax venv is tests/conformance/jax_input_helper.py.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

from pipelines import child_pipe
from tests.conformance import jax_oracle
from tests.conformance.jax_examples import differing_stacks, example_artifact, fdo_artifacts, host_features
from tpu_embed.artifact.jax_records import segment_sizes
from tpu_embed.sparsecore.jax_layout import PAD_ID

pytestmark = pytest.mark.conformance

HELPER = Path(__file__).with_name("jax_input_helper.py")
# name: (example spec, shards layout, edit of its text); movielens_stacks: TF's stacks unlike jax's
# (`jax_examples.differing_stacks`), so its exact limits come from the manifest's maxima for some stacks;
# movielens_tf_alone: the same with two tables TF keeps alone and jax stacks.
EXAMPLES = {"criteo": ("criteo", "jax", None), "movielens": ("movielens", "both", None),
            "movielens_stacks": ("movielens", "jax", differing_stacks),
            "movielens_tf_alone": ("movielens", "jax", functools.partial(differing_stacks, tf_alone=True))}
DEVICES = 2  # CPU devices of the helper: criteo's host has 2 chips; movielens' hosts 1 each


@pytest.fixture(scope="module")
def helper():
    env = dict(jax_oracle.jax_env(), XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}")
    h = child_pipe.Helper([jax_oracle.jax_python(), str(HELPER)], env, name="jax-input-helper")
    yield h
    h.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return fdo_artifacts(tmp_path_factory, EXAMPLES)


def _check_against_jax(a: dict, b: dict, fj: dict, where: str):
    """PreprocessedInput arrays `a` (ours) against `b` (jax's on the fly): whole row pointers, segments."""
    assert sorted(a["row_pointers"]) == sorted(b["row_pointers"]), where
    for st in a["row_pointers"]:
        for k in ("row_pointers", "embedding_ids", "sample_ids", "gains"):
            x, y = a[k][st], b[k][st]
            assert x.shape == y.shape and x.dtype == y.dtype, (where, st, k, x.shape, y.shape, x.dtype, y.dtype)
        np.testing.assert_array_equal(a["row_pointers"][st], b["row_pointers"][st], err_msg=where)
        seg = segment_sizes(a["row_pointers"][st], fj).reshape(-1)
        for k in ("embedding_ids", "sample_ids", "gains"):
            x = a[k][st].reshape(seg.size, -1).view(np.int32)
            y = b[k][st].reshape(seg.size, -1).view(np.int32)
            pad = np.float32(np.nan).view(np.int32) if k == "gains" else PAD_ID
            for i, n in enumerate(seg.tolist()):
                np.testing.assert_array_equal(x[i, :n], y[i, :n], err_msg=f"{where} {st} {k} segment {i}")
                assert np.all(x[i, n:] == pad), (where, st, k, i)
    np.testing.assert_array_equal(a["num_minibatches"], b["num_minibatches"], err_msg=where)
    assert a["num_minibatches"].shape == b["num_minibatches"].shape


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@pytest.mark.parametrize("lead", [False, True])
def test_jax_output_equals_jax_preprocessing_with_feature_specs(helper, artifacts, name, lead):
    from tpu_embed.artifact.manifest import read_manifest

    spec, out, steps, fdo = artifacts(name)
    fmt = read_manifest(out).shard_format
    fj, L = fmt.jax, int(fmt.jax["local_devices"])
    for h in range(spec.topology.num_hosts):
        req = {"op": "iterate", "artifact": out, "fdo_dir": fdo, "with_specs": True, "host_index": h, "lead": lead,
               "steps": host_features(spec, out, steps, h), "local_devices": L,
               "num_devices": int(fj["num_devices"]), "num_sc_per_device": int(fj["num_sc_per_device"])}
        got_jax = helper(dict(req, output="jax", devices=L))
        got_np = helper(dict(req, output="numpy"))
        assert "error" not in got_jax and "error" not in got_np, (got_jax.get("error"), got_np.get("error"))
        assert [s["step"] for s in got_jax["steps"]] == list(range(len(steps)))
        for sj, sn in zip(got_jax["steps"], got_np["steps"]):
            where = f"{name} step {sj['step']} host {h}"
            # jax-tpu-embedding's own class, numpy or jax.Array alike; nothing dropped by jax with these specs.
            assert sj["class"] == sn["class"] == "jax_tpu_embedding.sparsecore.lib.nn.embedding.PreprocessedInput"
            assert set(sj["dropped"].values()) == {0}, where
            _check_against_jax(sj["sparse"], sj["on_the_fly"], fj, where + " (jax)")
            _check_against_jax(sn["sparse"], sn["on_the_fly"], fj, where + " (numpy)")
            for k in ("label", "mask", "dense"):
                np.testing.assert_array_equal(sj[k], sn[k], err_msg=where)
            # Sharded as jax's examples shard data: the first axis split over the host's devices, one shard each.
            sh = sj["sharding"]
            for arr in (sh["label"], sh["dense"], sh["num_minibatches"], *sh["row_pointers"].values(),
                        *sh["embedding_ids"].values()):
                assert arr is not None and len({d for d, _, _ in arr["shards"]}) == L == len(arr["shards"]), where
                assert all(shape[0] * L == arr["shape"][0] for _, _, shape in arr["shards"]), (where, arr)
            assert sn["sharding"]["label"] is None  # numpy stays numpy


def test_feature_specs_are_the_artifact_s_model_with_the_exact_limits(helper, artifacts, tmp_path):
    from tpu_embed.artifact.load import load_artifact
    from tpu_embed.artifact.manifest import read_manifest

    for name in sorted(EXAMPLES):
        spec, out, _, fdo = artifacts(name)
        model = load_artifact(out).model
        fj = read_manifest(out).shard_format.jax
        got = helper({"op": "specs", "artifact": out, "fdo_dir": fdo})
        assert "error" not in got, got
        assert got["order"] == [f.name for f in model.features]
        chips = model.topology.num_chips
        recorded = {s["name"]: s for s in fj["stacks"]}
        kinds = {"sgd": "SGDOptimizerSpec", "adagrad": "AdagradOptimizerSpec", "adam": "AdamOptimizerSpec",
                 "ftrl": "FTRLOptimizerSpec"}
        for f in model.features:
            g = got["features"][f.name]
            t = f.table
            assert (g["table"], g["vocabulary_size"], g["dim"], g["combiner"]) == (
                t.name, t.vocabulary_size, t.dim, t.combiner), f.name
            assert g["optimizer"] == kinds[t.optimizer.kind] and g["learning_rate"] == pytest.approx(
                dict(t.optimizer.params)["learning_rate"]), f.name
            assert g["input_shape"] == [f.samples * chips, 1] and g["output_shape"] == [f.samples * chips, t.dim]
            # Stacked as the records were written, and the FDO limits are the run's maxima the manifest records.
            s = recorded[g["stack"]]
            assert f.name in {x["name"] for x in s["features"]}
            x = next(x for x in s["features"] if x["name"] == f.name)
            assert (g["row_offset"], g["col_offset"], g["col_shift"]) == (x["row_offset"], x["col_offset"],
                                                                          x["col_shift"])
            assert (g["max_ids_per_partition"], g["max_unique_ids_per_partition"],
                    g["suggested_coo_buffer_size_per_device"]) == (
                s["max_ids_per_partition"], s["max_unique_ids_per_partition"], s["coo_buffer_size_per_device"]), f.name
        layout = json.loads((Path(fdo) / "tpu_embed_jax_fdo.json").read_text())
        assert layout  # the layout record the limits were checked against
        # Without fdo_dir: jax's default limits, the same stacking.
        plain = helper({"op": "specs", "artifact": out})
        assert {n: g["stack"] for n, g in plain["features"].items()} == {
            n: g["stack"] for n, g in got["features"].items()}
    # Limits of another stacking than the records' are refused in one line that names the command to run.
    from pipelines import cli
    _, out, _, _ = artifacts("movielens_stacks")
    other = str(tmp_path / "fdo-none")
    assert cli.main(["plan", "--artifact", out, "--format", "jax-fdo", "--jax-stacking", "none",
                     "--output", other]) == 0
    got = helper({"op": "specs", "artifact": out, "fdo_dir": other})
    assert f"tpu-embed plan --artifact {out} --format jax-fdo" in got["error"] and "\n" not in got["error"], got
    # An artifact without jax arrays is refused in one line.
    _, tf_only, _, _ = example_artifact(tmp_path, "criteo", "tensorflow")
    got = helper({"op": "specs", "artifact": tf_only})
    assert "shards: {layout: jax}" in got["error"] and "\n" not in got["error"]


def test_train_jax_dry_run_reaches_the_device_boundary(helper, artifacts):
    """examples/train_jax.py --dry-run: the specs, the mesh over the host's devices, 8 steps of the iterator
    (more than the artifact's 6: a second, shuffled epoch) with one static shape, the dense model's loss."""
    from tpu_embed.artifact.manifest import read_manifest

    spec, out, steps, fdo = artifacts("criteo")
    fj = read_manifest(out).shard_format.jax
    got = helper({"op": "train_dry_run", "argv": ["--artifact", out, "--fdo", fdo, "--dry-run", "--steps", "8",
                                                  "--shuffle-steps", "3"]})
    assert "error" not in got, got
    L = int(fj["local_devices"])
    assert got["steps"] == 8 > len(steps) and got["devices"] == L and np.isfinite(got["loss"])
    assert sorted(got["features"]) == sorted(f.name for f in spec.sparse_core_features)
    for s in fj["stacks"]:
        assert got["stacks"][s["name"]] == {"row_pointers": [L * int(fj["row_pointers_size_per_device"])],
                                            "coo": [L * int(s["coo_buffer_size_per_device"])]}
    assert got["ids"] > 0


def test_jax_optimizer_carries_each_optimizer_s_parameters(helper):
    from tpu_embed.core.model import OptimizerConfig

    def full(d):
        return OptimizerConfig.from_dict(d).to_dict()

    cases = {"sgd": ("SGDOptimizerSpec", {"learning_rate": "learning_rate"}),
             "adagrad": ("AdagradOptimizerSpec", {"learning_rate": "learning_rate",
                                                  "initial_accumulator": "initial_accumulator_value"}),
             "adam": ("AdamOptimizerSpec", {"learning_rate": "learning_rate", "beta1": "beta_1", "beta2": "beta_2",
                                            "epsilon": "epsilon"}),
             "ftrl": ("FTRLOptimizerSpec", {"learning_rate": "learning_rate",
                                            "learning_rate_power": "learning_rate_power",
                                            "l1_regularization_strength": "l1_regularization_strength",
                                            "l2_regularization_strength": "l2_regularization_strength",
                                            "beta": "beta", "initial_accumulator_value": "initial_accumulator_value"})}
    for kind, (cls, names) in cases.items():
        d = full({"optimizer": kind, "learning_rate": 0.03})
        got = helper({"op": "optimizer", "optimizer": d})
        assert got.get("class") == cls, (kind, got)
        for ours, theirs in names.items():
            assert got["fields"][theirs] == pytest.approx(d[ours]), (kind, ours)
    got = helper({"op": "optimizer", "optimizer": {"optimizer": "sgd", "learning_rate": 0.1,
                                                   "clip_weight_max": 1.0}})
    assert "no such parameters" in got["error"] and "\n" not in got["error"]


def test_feature_specs_stacked_otherwise_are_refused(helper, artifacts):
    """FeatureSpecs whose stacks are not the records' (another artifact's; one left unstacked) are refused
    in one line before any step is read: their COO buffer sizes would not be the records'."""
    _, criteo, _, _ = artifacts("criteo")
    _, movielens, _, _ = artifacts("movielens")
    base = {"op": "iterate", "artifact": criteo, "output": "numpy", "with_specs": True}
    got = helper(dict(base, specs_from=movielens))
    assert "stacked otherwise than the artifact's jax records" in got["error"] and "\n" not in got["error"]
    got = helper(dict(base, with_specs=False, unstacked=True))
    assert "are not stacked" in got["error"] and "\n" not in got["error"]


def test_feature_specs_with_limits_below_the_records_are_refused(helper, artifacts):
    """FeatureSpecs whose limits are below what the records reach (the maxima the manifest records; a window's:
    the largest of its days') are refused in one line before any step is read: jax's preprocessing with them
    would drop ids the records hold."""
    from tpu_embed.artifact.manifest import read_manifest

    _, out, _, fdo = artifacts("movielens_stacks")
    stacks = read_manifest(out).shard_format.jax["stacks"]
    exact = {s["name"]: {"max_ids_per_partition": s["max_ids_per_partition"],
                         "max_unique_ids_per_partition": s["max_unique_ids_per_partition"],
                         "suggested_coo_buffer_size_per_device": s["coo_buffer_size_per_device"]} for s in stacks}
    base = {"op": "iterate", "artifact": out, "fdo_dir": fdo, "output": "numpy", "with_specs": True}
    assert "error" not in helper(dict(base, limits=exact))  # the records' own maxima hold every step
    low = stacks[0]["name"]
    for field in ("max_ids_per_partition", "max_unique_ids_per_partition"):
        lowered = {**exact, low: dict(exact[low], **{field: exact[low][field] - 1})}
        got = helper(dict(base, limits=lowered))
        assert f"jax stack {low!r}" in got.get("error", "") and "are below what the steps of" in got["error"], got
        assert "tpu-embed plan --artifact" in got["error"] and "\n" not in got["error"]
