"""tpu_embed.training up to the TPU boundary (there is no TPU here).

* Routing: artifacts made by the real jobs on the bundled samples (2- and
  4-chip topologies) are fed through `distribute_steps` under a
  MirroredStrategy over 2 / 4 logical CPU devices (in a subprocess, so the
  device configuration cannot leak into other tests).  Inside `strategy.run`
  replica r must see chip r's CSR buffers (compared with `decode_record` of
  the shard bytes), its labels, mask, dense and tensor-core slice, and
  `dequeue_args` must give TF's structure with `sample_count` a Python int.
* The training step and examples/train_tpu.py's model and loop run under the
  same strategy with a stand-in for TPUEmbeddingV2 (its dequeue returns
  activations of the right shapes; its apply_gradients records what it gets).
* `build_tpu_embedding` constructs TensorFlow's real `TPUEmbeddingV2` (its
  constructor, stacking and limits) under a stand-in TPUStrategy object;
  `embedding_setup`'s feature config, optimizers, limits, plan checks.

tests/helpers/training.py builds the artifacts and is the subprocess that does the MirroredStrategy part.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from tests.helpers import ROOT
from tests.helpers.training import EXAMPLE, VARIANTS, build_artifact, load_example, run_dump, to_numpy, variant_spec
from tpu_embed.artifact import shard_records, tfrecord
from tpu_embed.artifact.manifest import read_manifest


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    return {name: build_artifact(str(tmp_path_factory.mktemp(name)), name) for name in VARIANTS}


@pytest.fixture(scope="module")
def dumps(artifacts, tmp_path_factory):
    d = tmp_path_factory.mktemp("dumps")
    return {"criteo4": run_dump(artifacts["criteo4"], 4, str(d / "criteo4.pkl"), train=True),
            "movielens2": run_dump(artifacts["movielens2"], 2, str(d / "movielens2.pkl"), train=True)}


def host_records(artifact, host):
    fmt = read_manifest(artifact).shard_format
    return [shard_records.decode_record(r, fmt) for p in shard_records.shard_files(artifact, host)
            for r in tfrecord.read_records(p)]


def check_chip_element(el, rec, chip, fmt, *, exact_buffers=True):
    """A per-chip element (numpy) against chip `chip` (host-local) of a decoded record."""
    pc = fmt.host_batch_size // fmt.chips_per_host
    rows = slice(chip * pc, (chip + 1) * pc)
    assert int(el["step"]) == rec["step"] and int(el["host"]) == rec["host"]
    assert int(el["chip"]) == rec["host"] * fmt.chips_per_host + chip
    np.testing.assert_array_equal(el["label"], rec["label"][rows])
    np.testing.assert_array_equal(el["mask"], rec["mask"][rows])
    np.testing.assert_array_equal(el["dense"], rec["dense"][rows])
    for name, weighted, width in fmt.tensor_core_features:
        tc = rec["tensor_core"][name]
        starts = np.concatenate([[0], np.cumsum(tc["lengths"])])
        for i, pos in enumerate(range(rows.start, rows.stop)):
            ids = tc["ids"][starts[pos]:starts[pos + 1]]
            got_ids, got_w = el["tensor_core"][name]["ids"][i], el["tensor_core"][name]["weights"][i]
            assert got_ids.tolist() == ids.tolist() + [0] * (width - len(ids))
            w = tc["weights"][starts[pos]:starts[pos + 1]] if weighted else np.ones(len(ids), np.float32)
            assert got_w.tolist() == w.tolist() + [0.0] * (width - len(ids))
    for stack, rp_buf, ids_buf in fmt.stacks:
        want, got = rec["sparse_core"][chip][stack], el["sparse_core"][stack]
        r, n = want["row_pointers_unpadded_size"], want["ids_unpadded_size"]
        assert int(got["row_pointers_unpadded_size"]) == r and int(got["ids_unpadded_size"]) == n
        assert int(got["num_minibatches_per_physical_sparse_core"]) == \
            want["num_minibatches_per_physical_sparse_core"]
        assert got["row_pointers"].shape == (rp_buf,) and got["sorted_token_ids"].shape == (ids_buf,)
        np.testing.assert_array_equal(got["row_pointers"][:r], want["row_pointers"])
        for f in ("sorted_sample_ids", "sorted_token_ids"):
            np.testing.assert_array_equal(got[f][:n], want[f])
        np.testing.assert_array_equal(got["sorted_gains"][:n].view(np.uint32), want["sorted_gains"].view(np.uint32))
        if exact_buffers:  # the tails past the prefixes are zeros (TF leaves them uninitialised)
            assert not got["row_pointers"][r:].any() and not got["sorted_token_ids"][n:].any()


@pytest.mark.parametrize("name,devices", [("criteo4", 4), ("movielens2", 2)])
def test_replica_r_gets_chip_r(artifacts, dumps, name, devices):
    artifact = artifacts[name]
    m = read_manifest(artifact)
    fmt = m.shard_format
    assert fmt.num_hosts == 1 and fmt.chips_per_host == devices
    recs = host_records(artifact, 0)
    dump = dumps[name]
    assert dump["num_replicas"] == devices
    assert len(dump["steps"]) == len(recs) == m.shards.steps  # every step once, in order
    for s, (per_replica, rec) in enumerate(zip(dump["steps"], recs, strict=True)):
        assert rec["step"] == s
        for r, value in enumerate(per_replica):
            assert int(value["replica"]) == r
            check_chip_element(value["element"], rec, r, fmt)
            # dequeue_args: the same buffers, restructured.
            for stack, csr in value["csr"].items():
                for f in ("row_pointers", "sorted_sample_ids", "sorted_token_ids", "sorted_gains",
                          "row_pointers_unpadded_size", "ids_unpadded_size",
                          "num_minibatches_per_physical_sparse_core"):
                    np.testing.assert_array_equal(csr[f], value["element"]["sparse_core"][stack][f])
    # What dequeue receives inside strategy.run: TF's structure, static buffer shapes, Python int sample_count.
    buffers = {s: (rp, ids) for s, rp, ids in fmt.stacks}
    assert dump["traced"], "the replica function was never traced"
    for traced in dump["traced"]:
        assert list(traced) == list(m.stacks)
        for stack, t in traced.items():
            assert t["type"] == "PartitionedCsrFormatTensor" and t["module"].endswith("tpu_embedding_v3")
            assert t["tuple_len"] == 3
            assert t["fields"]["sample_count"] == {"python": "int", "value": m.stacks[stack].sample_count}
            rp, ids = buffers[stack]
            assert t["fields"]["row_pointers"] == {"dtype": "int32", "static_shape": [rp]}
            for f in ("sorted_sample_ids", "sorted_token_ids"):
                assert t["fields"][f] == {"dtype": "int32", "static_shape": [ids]}
            assert t["fields"]["sorted_gains"] == {"dtype": "float32", "static_shape": [ids]}
            assert t["fields"]["num_minibatches_per_physical_sparse_core"] == {"dtype": "int32", "static_shape": []}
            assert t["row_pointers_unpadded_size"] == t["ids_unpadded_size"] == {"dtype": "int32",
                                                                                 "static_shape": []}


@pytest.mark.parametrize("name", ["criteo4", "movielens2"])
def test_training_step_and_example_model_run_under_mirrored_strategy(artifacts, dumps, name):
    """make_replica_step + examples/train_tpu.py's DLRM and loop, a stand-in embedding for TPUEmbeddingV2."""
    from tpu_embed import training
    train = dumps[name]["train"]
    setup = training.embedding_setup(artifacts[name])
    m = read_manifest(artifacts[name])
    assert len(train["losses"]) == -(-3 * m.shards.steps // 2)  # 3 epochs, 2 steps per call
    assert all(np.isfinite(train["losses"]))
    assert all(train["changed"]), "some dense variable was not updated"
    expected = {f.name: list(f.output_shape) + [f.table.dim] for f in setup.model.features}
    assert train["activation_shapes"] == expected
    assert train["gradients"], "apply_gradients was never called"
    for g in train["gradients"]:  # one per trace and replica
        assert g["shapes"] == expected and g["preserved"] == sorted(setup.stacks)
    for d in train["dequeued"]:
        assert {k: v["fields"]["sample_count"]["value"] for k, v in d.items()} == setup.sample_counts


def test_hosts_read_their_own_shards(artifacts):
    """Two hosts, one chip each: input pipeline h reads host h's shards (what a multi-host TPUStrategy does)."""
    import tensorflow as tf

    from tpu_embed import training
    artifact = artifacts["movielens_2hosts"]
    fmt = read_manifest(artifact).shard_format
    assert fmt.num_hosts == 2 and fmt.chips_per_host == 1
    fn = training.replica_dataset_fn(artifact)
    for h in range(2):
        ds = fn(tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=h, num_replicas_in_sync=2))
        recs = host_records(artifact, h)
        els = [tf.nest.map_structure(to_numpy, el) for el in ds]
        assert len(els) == len(recs)
        for el, rec in zip(els, recs, strict=True):
            assert rec["host"] == h
            check_chip_element(el, rec, 0, fmt)
    with pytest.raises(training.ArtifactMismatchError, match="2 host"):
        fn(tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2))
    with pytest.raises(training.ArtifactMismatchError, match="2 chips"):
        fn(tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0, num_replicas_in_sync=4))


