"""The value kinds the jobs record (the manifest's `value_kinds`) and the parse serving chooses from them: a key of
one kind is parsed as that kind, a key whose kinds differ between the reader's batches as any kind; a key mixed
within one batch was read as text (recorded `bytes_list`), so its other kinds are refused in one line by the typed
parse and read by the parse of any kind. Every case: serving ids = shard ids."""

import os

import pytest
import tensorflow as tf

from tests.tpu_embed.serving.generated import one_value_feature
from tests.tpu_embed.serving.shards import assert_serves_the_shards
from tpu_embed.artifact.spec import parse_spec
from tpu_embed.serving import RawFeatureMapping
from tpu_embed.serving.examples import typed_kinds

SPEC = {
    "name": "kinds", "inputs": {"format": "tfrecord", "patterns": ["in.tfrecord"]}, "label": {"column": "label"},
    "dense": [{"name": "x", "fill": -1.0}],
    "categorical": [{"name": "a", "vocabulary": {"type": "frequency", "num_oov_buckets": 1}},
                    {"name": "b", "vocabulary": {"type": "identity", "num_buckets": 10}}],
    "defaults": {"table": {"dim": 4}}, "optimizer": {"type": "sgd", "learning_rate": 0.1},
    "topology": {"num_chips": 1, "num_sc_per_chip": 2}, "global_batch_size": 4, "policies": {"tail": "pad"}}


def _write(d, first_as_ints: int):
    """8 Examples: `a` an int64 in the first `first_as_ints`, its decimal text (bytes) after; `b` int64, `x`
    float, `label` int64. Returns (spec, serialized Examples)."""
    from tpu_embed.artifact import tfrecord
    examples = []
    for i in range(8):
        a = i % 3 if i < first_as_ints else str(i % 3).encode()
        feats = {"a": a, "b": i, "x": i * 0.5, "label": i % 2}
        examples.append(tf.train.Example(features=tf.train.Features(
            feature={k: one_value_feature(v) for k, v in feats.items()})).SerializeToString())
    with open(os.path.join(d, "in.tfrecord"), "wb") as fh:
        fh.write(tfrecord.encode_file(examples))
    return parse_spec(SPEC, base_dir=d), examples


def _run(spec, d, **kwargs):
    from tests.helpers import jobs
    return jobs.run(spec, os.path.join(d, "artifact"), transform_output=False, **kwargs)


@pytest.mark.slow
def test_a_key_of_two_kinds_in_the_training_data_is_parsed_as_any_kind(tmp_path):
    """`a` is int64 in the reader's first batch and bytes in the second: recorded with both kinds, parsed as any
    kind (its int 1 and b"1" the same token); the other keys as their one kind. Ids = the shards'."""
    spec, examples = _write(str(tmp_path), first_as_ints=4)
    art = _run(spec, str(tmp_path), chunk_rows=4)
    mapping = RawFeatureMapping.from_artifact(art)
    assert mapping.value_kinds == {"a": ("bytes_list", "int64_list"), "b": ("int64_list",), "x": ("float_list",),
                                   "label": ("int64_list",)}
    assert typed_kinds(mapping.columns, mapping.value_kinds) == {"b": "int64_list", "x": "float_list"}
    out = mapping.map_examples(tf.constant(examples))
    assert_serves_the_shards(spec, art, out)
    ids = out["ids"]["a"].to_list()
    assert ids[1] == ids[4] == ids[7] and ids[0] == ids[3] == ids[6]  # 1, b"1", b"1"; 0, 0, b"0"


@pytest.mark.slow
def test_a_key_of_two_kinds_in_one_batch_was_read_as_text(tmp_path):
    """`a` of two kinds within one batch of the reader: read as text (its decimal text), recorded `bytes_list`.
    The typed parse refuses its int64 values in one line naming the key, the Example and both kinds; the parse
    of any kind gives the shards' ids."""
    spec, examples = _write(str(tmp_path), first_as_ints=4)
    art = _run(spec, str(tmp_path))
    mapping = RawFeatureMapping.from_artifact(art)
    assert mapping.value_kinds["a"] == ("bytes_list",)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"Key: a, Index: 0\.  Data types don't match\. Expected type: string, Actual type: int64"):
        mapping.map_examples(tf.constant(examples))
    full = mapping.map_examples(tf.constant(examples), any_kind=True)
    assert_serves_the_shards(spec, art, full)
    typed = mapping.map_examples(tf.constant(examples[4:]))  # the Examples holding `a` as bytes
    assert typed["ids"]["a"].to_list() == full["ids"]["a"].to_list()[4:]


def test_without_recorded_kinds_every_column_is_parsed_as_any_kind():
    assert typed_kinds(["a", "b"], None) == {}
    # a column no record held a value of (not listed): its values parsed as bytes
    assert typed_kinds(["a", "b", "c"], {"a": ["int64_list"], "b": ["bytes_list", "float_list"]}) == {
        "a": "int64_list", "c": "bytes_list"}
