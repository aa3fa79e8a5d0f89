"""The YAML spec: validation messages name the key and the fix; conversions; fingerprint."""

from __future__ import annotations

import copy
import os

import pytest

from tests.helpers import ROOT
from tests.helpers.spec_fuzz import SPEC_WORDS, check_parse, spec_values
from tpu_embed.artifact.spec import SpecError, load_spec, parse_spec
from tpu_embed.compat.from_spec import embedding_config_spec

CRITEO = os.path.join(ROOT, "examples", "criteo", "spec.yaml")
MOVIELENS = os.path.join(ROOT, "examples", "movielens", "spec.yaml")

BASE = {
    "inputs": {"format": "csv", "patterns": ["x.csv"]},
    "label": {"column": "label"},
    "categorical": [{"name": "a"}, {"name": "b", "table": "shared"}, {"name": "c", "table": "shared"}],
    "defaults": {"table": {"dim": 8}},
    "optimizer": {"type": "adagrad", "learning_rate": 0.1},
    "topology": {"num_chips": 2},
    "global_batch_size": 16,
}


def with_(path, value):
    raw = copy.deepcopy(BASE)
    d = raw
    keys = path.split(".")
    for k in keys[:-1]:
        d = d[int(k)] if isinstance(d, list) else d[k]
    last = keys[-1]
    if isinstance(d, list):
        d[int(last)] = value
    else:
        d[last] = value
    return raw


@pytest.mark.parametrize("path,value,key,fix", [
    ("inputs.format", "json", "inputs.format", "csv"),
    ("inputs.patterns", [], "inputs.patterns", "--input"),
    ("global_batch_size", 12, "global_batch_size", "multiple of 8"),
    ("global_batch_size", "x", "global_batch_size", "positive integer"),
    ("topology", {"num_chips": 3}, "topology", "power of two"),
    ("categorical.0", {"name": "a", "vocabulary": {"type": "identity"}}, "categorical[0].vocabulary.num_buckets",
     "num_buckets"),
    ("categorical.0", {"name": "a", "vocabulary": {"top_k": 0}}, "categorical[0].vocabulary.top_k", "positive"),
    ("categorical.0", {"name": "a", "vocabulary": {"tpo_k": 5}}, "categorical[0].vocabulary.tpo_k", "allowed keys"),
    ("categorical.0", {"name": "a", "embedding_lookup_device": "tpu_tensor_core"},
     "categorical[0].tensor_core_width", "maximum number"),
    ("categorical.2", {"name": "c", "table": "shared", "vocabulary": {"top_k": 3}}, "categorical[2].vocabulary",
     "same vocabulary"),
    ("categorical.1", {"name": "a"}, "categorical[1].name", "unique"),
    ("optimizer", {"type": "adagrad"}, "optimizer", "learning_rate"),
    ("optimizer", {"type": "rmsprop"}, "optimizer.type", "sgd"),
    ("policies", {"tail": "wrap"}, "policies.tail", "drop"),
    ("limits", {"max_ids_per_table": {"s": 0}}, "limits.max_ids_per_table.s", "positive"),
])
def test_errors_name_key_and_fix(path, value, key, fix):
    with pytest.raises(SpecError) as e:
        parse_spec(with_(path, value))
    assert e.value.key == key
    assert f"spec key '{key}'" in str(e.value) and fix in str(e.value)


def test_unknown_top_level_key_and_missing_table_dim():
    raw = dict(BASE, extra=1)
    with pytest.raises(SpecError, match="extra"):
        parse_spec(raw)
    raw = copy.deepcopy(BASE)
    raw["defaults"] = {}
    with pytest.raises(SpecError, match=r"dim"):
        parse_spec(raw)


def test_examples_load_and_fingerprint_is_stable(tmp_path):
    c = load_spec(CRITEO)
    assert len(c.categorical) == 26 and len(c.dense) == 13 and c.tables[0].dim == 16
    assert c.fingerprint == load_spec(CRITEO).fingerprint
    # Data location does not change the fingerprint, the content does.
    assert c.with_inputs(["/elsewhere/*.csv"]).fingerprint == c.fingerprint
    raw = c.to_dict()
    raw["global_batch_size"] = 64
    assert parse_spec(raw).fingerprint != c.fingerprint
    # The normalized spec round-trips through YAML.
    p = tmp_path / "s.yaml"
    p.write_text(c.to_yaml())
    assert load_spec(str(p)).fingerprint == c.fingerprint
    m = load_spec(MOVIELENS)
    assert m.feature("genres").delimiter == "|"
    assert [f.name for f in m.tensor_core_features] == ["gender"]


