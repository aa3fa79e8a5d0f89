"""ProfileStore: stable names, atomic writes, round trips, sharing, and clear refusals."""

import json
import os
import warnings

import pytest

import profiles
from profiles import (
    CorruptProfileError,
    MissingProfileError,
    ProfileCollector,
    ProfileError,
    ProfileMismatchError,
    ProfileStore,
    SchemaVersionError,
    synthetic,
)
from profiles.units import GlobalConfig, table_key, table_unit
from tpu_embed.core.canonical import fingerprint
from tpu_embed.core.model import from_tf_feature_config
from tpu_embed.core.topology import Topology

FC = synthetic.feature_config(3, per_chip_batch=8, vocab_sizes=[40, 500, 70], shared=1)
TOPO = Topology(2, 4)


def _profile(fc=FC, topo=TOPO, steps=4, seed=0, candidates=(1, 4)):
    col = ProfileCollector(fc, topo, candidate_chip_counts=candidates)
    acc = col.create_accumulator()
    for i, b in enumerate(synthetic.global_batches(fc, topo.num_chips, steps, seed=seed)):
        col.add_step(acc, b, step=i)
    return col.extract_output(acc)


@pytest.fixture(scope="module")
def profile():
    return _profile()


def test_round_trip_and_file_names(tmp_path, profile):
    paths = ProfileStore(tmp_path).write(profile)
    names = sorted(os.path.basename(p) for p in paths)
    assert len([n for n in names if n.startswith("table-")]) == 3
    assert len([n for n in names if n.startswith("stack-")]) == len(profile.stacks)
    assert len([n for n in names if n.startswith("model-")]) == 1
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-")]  # no temp files left
    for name, tp in profile.tables.items():
        assert os.path.exists(tmp_path / f"table-{tp.key}.json")
        d = json.loads((tmp_path / f"table-{tp.key}.json").read_text())
        assert d["schema_version"] == profiles.SCHEMA_VERSION and d["kind"] == "table"
        assert d["table"]["name"] == name and d["global"]["num_chips"] == 2
        assert "summary" in d and d["summary"]["hot_ids"]
    back = ProfileStore(tmp_path).read()
    assert back == profile
    assert ProfileStore(tmp_path).read(model=profile.model.key[:8]) == profile
    assert ProfileStore(tmp_path).read_for(FC, TOPO) == profile


def test_keys_are_stable_and_depend_on_what_they_should(profile):
    t = table_unit(profile.model, "table_00")
    g = profile.global_config
    # A fixed digest: the hashing is part of the on-disk contract (see SCHEMA.md).
    assert fingerprint({"a": [1, 2], "b": "x"}) == fingerprint({"b": "x", "a": [1, 2]})
    assert len(table_key(t, g)) == 20
    import dataclasses
    assert table_key(dataclasses.replace(t, table=dataclasses.replace(t.table, optimizer_group="g9")), g) == \
        table_key(t, g)
    for change in (dict(vocabulary_size=41), dict(dim=16), dict(combiner="sqrtn"), dict(name="renamed")):
        assert table_key(dataclasses.replace(t, table=dataclasses.replace(t.table, **change)), g) != table_key(t, g)
    for change in (dict(num_chips=4), dict(num_hosts=2), dict(per_chip_batch=16), dict(num_sc_per_chip=2)):
        assert table_key(t, dataclasses.replace(g, **change)) != table_key(t, g)


def _one_table_file(tmp_path, profile):
    ProfileStore(tmp_path).write(profile)
    tp = profile.tables["table_01"]
    return tmp_path / f"table-{tp.key}.json"


def test_corrupt_json_is_refused_with_file_and_fix(tmp_path, profile):
    f = _one_table_file(tmp_path, profile)
    f.write_text('{"schema_version": 1, "kind": "table", oops}')
    with pytest.raises(CorruptProfileError, match=r"not valid JSON.*re-run the profile job") as e:
        ProfileStore(tmp_path).read()
    assert str(f) in str(e.value)