def test_per_chip_dataset_repeats_and_keeps_static_shapes(artifacts):
    from tpu_embed import training
    artifact = artifacts["criteo4"]
    m = read_manifest(artifact)
    fmt = m.shard_format
    ds = training.per_chip_dataset(artifact, 0, num_epochs=2)
    spec = ds.element_spec
    for stack, rp, ids in fmt.stacks:
        assert spec["sparse_core"][stack]["row_pointers"].shape.as_list() == [rp]
        assert spec["sparse_core"][stack]["sorted_gains"].shape.as_list() == [ids]
    assert spec["label"].shape.as_list() == [m.batch_sizes.per_chip]
    assert spec["dense"].shape.as_list() == [m.batch_sizes.per_chip, len(fmt.dense_features)]
    chips = [int(el["chip"]) for el in ds]
    assert chips == list(range(fmt.chips_per_host)) * (2 * m.shards.steps)


def test_distribute_steps_refuses_a_strategy_of_another_size(artifacts):
    import tensorflow as tf

    from tpu_embed import training
    strategy = tf.distribute.get_strategy()  # one replica
    with pytest.raises(training.ArtifactMismatchError, match="packed for 4 chips.*1 replicas.*num_chips=1"):
        training.distribute_steps(artifacts["criteo4"], strategy)