def test_model_and_tf_feature_config_stack_the_same():
    from tpu_embed.core.model import ModelConfig
    from tpu_embed.sparsecore import stack_tables
    raw = copy.deepcopy(BASE)
    raw["categorical"] += [{"name": "e", "sequence_length": 2, "vocabulary": {"type": "identity", "num_buckets": 30}},
                           {"name": "d", "vocabulary": {"type": "hashing", "num_buckets": 40}}]
    # TF stacks tables by optimizer: a's and d's learning rates put them in stacks of their own.
    raw["tables"] = [{"name": "a", "learning_rate": 0.5}, {"name": "d", "learning_rate": 0.25}]
    spec = parse_spec(raw)
    sizes = {"a": 10, "shared": 20}
    model = spec.model(sizes)
    assert isinstance(model, ModelConfig) and model.topology == spec.topology
    assert [f.name for f in model.features] == ["a", "b", "c", "d", "e"]  # sorted: tf.nest order of the dict
    assert model.feature("b").table is model.feature("c").table and model.table("shared").vocabulary_size == 21
    assert model.feature("a").output_shape == (8,) and model.feature("e").output_shape == (8, 2)
    assert dict(model.table("a").optimizer.params)["learning_rate"] == 0.5
    tf_fc = spec.to_feature_config(sizes)
    assert list(tf_fc) == ["a", "b", "c", "d", "e"]
    assert tf_fc["b"].table is tf_fc["c"].table and tf_fc["b"].table.vocabulary_size == 21
    assert list(tf_fc["a"].output_shape) == [8] and tf_fc["d"].table.optimizer.learning_rate == 0.25
    la, lb = spec.layout(sizes), stack_tables(tf_fc, spec.topology)
    for layout in (la, lb):
        stack_of = {t: p.stack for t, p in layout.tables.items()}
        assert stack_of["shared"] == stack_of["e"]  # equal optimizers stack together
        assert len({stack_of["a"], stack_of["d"], stack_of["shared"]}) == 3
    assert {n: (s.tables, s.features) for n, s in la.stacks.items()} == \
        {n: (s.tables, s.features) for n, s in lb.stacks.items()}
    assert {t: (p.stack, p.rotation, p.shard_row_offset) for t, p in la.tables.items()} == \
        {t: (p.stack, p.rotation, p.shard_row_offset) for t, p in lb.tables.items()}
    assert [(f.path, f.stack, f.sample_offset) for f in la.features] == \
        [(f.path, f.stack, f.sample_offset) for f in lb.features]
    assert la.to_dict() == lb.to_dict()


def test_embedding_config_spec_from_spec(tmp_path):
    spec = parse_spec(BASE)
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    for f in ("a", "b", "c"):
        (vocab / f"{f}.txt").write_bytes(b"x\ny\n")
    ecs = embedding_config_spec(spec, str(vocab), vocab_sizes={"a": 2, "shared": 2})
    assert [c.feature_name for c in ecs.feature_columns] == ["a", "b", "c"]
    fc = ecs.to_feature_config(spec.per_chip_batch_size)
    assert fc["a"].table.vocabulary_size == 3 and fc["b"].table.name == "shared"


# ---------------------------------------------------------------- pydantic models: keys, types, defaults


