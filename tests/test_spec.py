"""The YAML spec: validation messages name the key and the fix; conversions; fingerprint."""

from __future__ import annotations

import copy
import os

import pytest

from tpu_embed.spec import SpecError, load_spec, parse_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    from tpu_embed.model import ModelConfig
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
    ecs = spec.to_embedding_config_spec(str(vocab), vocab_sizes={"a": 2, "shared": 2})
    assert [c.feature_name for c in ecs.feature_columns] == ["a", "b", "c"]
    fc = ecs.to_feature_config(spec.per_chip_batch_size)
    assert fc["a"].table.vocabulary_size == 3 and fc["b"].table.name == "shared"