# ---------------------------------------------------------------- the TPUEmbeddingV2 configuration

def test_setup_follows_spec_manifest_and_limits(artifacts):
    import tensorflow as tf

    from tpu_embed import training
    artifact = artifacts["movielens2"]
    m = read_manifest(artifact)
    spec = variant_spec("movielens2")
    setup = training.embedding_setup(artifact)
    fc = setup.feature_config
    assert isinstance(fc, dict) and sorted(fc) == sorted(f.name for f in spec.sparse_core_features)
    sizes = m.vocabulary_sizes
    for name, f in fc.items():
        cat = spec.feature(name)
        t = spec.table(cat.table)
        assert f.table.name == cat.table and f.table.dim == t.dim and f.table.combiner == t.combiner
        assert f.table.vocabulary_size == spec.table_vocabulary_size(cat.table, sizes)
        assert f.table.vocabulary_size == m.features[name].table_vocabulary_size
        assert list(f.output_shape) == ([8, 3] if name == "genres" else [8]) and f.max_sequence_length == \
            cat.sequence_length
        opt = f.table.optimizer
        if cat.table == "zip":  # the spec's per-table optimizer
            assert isinstance(opt, tf.tpu.experimental.embedding.SGD) and opt.learning_rate == 0.1
        else:  # the spec's top-level optimizer
            assert isinstance(opt, tf.tpu.experimental.embedding.Adagrad) and opt.learning_rate == 0.05
    assert "gender" not in fc  # tensor-core features are the Keras model's
    assert setup.optimizer is None
    sc = setup.sparse_core_embedding_config
    lim = m.limits
    assert (sc.max_ids_per_chip_per_sample, sc.max_ids_per_table, sc.max_unique_ids_per_table,
            sc.allow_id_dropping, sc.disable_table_stacking) == (
        lim.max_ids_per_chip_per_sample, lim.max_ids_per_table, lim.max_unique_ids_per_table,
        lim.allow_id_dropping, False)
    assert setup.stacks == {k: tuple(v.tables) for k, v in m.stacks.items()}
    assert setup.sample_counts == {k: v.sample_count for k, v in m.stacks.items()}
    assert setup.pipeline_execution_with_tensor_core is False
    assert training.embedding_setup(artifact, pipeline_execution_with_tensor_core=True
                                    ).pipeline_execution_with_tensor_core is True