@pytest.mark.parametrize("path,value,key", [
    ("extra", 1, "extra"),
    ("inputs", {"format": "csv", "patterns": ["x"], "csv": {"sep": ";"}}, "inputs.csv.sep"),
    ("label", {"column": "label", "col": 1}, "label.col"),
    ("dense", [{"name": "d"}, {"name": "e", "colum": "x"}], "dense[1].colum"),
    ("categorical.2", {"name": "c", "table": "shared", "vocabulary": {"topk": 10}}, "categorical[2].vocabulary.topk"),
    ("categorical.1", {"name": "b", "table": "shared", "weight": "w"}, "categorical[1].weight"),
    ("tables", [{"name": "a", "dims": 4}], "tables[0].dims"),
    ("defaults", {"table": {"dim": 8, "dims": 4}}, "defaults.table.dims"),
    ("defaults", {"table": {"dim": 8}, "categorical": {"vocabulary": {"topk": 1}}},
     "defaults.categorical.vocabulary.topk"),
    ("defaults", {"table": {"dim": 8}, "tables": {}}, "defaults.tables"),
    ("topology", {"num_chips": 2, "cores": 4}, "topology.cores"),
    ("limits", {"max_ids": 3}, "limits.max_ids"),
    ("policies", {"tail": "drop", "nan": "drop"}, "policies.nan"),
])
def test_unknown_keys_are_refused_with_their_full_location(path, value, key):
    with pytest.raises(SpecError) as e:
        parse_spec(with_(path, value))
    assert e.value.key == key
    assert "unknown key" in e.value.problem and "allowed keys are" in e.value.fix


@pytest.mark.parametrize("path,value,key,shown,fix", [
    ("categorical.0", {"name": "a", "vocabulary": {"top_k": "ten"}}, "categorical[0].vocabulary.top_k", "'ten'",
     "positive integer"),
    ("categorical.0", {"name": "a", "sequence_length": "2"}, "categorical[0].sequence_length", "'2'", "sequence"),
    ("categorical.0", {"name": "bad name"}, "categorical[0].name", "'bad name'", "letters, digits"),
    ("categorical.0", {"name": "a", "vocabulary": 7}, "categorical[0].vocabulary", "7", "frequency"),
    ("categorical.0", {"name": "a", "vocabulary": {"type": "bloom"}}, "categorical[0].vocabulary.type", "'bloom'",
     "identity"),
    ("global_batch_size", 16.0, "global_batch_size", "16.0", "positive integer"),
    ("tables", [{"name": "a", "dim": True}], "tables[0].dim", "True", "dim"),
    ("tables", [{"name": "a", "learning_rate": float("nan")}], "tables[0].learning_rate", "nan", "positive"),
    ("dense", [{"name": "d", "fill": "zero"}], "dense[0].fill", "'zero'", ""),
    ("limits", {"allow_id_dropping": "yes"}, "limits.allow_id_dropping", "'yes'", ""),
    ("limits", {"max_unique_ids_per_table": {"s": "many"}}, "limits.max_unique_ids_per_table.s", "'many'",
     "stacked table"),
    ("topology", {"chips": "two"}, "topology.chips", "'two'", ""),
    ("inputs", {"format": "csv", "patterns": ["x"], "csv": {"delimiter": ";;"}}, "inputs.csv.delimiter", "';;'",
     "e.g."),
    ("categorical", "a", "categorical", "'a'", "e.g. categorical"),
])
def test_wrong_types_name_the_location_the_value_and_the_fix(path, value, key, shown, fix):
    with pytest.raises(SpecError) as e:
        parse_spec(with_(path, value))
    assert e.value.key == key and shown in e.value.problem and fix in e.value.fix
    assert str(e.value).startswith(f"spec key '{key}': ")


