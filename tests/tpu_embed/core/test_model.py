"""tpu_embed.core.model: the one typed model, its optimizer groups, and the adapters at the TF boundary."""

import dataclasses
import pickle

import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_embed.core.model import (
    FeatureConfig,
    ModelConfig,
    OptimizerConfig,
    TableConfig,
    from_tf_feature_config,
    optimizer_group_of,
    to_tf_feature_config,
)
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore import layout_of, stack_tables

emb = tf.tpu.experimental.embedding

_TF_OPTIMIZERS = {
    "sgd": lambda lr, x: emb.SGD(learning_rate=lr, clip_weight_max=x),
    "adagrad": lambda lr, x: emb.Adagrad(learning_rate=lr, initial_accumulator_value=x or 0.1),
    "adam": lambda lr, x: emb.Adam(learning_rate=lr, beta_1=x or 0.9),
    "ftrl": lambda lr, x: emb.FTRL(learning_rate=lr, l1_regularization_strength=x or 0.0),
}


def _table(name, vocab=100, dim=8, combiner="sum", group=""):
    return TableConfig(name, vocab, dim, combiner, optimizer_group=group)


def test_optimizer_defaults_are_filled_in_so_equal_optimizers_group_together():
    short = OptimizerConfig.from_dict({"optimizer": "adagrad", "learning_rate": 0.1})
    spelled = OptimizerConfig.from_dict({"optimizer": "adagrad", "learning_rate": 0.1, "initial_accumulator": 0.1})
    assert short == spelled and short.group == spelled.group
    assert short.with_learning_rate(0.2).group != short.group
    assert OptimizerConfig.from_dict({"optimizer": "sgd", "learning_rate": 0.1}).group != short.group
    with pytest.raises(ValueError, match="not one of"):
        OptimizerConfig("rmsprop")
    with pytest.raises((TypeError, ValueError)):
        OptimizerConfig.from_dict({"optimizer": "adagrad", "learning_rate": 0.1, "beta1": 0.9})


@pytest.mark.parametrize("kind", sorted(_TF_OPTIMIZERS))
def test_tf_optimizers_round_trip(kind):
    tf_opt = _TF_OPTIMIZERS[kind](0.05, 0.5)
    ours = OptimizerConfig.from_tf(tf_opt)
    assert ours.kind == kind
    back = ours.to_tf()
    assert type(back) is type(tf_opt)
    if kind == "sgd":
        # The estimator-era SGD derives use_gradient_accumulation from gradient clipping (tpu_embed.core.optimizers);
        # without clipping SGD updates the same either way.
        back.use_gradient_accumulation = tf_opt.use_gradient_accumulation
    assert back == tf_opt


def test_callable_learning_rate_groups_by_identity_as_tf_hashes_it():
    def lr_a():
        return 0.1

    def lr_b():
        return 0.1

    a1, a2, b = (OptimizerConfig.from_tf(emb.Adagrad(learning_rate=f)) for f in (lr_a, lr_a, lr_b))
    assert a1.learning_rate_fn is lr_a and a1.group == a2.group != b.group
    assert a1.to_tf().learning_rate is lr_a
    # TF: the same function stacks, two functions do not.
    assert (hash(emb.Adagrad(learning_rate=lr_a)) == hash(emb.Adagrad(learning_rate=lr_a)))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(_TF_OPTIMIZERS)), st.sampled_from([0.1, 0.5, 0.1000001]),
                          st.sampled_from([None, 0.5, 0.25])), min_size=2, max_size=5))
def test_groups_partition_tables_exactly_as_tf_hash_does(specs):
    """TF stacks tables whose optimizers hash equal (`hash(tuple(__dict__.items()))`); our groups agree."""
    tf_opts = [_TF_OPTIMIZERS[k](lr, x) for k, lr, x in specs]
    ours = [optimizer_group_of(o) for o in tf_opts]
    via_model = [OptimizerConfig.from_tf(o).group for o in tf_opts]
    for i in range(len(tf_opts)):
        for j in range(len(tf_opts)):
            same_tf = type(tf_opts[i]) is type(tf_opts[j]) and hash(tf_opts[i]) == hash(tf_opts[j])
            assert (ours[i] == ours[j]) == same_tf
            assert (via_model[i] == via_model[j]) == same_tf


def test_from_and_to_tf_feature_config_stack_the_same():
    adagrad = emb.Adagrad(learning_rate=0.1)
    t1 = emb.TableConfig(vocabulary_size=1000, dim=16, name="t1", combiner="mean", optimizer=adagrad)
    t2 = emb.TableConfig(vocabulary_size=70, dim=8, name="t2", combiner="sqrtn", optimizer=emb.SGD(0.1))
    t3 = emb.TableConfig(vocabulary_size=500, dim=16, name="t3", combiner="sum",
                         optimizer=emb.Adagrad(learning_rate=0.1))
    fc = {"a": emb.FeatureConfig(table=t1, output_shape=[32]),
          "b": emb.FeatureConfig(table=t2, output_shape=[32, 3], max_sequence_length=3),
          "c": emb.FeatureConfig(table=t3, output_shape=[32]),
          "d": emb.FeatureConfig(table=t1, output_shape=[32])}
    topo = Topology(4, 4)
    model = from_tf_feature_config(fc, topo)
    assert [f.name for f in model.features] == ["a", "b", "c", "d"]
    assert model.feature("b").max_sequence_length == 3 and model.table_features("t1")[1].name == "d"
    assert layout_of(model) == stack_tables(fc, topo) == stack_tables(to_tf_feature_config(model), topo)
    assert [s.tables for s in layout_of(model).stacks.values()] == [("t1", "t3"), ("t2",)]