def test_pipelining_flag_is_read_from_the_spec(artifacts, tmp_path):
    import shutil

    import yaml

    from tpu_embed import training
    from tpu_embed.artifact import io as tio
    from tpu_embed.artifact.manifest import manifest_bytes, read_manifest
    # The flag is training-only: not fingerprinted, so the spec copy may set it without re-sharding.
    d = tmp_path / "pipelined"
    shutil.copytree(artifacts["criteo4"], d)
    spec = yaml.safe_load((d / "spec.yaml").read_text())
    spec["training"] = {"pipeline_execution_with_tensor_core": True}
    text = yaml.safe_dump(spec, sort_keys=False)
    written = tio.write_text_atomic(str(d / "spec.yaml"), text)
    m = read_manifest(str(d)).to_json()
    for f in m["files"]:
        if f["path"] == "spec.yaml":
            f["sha256"], f["bytes"] = written.sha256, written.bytes
    (d / "manifest.json").write_bytes(manifest_bytes(m))
    assert training.embedding_setup(str(d)).pipeline_execution_with_tensor_core is True
    assert training.embedding_setup(str(d), pipeline_execution_with_tensor_core=False
                                    ).pipeline_execution_with_tensor_core is False


def test_optimizer_override_only_if_the_stacking_stays(artifacts):
    import tensorflow as tf

    from tpu_embed import training
    opt = tf.tpu.experimental.embedding.Adagrad(learning_rate=lambda: 0.01)  # e.g. a schedule
    setup = training.embedding_setup(artifacts["criteo4"], optimizer=opt)
    assert all(f.table.optimizer is opt for f in tf.nest.flatten(setup.feature_config))
    with pytest.raises(training.ArtifactMismatchError, match="tables stack by optimizer"):
        training.embedding_setup(artifacts["movielens2"], optimizer=opt)  # zip's SGD stack would merge


class StandInTPUStrategy:
    """A TPUStrategyV2 object that only answers what TPUEmbeddingV2's constructor asks (there is no TPU)."""

    @staticmethod
    def make(num_chips, num_sc_per_chip=4):
        from tensorflow.python.distribute import tpu_strategy

        class Strategy(tpu_strategy.TPUStrategyV2):
            def __init__(self):
                pass

            num_replicas_in_sync = property(lambda self: num_chips)
            extended = property(lambda self: types.SimpleNamespace(tpu_hardware_feature=types.SimpleNamespace(
                num_embedding_devices_per_chip=num_sc_per_chip)))

        return Strategy()


@pytest.fixture
def stand_in_tpu(monkeypatch):
    import tensorflow as tf
    from tensorflow.python.distribute import distribute_lib

    def use(num_chips, num_sc_per_chip=4):
        s = StandInTPUStrategy.make(num_chips, num_sc_per_chip)
        monkeypatch.setattr(tf.distribute, "get_strategy", lambda: s)
        monkeypatch.setattr(distribute_lib, "get_strategy", lambda: s)  # what TPUEmbeddingV2.__init__ calls
        return s

    return use


@pytest.mark.parametrize("name", ["criteo4", "movielens2", "movielens_2hosts"])
def test_build_tpu_embedding_constructs_tensorflows_object(artifacts, stand_in_tpu, name):
    """TF 2.21's real TPUEmbeddingV2 constructor: its stacking, offsets and limits equal the shards'."""
    import tensorflow as tf

    from tpu_embed import training
    artifact = artifacts[name]
    m = read_manifest(artifact)
    stand_in_tpu(m.topology.num_chips, m.topology.num_sc_per_chip)
    emb = training.build_tpu_embedding(artifact)
    assert isinstance(emb, tf.tpu.experimental.embedding.TPUEmbeddingV2)
    assert not emb._built  # build() needs the TPU (not run here)
    assert {k: [t.name for t in v] for k, v in emb._stacked_table_to_tables.items()} == \
        {k: v.tables for k, v in m.stacks.items()}
    assert emb._table_to_max_ids_per_sparse_core == m.limits.max_ids_per_table
    assert emb._table_to_max_unique_ids_per_sparse_core == m.limits.max_unique_ids_per_table
    assert emb._table_to_sample_count == {k: v.sample_count for k, v in m.stacks.items()}
    S = m.topology.num_chips * m.topology.num_sc_per_chip
    for t, p in m.layout["tables"].items():
        assert tuple(emb._table_to_stacked_table_offset[t]) == (p["stack"], p["shard_row_offset"] * S, p["rotation"])
    for f in m.layout["features"]:
        assert emb._feature_to_sample_offset[f["path"]] == f["sample_offset"]
    assert emb._pipelining is False
    # The check really compares: a setup that disagrees is refused.
    setup = training.embedding_setup(artifact)
    training.check_embedding(emb, setup)
    stack = next(iter(setup.stacks))
    bad = dict(setup.limits, max_ids_per_table={**setup.limits["max_ids_per_table"], stack: 1})
    with pytest.raises(training.ArtifactMismatchError, match="max_ids_per_table"):
        training.check_embedding(emb, training.EmbeddingSetup(**{**setup.__dict__, "limits": bad}))