def test_each_default_is_stated_once_in_its_field():
    from tpu_embed.artifact.spec import FrequencyVocabulary, LimitsSpec, PoliciesSpec
    spec = parse_spec(BASE)
    assert not spec.limits.given and spec.to_dict()["limits"] is None
    assert spec.limits.max_ids_per_chip_per_sample == LimitsSpec.model_fields["max_ids_per_chip_per_sample"].default
    for limits in ({}, None):
        s = parse_spec(with_("limits", limits))
        assert s.limits.max_ids_per_chip_per_sample == 64 and s.limits.max_ids_per_table == {}
        assert s.limits.given is (limits is not None)
    assert parse_spec(with_("limits", {})).to_dict()["limits"] == {
        "max_ids_per_chip_per_sample": 64, "max_ids_per_table": {}, "max_unique_ids_per_table": {},
        "allow_id_dropping": False}
    assert spec.policies == PoliciesSpec() and spec.policies.invalid_ids == "drop"
    v = spec.feature("a").vocabulary
    assert v == FrequencyVocabulary() and (v.type, v.top_k, v.num_oov_buckets) == ("frequency", None, 1)
    assert (spec.name, spec.profile_data_directory, spec.inputs.csv_delimiter) == ("spec", "profiles", ",")
    f = spec.feature("b")
    assert (f.column, f.table, f.sequence_length, f.embedding_lookup_device) == ("b", "shared", 0,
                                                                                  "tpu_embedding_core")
    assert (spec.table("a").combiner, spec.table("a").learning_rate) == ("mean", None)
    raw = copy.deepcopy(BASE)
    del raw["topology"]
    raw["global_batch_size"] = 4
    assert parse_spec(raw).topology.to_dict() == {"num_chips": 1, "num_sc_per_chip": 4, "num_hosts": 1}
    assert parse_spec(with_("topology", None)).topology.num_chips == 1
    # null means the default wherever a section has one
    for key in ("dense", "tables", "policies", "label", "optimizer"):
        raw = with_(key, None)
        if key == "optimizer":
            raw["tables"] = [{"name": "a", "optimizer": {"type": "sgd", "learning_rate": 1.0}},
                             {"name": "shared", "optimizer": {"type": "sgd", "learning_rate": 1.0}}]
        parse_spec(raw)
    assert parse_spec(with_("profile_data_directory", None)).profile_data_directory is None


def test_shorthands():
    raw = copy.deepcopy(BASE)
    raw.update(label="y", dense=["d1", {"name": "d2", "column": "d1"}], topology={"chips": 2, "sc_per_chip": 2,
                                                                               "hosts": 2})
    raw["inputs"]["patterns"] = "data/*.csv"
    raw["categorical"][0] = "a"
    spec = parse_spec(raw, base_dir="/base")
    assert spec.label.column == "y" and spec.label.fill is None
    assert [(d.name, d.column, d.fill) for d in spec.dense] == [("d1", "d1", 0.0), ("d2", "d1", 0.0)]
    assert spec.topology.to_dict() == {"num_chips": 2, "num_sc_per_chip": 2, "num_hosts": 2}
    assert spec.inputs.patterns == ("data/*.csv",) and spec.input_patterns() == ["/base/data/*.csv"]
    assert spec.feature("a").column == "a" and spec.table("a").dim == 8
    # a bare optimizer name is {type: name}: the seed-API class then asks for the learning rate
    with pytest.raises(SpecError) as e:
        parse_spec(with_("optimizer", "sgd"))
    assert e.value.key == "optimizer" and "learning_rate" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse_spec(with_("tables", [{"name": "a", "optimizer": "adagrad"}]))
    assert e.value.key == "tables[0].optimizer"


def test_vocabulary_defaults_merge_per_vocabulary_type():
    raw = copy.deepcopy(BASE)
    raw["defaults"]["categorical"] = {"vocabulary": {"top_k": 100, "num_oov_buckets": 2}}
    raw["categorical"] = [{"name": "a"}, {"name": "b", "vocabulary": {"type": "identity", "num_buckets": 10}},
                          {"name": "c", "vocabulary": {"type": "hashing", "num_buckets": 7}},
                          {"name": "d", "vocabulary": {"frequency_threshold": 3}}]
    spec = parse_spec(raw)
    assert spec.feature("a").vocabulary.to_dict() == {"type": "frequency", "top_k": 100, "frequency_threshold": None,
                                                      "num_oov_buckets": 2}
    assert spec.feature("b").vocabulary.to_dict() == {"type": "identity", "num_buckets": 10, "default_value": None}
    assert spec.feature("c").vocabulary.to_dict() == {"type": "hashing", "num_buckets": 7}
    assert (spec.feature("d").vocabulary.top_k, spec.feature("d").vocabulary.frequency_threshold) == (100, 3)
    # Identity defaults do not leak into frequency entries either; the entry's type wins over the default's.
    raw["defaults"]["categorical"] = {"vocabulary": {"type": "identity", "num_buckets": 50, "default_value": 0}}
    raw["categorical"] = [{"name": "a"}, {"name": "b", "vocabulary": {"type": "frequency", "top_k": 5}},
                          {"name": "c", "vocabulary": {"type": "hashing"}}]
    spec = parse_spec(raw)
    assert spec.feature("a").vocabulary.to_dict() == {"type": "identity", "num_buckets": 50, "default_value": 0}
    assert spec.feature("b").vocabulary.to_dict() == {"type": "frequency", "top_k": 5, "frequency_threshold": None,
                                                      "num_oov_buckets": 1}
    assert spec.feature("c").vocabulary.to_dict() == {"type": "hashing", "num_buckets": 50}
    # A key written on the entry itself that does not apply to its type is still an error.
    raw["categorical"][1] = {"name": "b", "vocabulary": {"type": "identity", "num_buckets": 10, "num_oov_buckets": 1}}
    with pytest.raises(SpecError) as e:
        parse_spec(raw)
    assert e.value.key == "categorical[1].vocabulary.num_oov_buckets"
    assert "does not apply to a identity vocabulary" in str(e.value) and "type: frequency" in e.value.fix


