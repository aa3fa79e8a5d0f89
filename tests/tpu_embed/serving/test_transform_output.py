"""tf.Transform users: the transform output of an artifact, loaded with tensorflow-transform
(`tft.TFTransformOutput(...).transform_features_layer()`), gives the ids, weights and dense values the shards
hold for the example specs' rows, fed as TFX parses them (`raw_feature_spec()`: VarLen strings)."""

import csv

import pytest
import tensorflow as tf

from pipelines.cli import main as cli_main
from tests.tpu_embed.serving.shards import assert_serves_the_shards, from_transformed
from tpu_embed.serving import write_transform_output

pytestmark = pytest.mark.slow  # the example specs' jobs


def _example(row, columns) -> bytes:
    feats = {c: tf.train.Feature(bytes_list=tf.train.BytesList(value=[row[c].encode()]))
             for c in columns if row[c] != ""}
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


@pytest.mark.parametrize("name,via", [("criteo", "api"), ("movielens", "cli")])
def test_transform_features_layer_gives_the_shards_ids(example_artifacts, name, via, tmp_path, capsys):
    import tensorflow_transform as tft
    spec, d = example_artifacts[name]
    path = str(tmp_path / "transform_output")
    if via == "api":
        assert write_transform_output(d, path) == path
    else:  # `tpu-embed transform-output ARTIFACT --output DIR`
        assert cli_main(["transform-output", d, "--output", path]) == 0
        assert capsys.readouterr().out.strip() == f"transform output: {path} (tft.TFTransformOutput reads it)"
    tft_output = tft.TFTransformOutput(path)
    raw_spec = tft_output.raw_feature_spec()
    with open(spec.input_patterns()[0], newline="", encoding="utf-8") as fh:
        records = list(csv.DictReader(fh))
    parsed = tf.io.parse_example(tf.constant([_example(r, raw_spec) for r in records]), raw_spec)
    out = tft_output.transform_features_layer()(parsed)
    mapped = from_transformed(out, spec)
    assert mapped["valid"].numpy().all()
    n = assert_serves_the_shards(spec, d, mapped)
    for f in spec.categorical:
        assert tft_output.num_buckets_for_transformed_feature(f.name) > 0
    for key in spec.vocabulary_groups():
        assert tft_output.vocabulary_file_by_name(key) is not None, key
    print(f"\n[serving] {name}: transform_features_layer on {n} examples gives the shards' entries")


def test_the_command_refuses_a_directory_without_an_artifact_in_one_line(tmp_path, capsys):
    assert cli_main(["transform-output", str(tmp_path / "nothing")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tpu-embed transform-output: "), err