def test_build_tpu_embedding_checks_the_strategy(artifacts, stand_in_tpu, monkeypatch):
    import tensorflow as tf

    from tpu_embed import training
    stand_in_tpu(8)
    with pytest.raises(training.ArtifactMismatchError, match="packed for 4 chips.*8 replicas"):
        training.build_tpu_embedding(artifacts["criteo4"])
    stand_in_tpu(4, num_sc_per_chip=2)
    with pytest.raises(training.ArtifactMismatchError, match="4 SparseCores per chip, this TPU has 2"):
        training.build_tpu_embedding(artifacts["criteo4"])
    monkeypatch.setattr(tf.distribute, "get_strategy", lambda: tf.distribute.MirroredStrategy(["/cpu:0"]))
    with pytest.raises(RuntimeError, match=r"inside `strategy.scope\(\)` of a tf.distribute.TPUStrategy"):
        training.build_tpu_embedding(artifacts["criteo4"])


# ---------------------------------------------------------------- plans

@pytest.fixture(scope="module")
def planned(artifacts, tmp_path_factory):
    """A plan from the criteo4 profile (real planner), and the same data re-sharded with it."""
    import warnings

    import profiles
    d = tmp_path_factory.mktemp("planned")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 profiled steps: InsufficientDataWarning
        # headroom: not the exact maxima `run` itself records, so the plan differs from criteo4's limits
        plan = profiles.plan(os.path.join(artifacts["criteo4"], "profiles"), min_steps=1, headroom=2.0)
    path = plan.write(str(d / "plan.json"))
    return path, build_artifact(str(d / "sharded"), "criteo4", plan=path)


def test_plan_equal_to_the_shards_limits_is_accepted(planned):
    import profiles
    from tpu_embed import training
    path, artifact = planned
    m = read_manifest(artifact)
    assert m.limits.source == f"plan:{path}"
    for plan in (path, profiles.load_plan(path)):
        setup = training.embedding_setup(artifact, plan=plan)
        sc = setup.sparse_core_embedding_config
        assert sc.max_ids_per_table == m.limits.max_ids_per_table
        assert sc.max_unique_ids_per_table == m.limits.max_unique_ids_per_table
        assert sc.max_ids_per_chip_per_sample == m.limits.max_ids_per_chip_per_sample


def test_plan_other_than_the_shards_limits_is_refused(artifacts, planned, tmp_path):
    from tpu_embed import training
    path, _ = planned
    with pytest.raises(training.ArtifactMismatchError, match=r"differs from the limits the shards .* were packed "
                                                             r"with \(planned: .*\).*re-shard with this plan"):
        training.embedding_setup(artifacts["criteo4"], plan=path)
    d = json.load(open(path))
    for change, match in ((lambda sc: sc.update(disable_table_stacking=True), "disables table stacking"),
                          (lambda sc: sc["max_ids_per_table"].update(nope=3), r"limits for \['nope'\]")):
        bad = json.loads(json.dumps(d))
        change(bad["sparse_core_config"])
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(bad))
        with pytest.raises(training.ArtifactMismatchError, match=match):
            training.embedding_setup(planned[1], plan=str(p))


def test_artifact_without_shards_or_with_an_edited_spec_is_refused(artifacts, tmp_path):
    import shutil

    from tests.helpers import jobs
    from tpu_embed import training
    from tpu_embed.artifact.manifest import ManifestError
    vocab_only = str(tmp_path / "vocab_only")
    jobs.run_vocabulary(variant_spec("criteo4"), vocab_only)
    with pytest.raises(ManifestError, match="has no shards"):
        training.embedding_setup(vocab_only)
    with pytest.raises(ManifestError, match="has no shards"):
        training.distribute_steps(vocab_only, None)
    d = tmp_path / "edited"
    shutil.copytree(artifacts["criteo4"], d)
    text = (d / "spec.yaml").read_text()
    (d / "spec.yaml").write_text(text.replace("global_batch_size: 64", "global_batch_size: 128"))
    with pytest.raises(ManifestError, match="spec.yaml was edited"):
        training.embedding_setup(str(d))


# ---------------------------------------------------------------- the example script

def test_example_script_help_and_import():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, EXAMPLE, "--help"], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--artifact", "--tpu", "--steps"):
        assert flag in proc.stdout
    mod = load_example()
    args = mod.parse_args(["--artifact", "build/criteo", "--tpu", "t", "--steps", "7"])
    assert (args.artifact, args.tpu, args.steps) == ("build/criteo", "t", 7)
    assert callable(mod.main) and callable(mod.train) and callable(mod.build_model)