def test_specs_are_frozen_and_picklable():
    import pickle

    import pydantic
    spec = load_spec(MOVIELENS)
    with pytest.raises(pydantic.ValidationError):
        spec.global_batch_size = 8
    with pytest.raises(pydantic.ValidationError):
        spec.feature("genres").vocabulary.num_oov_buckets = 3
    again = pickle.loads(pickle.dumps(spec))
    assert again == spec and again.fingerprint == spec.fingerprint and again.base_dir == spec.base_dir
    assert again.limits.given is spec.limits.given and again.source_path == spec.source_path
    moved = spec.with_inputs("/data/*.csv", "/x")
    assert moved.input_patterns() == ["/data/*.csv"] and moved.base_dir == "/x" and spec.base_dir != "/x"
    assert spec.inputs.patterns == ("../../data/movielens_sample.csv",)


def test_both_examples_load():
    c, m = load_spec(CRITEO), load_spec(MOVIELENS)
    assert [d.name for d in c.dense][:2] == ["I1", "I2"] and c.feature("C7").vocabulary.top_k == 100000
    assert [t.name for t in c.tables] == [f"C{i}" for i in range(1, 27)] and c.optimizer["initial_accumulator"] == 0.1
    assert c.input_patterns() == [os.path.join(ROOT, "data", "criteo_sample.csv")] and not c.limits.given
    assert m.table("zip").optimizer == {"type": "sgd", "learning_rate": 0.1} and m.policies.tail == "pad"
    assert m.feature("user_id").vocabulary.num_buckets == 6041 and m.topology.num_hosts == 2
    assert m.feature("zip").vocabulary.frequency_threshold == 2 and m.label.column == "rating"
    for spec in (c, m):
        assert parse_spec(spec.to_dict()).to_dict() == spec.to_dict()


# ---------------------------------------------------------------- fuzz: only SpecError escapes

def test_fuzz_random_documents_raise_only_spec_errors():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.one_of(spec_values(), st.dictionaries(st.sampled_from(SPEC_WORDS), spec_values(), max_size=8)))
    def run(raw):
        check_parse(raw)

    run()


def _paths(node, prefix=()):
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        yield from _paths(v, prefix + (k,))


def test_fuzz_mutated_valid_specs_raise_only_spec_errors():
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    base = copy.deepcopy(BASE)
    base.update(dense=[{"name": "d", "fill": 1.0}], limits={"max_ids_per_table": {"s": 4}},
                policies={"tail": "pad"})
    base["categorical"].append({"name": "e", "vocabulary": {"type": "identity", "num_buckets": 10},
                                "sequence_length": 2})
    base["tables"] = [{"name": "e", "dim": 4, "optimizer": {"type": "sgd", "learning_rate": 0.5}}]
    paths = [p for p in _paths(base) if p]

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.sampled_from(paths), st.one_of(spec_values(), st.just(KeyError))), min_size=1,
                    max_size=3))
    def run(edits):
        raw = copy.deepcopy(base)
        for path, value in edits:
            node = raw
            try:
                for k in path[:-1]:
                    node = node[k]
                if value is KeyError:
                    del node[path[-1]]
                else:
                    node[path[-1]] = value
            except (KeyError, IndexError, TypeError):
                continue  # an earlier edit removed or replaced this path
        check_parse(raw)

    run()


