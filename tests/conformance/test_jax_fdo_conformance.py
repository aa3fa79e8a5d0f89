"""`tpu-embed plan --format jax-fdo` and `tpu_embed.jax.limits` against the installed jax-tpu-embedding (0.2.0, CPU).

For the bundled example specs (built by the real jobs) and hypothesis-generated models, the FDO files written
from a profile must be what jax-tpu-embedding itself makes of the same data:

* its `NPZFileFDOClient` loads them, and its `update_preprocessing_parameters` sets our limits;
* `tpu_embed.jax.limits` stacks its FeatureSpecs as jax's own stacker does for the recorded stacks, sets the
  same limits, and refuses specs stacked or sized otherwise;
* its `preprocess_sparse_dense_matmul_input`, run on every step of every process of the profiled data with
  those limits and `allow_id_dropping=True`, drops no id, and the element-wise maxima over steps of the
  statistics it returns equal the files' arrays exactly: every partition's figure is tight, not a bound.

Runs in the JAX oracle venv (`make jax-oracle`): tests/conformance/jax_fdo_server.py (jax alone) and
jax_limits_helper.py (tpu_embed.jax.limits on jax's specs).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles import ProfileCollector, ProfileStore
from profiles.errors import ProfileError
from profiles.jax_fdo import artifact_jax_fdo_stats, jax_fdo_stats, write_jax_fdo
from tests.conformance.cases import feature_config as case_feature_config
from tests.conformance.jax_oracle import JaxOracle
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore import FeatureIds

pytestmark = pytest.mark.conformance

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def jax_fdo():
    o = JaxOracle(HERE / "jax_fdo_server.py", name="jax-fdo")
    yield o
    o.close()


@pytest.fixture(scope="module")
def jax_limits():
    o = JaxOracle(HERE / "jax_limits_helper.py", name="jax-limits")
    yield o
    o.close()


# ---------------------------------------------------------------- requests and checks

def _description(stats, fdo_dir) -> dict:
    """The model as plain data for the jax scripts: tables (one jax optimizer per optimizer group), features in
    flattened order with their global samples, the recorded stacks, the topology."""
    m, t = stats.model, stats.model.topology
    groups = sorted({tb.optimizer_group for tb in m.tables})
    tables = [{"name": tb.name, "vocabulary_size": tb.vocabulary_size, "dim": tb.dim, "combiner": tb.combiner,
               "optimizer": ("sgd", 0.1 + 0.01 * groups.index(tb.optimizer_group))} for tb in m.tables]
    features = [{"name": f.name, "table": f.table.name, "global_samples": f.samples * t.num_chips}
                for f in m.features]
    return {"tables": tables, "features": features,
            "stacks": {name: [tb["name"] for tb in s.tables] for name, s in stats.stacks.items()},
            "stacking": stats.stacking,
            "global_device_count": t.num_chips, "local_device_count": t.chips_per_host,
            "num_sc_per_device": t.num_sc_per_chip, "num_sparse_cores": t.num_sparse_cores,
            "fdo_dir": str(fdo_dir)}


def _local_batches(model, global_batches) -> list:
    """[step][host] {feature: (row splits, ids, weights or None)}: each host's consecutive chips' samples."""
    t = model.topology
    out = []
    for gids in global_batches:
        per_host = []
        for h in range(t.num_hosts):
            batch = {}
            for f in model.features:
                fid = gids[f.name]
                n = f.samples * t.chips_per_host  # the host's samples of this feature
                lo = h * n
                keep = (fid.rows >= lo) & (fid.rows < lo + n)
                rows = fid.rows[keep] - lo
                splits = np.searchsorted(rows, np.arange(n + 1), side="left").astype(np.int64)
                w = None if fid.weights is None else np.asarray(fid.weights, np.float32)[keep]
                batch[f.name] = (splits, fid.ids[keep].astype(np.int64), w)
            per_host.append(batch)
        out.append(per_host)
    return out


def _check(stats, fdo_dir, global_batches, jax_fdo, jax_limits):
    req = _description(stats, fdo_dir)
    model = stats.model
    ours = stats.limits()
    got = jax_fdo(dict(req, local_batches=_local_batches(model, global_batches)))
    assert "error" not in got, got["error"]

    # jax's stacker put every feature where our figures were counted.
    for f in model.features:
        st = next(s for s in stats.stacks.values() if any(x["name"] == f.name for x in s.features))
        tb = next(x for x in st.tables if x["name"] == f.table.name)
        placed = got["stacking"][f.name]
        assert (placed["stack"], placed["row_offset_in_shard"], placed["shard_rotation"], placed["padded_vocab_size"],
                placed["col_offset"], placed["col_shift"]) == (
            st.name, tb["row_offset_in_shard"], tb["shard_rotation"], tb["padded_vocabulary_size"],
            tb["row_offset_in_shard"] * model.topology.num_sparse_cores, tb["shard_rotation"]), f.name

    # Its client loads the files: per key, the element-wise maximum over the processes' files.
    hosts = [stats.host_arrays(h) for h in range(model.topology.num_hosts)]
    for field, suffix in (("max_ids", "_max_ids"), ("max_unique_ids", "_max_unique_ids"),
                          ("required_buffer_size", "_required_buffer_size")):
        assert sorted(got["loaded"][field]) == sorted(stats.stacks)
        for name in stats.stacks:
            want = np.max(np.stack([h[name + suffix] for h in hosts]), axis=0)
            np.testing.assert_array_equal(got["loaded"][field][name], want, err_msg=f"{field} {name}")

    # Its own update of the specs gives our limits.
    assert got["limits"] == ours

    # Its preprocessing of every step with those limits drops nothing, and its statistics are our files' arrays
    # (a stack from an artifact's manifest holds the maximum in every partition: the maximum is jax's).
    assert got["steps"] == stats.steps
    assert got["dropped"] == {name: 0 for name in stats.stacks}
    for field, suffix in (("max_ids", "_max_ids"), ("max_unique_ids", "_max_unique_ids"),
                          ("required_buffer_size", "_required_buffer_size")):
        for name, s in stats.stacks.items():
            if s.source == "profile":
                for h, observed in enumerate(got["observed"]):
                    np.testing.assert_array_equal(observed[field][name], hosts[h][name + suffix],
                                                  err_msg=f"host {h} {field} {name}")
            else:
                assert s.source == "manifest"
                assert max(int(np.max(o[field][name])) for o in got["observed"]) == int(
                    np.max([h[name + suffix] for h in hosts])), (field, name)

    # tpu_embed.jax.limits: the same stacking and limits on jax's own FeatureSpecs; a plain mapping as well.
    helper = jax_limits(req)
    assert "error" not in helper, helper["error"]
    assert helper["stacking"] == got["stacking"]
    assert helper["limits"] == ours
    assert helper["returned"] == ours
    mapped = jax_limits(dict(req, mapping=ours))
    assert "error" not in mapped, mapped["error"]
    assert mapped["limits"] == ours

    # ... and refuses specs the figures were not counted for.
    wrong = jax_limits(dict(req, mutate="vocabulary"))
    assert "ValueError" in wrong.get("error", ""), wrong
    if any(len(s.tables) > 1 for s in stats.stacks.values()):
        unstacked = jax_limits(dict(req, mutate="unstacked"))
        assert "no stacked table of that name" in unstacked.get("error", ""), unstacked


# ---------------------------------------------------------------- the bundled examples, built by the jobs

def _example_batches(spec, artifact):
    """Every step's global batch of the artifact, from the raw rows (the plain reference's vocabularies and ids),
    as {feature: FeatureIds} with global rows: what the shard job profiled."""
    from tests.helpers.plain_reference import plain_ids, plain_vocabulary, raw_rows
    m = json.load(open(os.path.join(artifact, "manifest.json")))
    rows = raw_rows(spec)
    vocabs = {k: plain_vocabulary(spec, k) for k in spec.vocabulary_groups()}
    B = spec.global_batch_size
    out = []
    for step in range(m["shards"]["steps"]):
        gids = {}
        for f in spec.sparse_core_features:
            L = f.sequence_length or 0
            rr, ii = [], []
            for pos in range(B):
                k = step * B + pos
                ids = plain_ids(spec, f, rows[k], vocabs) if k < len(rows) else []
                for p, ident in enumerate(ids):
                    rr.append(pos * L + p if L else pos)
                    ii.append(ident)
            gids[f.name] = FeatureIds(np.asarray(rr, np.int64), np.asarray(ii, np.int64), None)
        out.append(gids)
    return out


@pytest.fixture(scope="module")
def example_artifacts(tmp_path_factory):
    from tests.helpers.training import build_artifact, variant_spec
    built = {}

    def get(name):
        if name not in built:
            d = str(tmp_path_factory.mktemp(name) / "artifact")
            build_artifact(d, name)
            built[name] = (variant_spec(name), d)
        return built[name]

    return get


# criteo4: 4 chips, one stack of 26 tables.  movielens_2hosts: 2 processes of one device each, two optimizers,
# two combiners.  movielens2: genres a sequence feature of length 3 (its positions are jax's samples).
EXAMPLES = [(name, stacking) for name in ("criteo4", "movielens_2hosts", "movielens2")
            for stacking in ("tpu_embed", "none", "jax")]


@pytest.mark.parametrize("name,stacking", EXAMPLES)
def test_example_fdo_files_are_jax_tpu_embeddings_own_statistics(name, stacking, example_artifacts, tmp_path,
                                                                 jax_fdo, jax_limits, capsys):
    from pipelines import cli
    spec, artifact = example_artifacts(name)
    profile = ProfileStore(os.path.join(artifact, "profiles")).read()
    out = tmp_path / "fdo"
    try:
        stats = jax_fdo_stats(profile, stacking)
    except ProfileError as e:
        # Refused only where jax's stacking cannot be the profile's; the CLI says so in one line.
        assert "mixes combiners" in str(e) or "is no stack the profile counted" in str(e)
        code = cli.main(["plan", "--profiles", os.path.join(artifact, "profiles"), "--format", "jax-fdo",
                         "--jax-stacking", stacking, "--output", str(out)])
        assert code == 1 and str(e) in capsys.readouterr().err
        return
    code = cli.main(["plan", "--profiles", os.path.join(artifact, "profiles"), "--format", "jax-fdo",
                     "--jax-stacking", stacking, "--output", str(out)])
    assert code == 0
    files = sorted(p.name for p in out.iterdir())
    assert len([f for f in files if f.startswith("fdo_stats_")]) == profile.model.topology.num_hosts
    _check(stats, out, _example_batches(spec, artifact), jax_fdo, jax_limits)


# ---------------------------------------------------------------- hypothesis-generated models

@st.composite
def fdo_cases(draw):
    num_chips = draw(st.sampled_from([1, 2, 4, 8]))
    nsc = draw(st.sampled_from([2, 4]))
    num_hosts = draw(st.sampled_from([h for h in (1, 2, 4) if num_chips % h == 0]))
    batch = nsc * draw(st.integers(1, 4))
    n_tables = draw(st.integers(1, 4))
    combiner = draw(st.sampled_from(["sum", "mean", "sqrtn", None]))  # None: each table its own
    tables, features = [], []
    for i in range(n_tables):
        tables.append({"name": f"t{i}" + draw(st.sampled_from(["", "_a", "x"])),
                       "vocabulary_size": draw(st.sampled_from([3, 40, 300, 5000])),
                       "dim": draw(st.sampled_from([4, 8, 16])),
                       "combiner": combiner or draw(st.sampled_from(["sum", "mean", "sqrtn"])),
                       "optimizer": draw(st.sampled_from([("sgd", 0.1), ("adagrad", 0.1)]))})
    for j in range(draw(st.integers(n_tables, n_tables + 3))):  # every table looked up, some by several features
        t = tables[j] if j < n_tables else draw(st.sampled_from(tables))
        seq = draw(st.sampled_from([0, 0, 0, 2]))
        features.append({"name": f"f{j:02d}", "table": t["name"], "output_shape": [batch, seq] if seq else [batch],
                         "weighted": draw(st.booleans())})
    return {"tables": tables, "features": features, "num_chips": num_chips, "num_sc_per_chip": nsc,
            "num_hosts": num_hosts, "seed": draw(st.integers(0, 2**31)), "steps": draw(st.integers(1, 4)),
            "zipf": draw(st.sampled_from([1.05, 1.5, 3.0])), "max_valency": draw(st.integers(1, 6)),
            "stacking": draw(st.sampled_from(["tpu_embed", "none", "jax"]))}


def _case_batches(case):
    rng = np.random.default_rng(case["seed"])
    vocab = {t["name"]: t["vocabulary_size"] for t in case["tables"]}
    out = []
    for _ in range(case["steps"]):
        gids = {}
        for f in case["features"]:
            samples = int(np.prod(f["output_shape"])) * case["num_chips"]
            per = rng.integers(0, case["max_valency"] + 1, size=samples)
            rows = np.repeat(np.arange(samples, dtype=np.int64), per)
            ids = ((rng.zipf(case["zipf"], size=rows.size) - 1) % vocab[f["table"]]).astype(np.int64)
            w = rng.uniform(0.5, 2.0, size=rows.size).astype(np.float32) if f["weighted"] else None
            gids[f["name"]] = FeatureIds(rows, ids, w)
        out.append(gids)
    return out


@settings(max_examples=25, deadline=None)
@given(case=fdo_cases())
def test_generated_fdo_files_are_jax_tpu_embeddings_own_statistics(case, tmp_path_factory, jax_fdo, jax_limits):
    fc = case_feature_config(case, use_tf=False)
    topo = Topology(case["num_chips"], case["num_sc_per_chip"], case["num_hosts"])
    batches = _case_batches(case)
    collector = ProfileCollector(fc, topo)
    acc = collector.create_accumulator()
    for i, b in enumerate(batches):
        collector.add_step(acc, b, step=i)
    profile = collector.extract_output(acc)
    out = tmp_path_factory.mktemp("fdo")
    try:
        stats, _ = write_jax_fdo(profile, str(out), stacking=case["stacking"])
    except ProfileError as e:
        # A stack without ids has limits of 0, on which jax aborts; otherwise only jax's stacking is refused.
        refusal = {"tpu_embed": "mixes combiners", "jax": "is no stack the profile counted"}
        assert "received no ids" in str(e) or refusal.get(case["stacking"], "(never refused)") in str(e)
        return
    _check(stats, out, batches, jax_fdo, jax_limits)


# ---------------------------------------------------------------- an artifact's own stacking (`plan --artifact`)

# The MovieLens example with TensorFlow's stacks unlike jax's (`jax_examples.differing_stacks`), jax shards only:
# as bundled (2 hosts of one chip), 4 chips of 2 SparseCores on one host, and with two tables TF keeps alone and
# jax stacks ({case: (topology, tf_alone)}).
ARTIFACT_TOPOLOGIES = {"2hosts": (None, False), "4chips": ("{num_chips: 4, num_sc_per_chip: 2, num_hosts: 1}", False),
                       "tf_alone": (None, True)}


@pytest.fixture(scope="module")
def differing_artifacts(tmp_path_factory):
    import functools

    from tests.conformance.jax_examples import differing_stacks, example_artifact
    built = {}

    def get(name):
        if name not in built:
            topology, tf_alone = ARTIFACT_TOPOLOGIES[name]
            edit = functools.partial(differing_stacks, topology=topology, tf_alone=tf_alone)
            spec, out, _, _ = example_artifact(tmp_path_factory.mktemp(name), "movielens", "jax", edit=edit)
            built[name] = (spec, out)
        return built[name]

    return get


def _recorded_limits(artifact) -> dict:
    from tpu_embed.artifact.manifest import read_manifest
    return {s["name"]: {"max_ids_per_partition": s["max_ids_per_partition"],
                        "max_unique_ids_per_partition": s["max_unique_ids_per_partition"],
                        "suggested_coo_buffer_size_per_device": s["coo_buffer_size_per_device"]}
            for s in read_manifest(artifact).shard_format.jax["stacks"]}


@pytest.mark.parametrize("name", sorted(ARTIFACT_TOPOLOGIES))
def test_artifact_fdo_files_cover_the_stacking_its_shards_were_written_with(name, differing_artifacts, tmp_path,
                                                                           jax_fdo, jax_limits, capsys):
    from pipelines import cli
    spec, artifact = differing_artifacts(name)
    profiles = os.path.join(artifact, "profiles")
    from tpu_embed.artifact.load import load_artifact
    from tpu_embed.sparsecore import layout_of
    tf_stacks = set(layout_of(load_artifact(artifact).model).stacks)
    assert {"User_id", "movie_id"} <= tf_stacks if ARTIFACT_TOPOLOGIES[name][1] else "User_id_movie_id" in tf_stacks
    # From the profile alone, neither TF's stacks nor jax's are exact for jax: refused, naming the way out.
    for stacking, refusal in (("tpu_embed", "mixes combiners"), ("jax", "is no stack the profile counted")):
        code = cli.main(["plan", "--profiles", profiles, "--format", "jax-fdo", "--jax-stacking", stacking,
                         "--output", str(tmp_path / "refused")])
        err = capsys.readouterr().err
        assert code == 1 and refusal in err and "--artifact DIR" in err and err.count("\n") == 1, err

    # With the artifact: every stack its shards were written with, at the limits its manifest records.
    out = tmp_path / "fdo"
    assert cli.main(["plan", "--artifact", artifact, "--format", "jax-fdo", "--output", str(out)]) == 0
    stats = artifact_jax_fdo_stats(artifact, ProfileStore(profiles).read())
    written = json.loads((out / "tpu_embed_jax_fdo.json").read_text())
    assert written["stacking"] == "jax" and written["artifact"]["directory"] == artifact
    assert written["stacks"] == json.loads(json.dumps(stats.to_json([])["stacks"]))
    recorded = _recorded_limits(artifact)
    assert list(stats.stacks) == list(recorded) and stats.limits() == recorded
    # The stacks TF's profile did not count come from the manifest, the others keep the profile's partitions.
    sources = {n: s.source for n, s in stats.stacks.items()}
    assert sources == {"age_genres": "manifest", "movie_id_User_id": "manifest", "occupation": "profile",
                       "title": "profile", "zip": "profile"}, sources
    _check(stats, out, _example_batches(spec, artifact), jax_fdo, jax_limits)

    # Without a profile (a spec without profile_data_directory, or its directory gone): the manifest alone.

    bare = str(tmp_path / "bare")
    shutil.copytree(artifact, bare)
    shutil.rmtree(os.path.join(bare, "profiles"))
    out2 = tmp_path / "fdo-bare"
    assert cli.main(["plan", "--artifact", bare, "--format", "jax-fdo", "--output", str(out2)]) == 0
    alone = artifact_jax_fdo_stats(bare)
    assert alone.limits() == recorded and {s.source for s in alone.stacks.values()} == {"manifest"}
    _check(alone, out2, _example_batches(spec, bare), jax_fdo, jax_limits)
    # The profile's stackings need the profile, and say so.
    code = cli.main(["plan", "--artifact", bare, "--format", "jax-fdo", "--jax-stacking", "none",
                     "--output", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code == 1 and "no profile" in err and "'jax' stacking" in err and err.count("\n") == 1, err


def test_window_fdo_files_cover_every_day_of_the_window(tmp_path_factory, jax_fdo, jax_limits):
    """`plan --artifact DAY1 DAY2 --format jax-fdo`: the limits of a window of days as
    `tpu_embed.jax.input_iterator([day1, day2])` reads it (each stack's maxima over the days), on a two-day
    lineage whose jax stacks are not TF's (genres sums, the other tables mean: one TF stack, two jax stacks).
    jax's client loads them, its update sets them, and its preprocessing of every step of both days drops
    nothing and reaches them."""
    from pipelines import cli, runner
    from pipelines.jobs import JobConfig
    from pipelines.sharding import step_records
    from tests.conformance.jax_examples import mapped_steps
    from tests.helpers import lineage_days
    from tpu_embed.artifact.manifest import read_manifest
    from tpu_embed.sparsecore import jax_layout as J
    from tpu_embed.sparsecore import layout_of

    d = str(tmp_path_factory.mktemp("fdo-window"))
    lineage_days.split(d, parts=2)
    outs, specs = [], []
    for k in (1, 2):
        spec = lineage_days.spec([f"day{k}.csv"], d, tables=[{"name": "genres", "dim": 8, "combiner": "sum"}],
                                 shards={"layout": "jax"})
        outs.append(f"{d}/day{k}")
        specs.append(spec)
        runner.run_all(JobConfig(spec=spec, output=outs[-1], base=outs[-2] if k > 1 else None))
    ms = [read_manifest(o) for o in outs]
    model = ProfileStore(os.path.join(outs[-1], "profiles")).read().model
    assert list(layout_of(model).stacks) == ["genres_occupation_title_user_id_zip"]
    assert ms[-1].profile.days == [1, 2]  # day 2's profile merged day 1's: it covers the window's steps

    fdo = tmp_path_factory.mktemp("fdo-window-files")
    assert cli.main(["plan", "--artifact", *outs, "--format", "jax-fdo", "--output", str(fdo)]) == 0
    stats = artifact_jax_fdo_stats(outs, ProfileStore(os.path.join(outs[-1], "profiles")).read())
    written = json.loads((fdo / "tpu_embed_jax_fdo.json").read_text())
    assert written["artifact"]["window"] == outs and written["steps"] == sum(m.shards.steps for m in ms)
    assert written["stacks"] == json.loads(json.dumps(stats.to_json([])["stacks"]))
    per_day = [_recorded_limits(o) for o in outs]
    window = {n: {k: max(p[n][k] for p in per_day) for k in per_day[0][n]} for n in per_day[0]}
    assert stats.limits() == window
    assert {n: s.source for n, s in stats.stacks.items()} == {"genres": "profile",
                                                              "occupation_title_user_id_zip": "manifest"}
    # One day's limits alone do not hold the other's steps (else the window would show nothing).
    assert any(window[n] != per_day[k][n] for n in window for k in (0, 1)), per_day

    jl = J.jax_layout(model)
    local = [[{n: (hf.row_splits, hf.ids, hf.weights)
               for n, hf in step_records.jax_host_features(b, spec, jl, h).items()}
              for h in range(model.topology.num_hosts)]
             for spec, out in zip(specs, outs) for b in mapped_steps(spec, out)[1]]
    got = jax_fdo(dict(_description(stats, fdo), local_batches=local))
    assert "error" not in got, got["error"]
    assert got["limits"] == window
    assert got["steps"] == stats.steps and got["dropped"] == {n: 0 for n in stats.stacks}
    hosts = [stats.host_arrays(h) for h in range(model.topology.num_hosts)]
    for field, suffix in (("max_ids", "_max_ids"), ("max_unique_ids", "_max_unique_ids"),
                          ("required_buffer_size", "_required_buffer_size")):
        for name, s in stats.stacks.items():
            reached = max(int(np.max(o[field][name])) for o in got["observed"])
            assert reached == int(np.max([h[name + suffix] for h in hosts])), (field, name)
            if s.source == "profile":  # the merged profile's partitions are jax's over both days
                for h, observed in enumerate(got["observed"]):
                    np.testing.assert_array_equal(observed[field][name], hosts[h][name + suffix])
    helper = jax_limits(_description(stats, fdo))
    assert "error" not in helper, helper["error"]
    assert helper["limits"] == window