def test_list_nests_keep_their_order_through_the_tf_adapter():
    t = emb.TableConfig(vocabulary_size=64, dim=8, name="t")
    nest = [emb.FeatureConfig(table=t, output_shape=[8]) for _ in range(12)]
    model = from_tf_feature_config(nest, Topology(2, 4))
    assert [f.name for f in model.features] == [str(i) for i in range(12)]
    tf_fc = to_tf_feature_config(model)
    assert isinstance(tf_fc, list)  # '10' sorts before '2': a dict would reorder the sample offsets
    assert stack_tables(tf_fc, Topology(2, 4)) == layout_of(model)


def test_json_round_trip_and_pickle():
    opt = OptimizerConfig.from_dict({"optimizer": "adam", "learning_rate": 0.01})
    a = TableConfig("a", 1000, 16, "mean", opt)
    b = _table("b", group="label")
    model = ModelConfig((FeatureConfig("x", a, (16,)), FeatureConfig("y", b, (16, 4), 4),
                         FeatureConfig("z", a, (16,))), Topology(2, 4, 2))
    assert ModelConfig.from_json(model.to_json()) == model
    assert pickle.loads(pickle.dumps(model)) == model
    assert model.key == ModelConfig.from_json(model.to_json()).key and len(model.key) == 20
    assert model.tables == (a, b) and model.per_chip_batch == 16
    with pytest.raises(ValueError, match="version"):
        ModelConfig.from_json(dict(model.to_json(), version=99))


def test_invalid_models_say_what_is_wrong():
    t = _table("t")
    with pytest.raises(ValueError, match="no features"):
        ModelConfig((), Topology(1))
    with pytest.raises(ValueError, match="both named 'f'"):
        ModelConfig((FeatureConfig("f", t, (8,)), FeatureConfig("f", t, (8,))), Topology(1))
    with pytest.raises(ValueError, match="Two different tables are both named 't'"):
        ModelConfig((FeatureConfig("f", t, (8,)), FeatureConfig("g", dataclasses.replace(t, dim=16), (8,))),
                    Topology(1))
    with pytest.raises(ValueError, match="not divisible by 4 SparseCores"):
        ModelConfig((FeatureConfig("f", t, (6,)),), Topology(1))
    with pytest.raises(ValueError, match="no output_shape"):
        FeatureConfig("f", t, ())
    with pytest.raises(ValueError, match="combiner"):
        TableConfig("t", 10, 8, "max")
    with pytest.raises(ValueError, match=">= 1"):
        TableConfig("t", 0, 8)
    with pytest.raises(ValueError, match="laid out for"):
        from_tf_feature_config(ModelConfig((FeatureConfig("f", t, (8,)),), Topology(1)), Topology(2))


def test_tables_features_and_hash_are_kept_per_model_and_never_pickled():
    """A model computes its tables, features per table and hash once (the statistics ask for them many times a
    step); the kept values are what a fresh computation gives, and a pickle carries none of them (the hash of
    strings differs between processes)."""
    a, b, c = _table("b_t", 300), _table("a_t", 200), _table("c_t", 100)
    feats = (FeatureConfig("f1", a, (64,)), FeatureConfig("f2", b, (64,)), FeatureConfig("f3", a, (64, 2)),
             FeatureConfig("f4", c, (64,)))
    model = ModelConfig(feats, Topology(num_chips=4))
    twin = ModelConfig(tuple(feats), Topology(num_chips=4))
    assert [t.name for t in model.tables] == ["a_t", "b_t", "c_t"] and model.tables is model.tables
    assert [f.name for f in model.table_features("b_t")] == ["f1", "f3"]
    assert model.table_features("a_t") == (feats[1],) and model.table_features("nope") == ()
    assert hash(model) == hash(twin) == hash((feats, Topology(num_chips=4))) and model == twin
    assert {model: 1}[twin] == 1
    state = model.__getstate__()
    assert set(state) == {"features", "topology"}  # after every kept value was computed above
    back = pickle.loads(pickle.dumps(model))
    assert not {"_hash", "_tables", "_table_features"} & set(back.__dict__)
    assert back == model and hash(back) == hash(model)
    assert back.tables == model.tables and back.table_features("b_t") == model.table_features("b_t")
    other = dataclasses.replace(model, topology=Topology(num_chips=8))
    assert other != model and other.tables == model.tables and hash(other) != hash(model)
