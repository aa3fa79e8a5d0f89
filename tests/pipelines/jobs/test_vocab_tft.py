"""The `combine` vocabulary engine writes byte-identical files to tensorflow-transform's tft.vocabulary."""

from __future__ import annotations

import os

import pytest

from pipelines import runner
from pipelines.jobs import JobConfig
from tests.helpers import ROOT
from tpu_embed.artifact.spec import parse_spec

DATA = os.path.join(ROOT, "data")


def _spec(csv, categorical):
    return parse_spec({
        "inputs": {"format": "csv", "patterns": [os.path.join(DATA, csv)]},
        "categorical": categorical, "defaults": {"table": {"dim": 8}},
        "optimizer": {"type": "sgd", "learning_rate": 0.1}, "global_batch_size": 8})


CASES = {
    "criteo": _spec("criteo_sample.csv", [
        {"name": "C1", "vocabulary": {"top_k": 5}},
        {"name": "C2", "vocabulary": {"frequency_threshold": 2}},
        {"name": "C3", "table": "C3_C4"}, {"name": "C4", "table": "C3_C4"},  # one vocabulary over both
        {"name": "C6", "vocabulary": {"top_k": 3, "frequency_threshold": 5}},
    ]),
    "movielens": _spec("movielens_sample.csv", [
        {"name": "genres", "delimiter": "|", "vocabulary": {"top_k": 10}},
        {"name": "zip"},
        {"name": "movie_id", "vocabulary": {"frequency_threshold": 2}},  # integers as tokens
        {"name": "never", "column": "gender", "vocabulary": {"frequency_threshold": 1000}},  # empty vocabulary
    ]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_combine_engine_equals_tft(tmp_path, name):
    spec = CASES[name]
    out = {}
    for engine in ("tft", "combine"):
        d = str(tmp_path / engine)
        m = runner.run_vocab(JobConfig(spec=spec, output=d, vocab_engine=engine))
        out[engine] = (d, m)
    (dt, mt), (dc, mc) = out["tft"], out["combine"]
    for f in spec.categorical:
        a = open(os.path.join(dt, "vocab", f"{f.name}.txt"), "rb").read()
        b = open(os.path.join(dc, "vocab", f"{f.name}.txt"), "rb").read()
        assert a == b, f.name
    # TFT's own asset files are the source of the tft engine's copies.
    assert os.path.isdir(os.path.join(dt, "transform_fn", "transform_fn", "assets"))
    sizes = lambda m: {k: v["size"] for k, v in m["vocabularies"].items()}  # noqa: E731
    assert sizes(mt) == sizes(mc)
    if name == "movielens":
        assert mc["vocabularies"]["never"]["empty_vocabulary_dummy"] is True