def test_training_section_is_typed_and_not_fingerprinted():
    import yaml
    spec = load_spec(CRITEO)
    assert spec.training.pipeline_execution_with_tensor_core is False
    with open(CRITEO, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    raw["training"] = {"pipeline_execution_with_tensor_core": True}
    pipelined = parse_spec(raw, base_dir=spec.base_dir)
    assert pipelined.training.pipeline_execution_with_tensor_core is True
    assert pipelined.fingerprint == spec.fingerprint
    assert pipelined.to_dict()["training"] == {"pipeline_execution_with_tensor_core": True}
    raw["training"] = {"pipeline_execution_with_tensor_core": "yes"}
    with pytest.raises(SpecError, match="training.pipeline_execution_with_tensor_core"):
        parse_spec(raw)


def test_spec_errors_pickle_with_their_parts():
    import pickle
    e = pickle.loads(pickle.dumps(SpecError("a.b", "is wrong.", "fix it.")))
    assert (e.key, e.problem, e.fix) == ("a.b", "is wrong.", "fix it.")
    assert str(e) == "spec key 'a.b': is wrong. Fix: fix it."


def test_vocabulary_modes_and_capacity_are_validated_and_fingerprinted(tmp_path):
    spec = parse_spec(BASE)
    rebuild = parse_spec(with_("categorical.0", {"name": "a", "vocabulary": {"mode": "rebuild"}}))
    assert rebuild.fingerprint == spec.fingerprint and "mode" not in rebuild.to_dict()["categorical"][0]["vocabulary"]
    append = parse_spec(with_("categorical.0", {"name": "a", "vocabulary": {"mode": "append", "capacity": 100}}))
    assert append.fingerprint != spec.fingerprint  # it changes the ids and the table rows
    assert append.to_dict()["categorical"][0]["vocabulary"]["capacity"] == 100
    assert list(append.lineage_groups()) == ["a"] and not spec.lineage_groups()
    assert append.model({"a": 100, "shared": 7}).features[0].table.vocabulary_size == 101  # capacity + 1 bucket
    for vocab, key, problem in (
            ({"capacity": 10}, "categorical[0].vocabulary.capacity", "only applies to mode: append or frozen"),
            ({"mode": "append", "capacity": 10, "top_k": 11}, "categorical[0].vocabulary.top_k", "more than capacity"),
            ({"mode": "append", "capacity": 0}, "categorical[0].vocabulary.capacity", "must be >= 1"),
            ({"mode": "grow"}, "categorical[0].vocabulary.mode", "'grow' is not supported"),
            ({"type": "hashing", "num_buckets": 5, "mode": "append"}, "categorical[0].vocabulary.mode",
             "does not apply to a hashing vocabulary"),
            ({"type": "identity", "num_buckets": 5, "capacity": 5}, "categorical[0].vocabulary.capacity",
             "does not apply to a identity vocabulary")):
        with pytest.raises(SpecError) as e:
            parse_spec(with_("categorical.0", {"name": "a", "vocabulary": vocab}))
        assert e.value.key == key and problem in e.value.problem, (vocab, str(e.value))
    # A default mode applies to the frequency vocabularies only (hashing and identity have none).
    raw = with_("categorical", [{"name": "a"}, {"name": "h", "vocabulary": {"type": "hashing", "num_buckets": 5}}])
    raw["defaults"] = {"table": {"dim": 8}, "categorical": {"vocabulary": {"mode": "append", "capacity": 50}}}
    spec = parse_spec(raw)
    assert spec.feature("a").vocabulary.capacity == 50 and spec.feature("h").vocabulary.mode == "rebuild"
    # `base` is where the previous artifact lives: resolved against the spec file, not fingerprinted.
    based = parse_spec({**BASE, "base": "../day1"}, base_dir=str(tmp_path / "specs"))
    assert based.fingerprint == parse_spec(BASE).fingerprint
    assert based.base_artifact() == str(tmp_path / "day1") and based.to_dict()["base"] == "../day1"