def test_truncated_file_is_refused(tmp_path, profile):
    f = _one_table_file(tmp_path, profile)
    text = f.read_text()
    f.write_text(text[: len(text) // 2])
    with pytest.raises(CorruptProfileError, match="truncated") as e:
        ProfileStore(tmp_path).read()
    assert str(f) in str(e.value)
    f.write_text("")
    with pytest.raises(CorruptProfileError, match="empty"):
        ProfileStore(tmp_path).read()


def test_schema_version_mismatch_is_refused(tmp_path, profile):
    f = _one_table_file(tmp_path, profile)
    d = json.loads(f.read_text())
    d["schema_version"] = 99
    f.write_text(json.dumps(d))
    want = rf"schema_version 99.*reads profile schema {profiles.SCHEMA_VERSION}"
    with pytest.raises(SchemaVersionError, match=want) as e:
        ProfileStore(tmp_path).read()
    assert str(f) in str(e.value)


def test_file_whose_content_does_not_match_its_name_is_refused(tmp_path, profile):
    f = _one_table_file(tmp_path, profile)
    d = json.loads(f.read_text())
    d["table"]["vocabulary_size"] += 1  # edited by hand: no longer hashes to its key
    f.write_text(json.dumps(d))
    with pytest.raises(ProfileMismatchError, match="hash to") as e:
        ProfileStore(tmp_path).read()
    assert str(f) in str(e.value)


def test_foreign_file_renamed_into_place_is_refused(tmp_path, profile):
    ProfileStore(tmp_path).write(profile)
    a = tmp_path / f"table-{profile.tables['table_00'].key}.json"
    b = tmp_path / f"table-{profile.tables['table_01'].key}.json"
    b.write_text(a.read_text())  # another table's statistics under table_01's name
    with pytest.raises(ProfileMismatchError, match="named for key"):
        ProfileStore(tmp_path).read()


def test_missing_files_and_empty_directory(tmp_path, profile):
    with pytest.raises(MissingProfileError, match="no model-"):
        ProfileStore(tmp_path).read()
    ProfileStore(tmp_path).write(profile)
    os.remove(tmp_path / f"stack-{next(iter(profile.stacks.values())).key}.json")
    with pytest.raises(MissingProfileError, match="is missing"):
        ProfileStore(tmp_path).read()


def test_atomic_write_leaves_old_file_on_failure(tmp_path, profile, monkeypatch):
    ProfileStore(tmp_path).write(profile)
    before = {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)}

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        ProfileStore(tmp_path).write(_profile(steps=2, seed=5))
    monkeypatch.undo()
    after = {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)}
    assert after == before  # nothing half-written, no temp files left behind


def test_shared_directory_reuses_matching_tables_only(tmp_path, profile):
    """A second model with table_00 and table_01 identical, table_02 different, same topology."""
    store = ProfileStore(tmp_path)
    store.write(profile)
    fc2 = synthetic.feature_config(3, per_chip_batch=8, vocab_sizes=[40, 500, 71], shared=1)
    other = _profile(fc2, steps=3, seed=1)
    assert other.tables["table_00"].key == profile.tables["table_00"].key
    assert other.tables["table_02"].key != profile.tables["table_02"].key
    store.write(other)
    assert len([n for n in os.listdir(tmp_path) if n.startswith("table-")]) == 4  # one new table file
    with pytest.raises(ProfileError, match="profiles of 2 models"):
        store.read()
    # Each model reads its own configuration back; shared files hold the last writer's statistics.
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        back = store.read(model=profile.model.key)
    assert back.tables["table_02"].stats == profile.tables["table_02"].stats
    assert back.tables["table_00"].stats == other.tables["table_00"].stats
    assert any(issubclass(x.category, profiles.StaleProfileWarning) for x in w)  # 3 vs 4 steps, said so
    # A different topology never picks up these files.
    moved = from_tf_feature_config(FC, Topology(4, 4))
    with pytest.raises(MissingProfileError, match="no profile of this exact configuration"):
        store.read_for(moved)
    assert store.read_table(table_unit(moved, "table_00"), GlobalConfig.of(moved)) is None


def test_merge_existing_accumulates_runs(tmp_path):
    whole = _profile(steps=6, seed=3)
    col = ProfileCollector(FC, TOPO, candidate_chip_counts=(1, 4))
    batches = list(synthetic.global_batches(FC, 2, 6, seed=3))
    runs = []
    for part in (range(0, 4), range(4, 6)):
        acc = col.create_accumulator()
        for i in part:
            col.add_step(acc, batches[i], step=i)
        runs.append(col.extract_output(acc))
    store = ProfileStore(tmp_path)
    store.write(runs[0])
    store.merge(runs[1])
    assert store.read() == whole
    # per-host directories merged into one
    hosts = [ProfileStore(tmp_path / f"host{i}") for i in range(2)]
    for h, r in zip(hosts, runs):
        h.write(r)
    dst = ProfileStore(tmp_path / "all")
    for h in hosts:
        dst.merge_from(h)
    assert dst.read() == whole


def test_merging_different_configurations_is_refused():
    a = _profile(steps=1)
    b = _profile(synthetic.feature_config(3, per_chip_batch=8, vocab_sizes=[40, 500, 71], shared=1), steps=1)
    with pytest.raises(ProfileMismatchError, match="different configurations"):
        profiles.merge_profiles([a, b])


def test_merge_existing_into_files_shared_with_another_model(tmp_path, profile):
    """No index of this model yet, but its table files exist (written by a model sharing them)."""
    store = ProfileStore(tmp_path)
    store.write(profile)
    fc2 = synthetic.feature_config(3, per_chip_batch=8, vocab_sizes=[40, 500, 71], shared=1)
    other = _profile(fc2, steps=3, seed=1)
    store.merge(other)
    with pytest.warns(profiles.StaleProfileWarning, match=r"different numbers of steps \[3, 7\]"):
        back = store.read(model=other.model.key)
    shared = back.tables["table_00"].stats
    assert shared.steps == profile.steps + other.steps
    want = profiles.merge_profiles([profile]).tables["table_00"].stats
    want.merge_from(other.tables["table_00"].stats)
    assert shared == want
