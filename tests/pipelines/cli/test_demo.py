"""`tpu-embed demo` end to end on a reduced data size: data -> jobs -> plan -> DLRM with HostEmbedding -> report;
and `--days 2`: a lineage of two days (append under capacities), day 2 warm-started from day 1's checkpoint
against a cold start, the model exported as a SavedModel that scores the held-out raw rows as the shards did."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from pipelines import demo, demo_data
from tpu_embed.artifact.manifest import read_manifest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("demo") / "demo")
    lines = []
    # The SavedModel export and its scoring are checked once, on the two-day run (they cost a minute).
    cfg = demo.DemoConfig(num_examples=40_000, global_batch_size=1024, num_files=2, log_every=10, serving=False)
    summary = demo.run_demo(out, cfg=cfg, say=lines.append)
    return out, summary, lines


@pytest.fixture(scope="module")
def two_days(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("demo2") / "demo")
    lines = []
    cfg = demo.DemoConfig(num_examples=40_000, global_batch_size=1024, num_files=2, log_every=10, days=2)
    summary = demo.run_demo(out, cfg=cfg, say=lines.append)
    return out, summary, lines


def test_generated_records_are_tf_examples():
    import tensorflow as tf
    cols = demo_data.generate(50, seed=7)
    records = demo_data.encode_examples(cols, 0, 50)
    for i in (0, 17, 49):
        ex = tf.train.Example.FromString(records[i])
        f = ex.features.feature
        assert set(f) == {"label", *demo_data.DENSE, *demo_data.CATEGORICAL, "tags", "categories", "query",
                          "query_weights", "history"}
        assert f["I4"].float_list.value[0] == pytest.approx(float(cols["I4"][i]))
        assert len(f["C7"].bytes_list.value) == 1 and len(f["C7"].bytes_list.value[0]) == 8
        lengths, _ = cols["tags"]
        assert len(f["tags"].bytes_list.value) == lengths[i]
        wl, wv = cols["query_weights"]
        start = int(np.sum(wl[:i]))
        np.testing.assert_allclose(f["query_weights"].float_list.value, wv[start:start + wl[i]])
        assert len(f["query"].bytes_list.value) == wl[i]
        # protobuf's own encoding of the parsed message is the same bytes (fields in our order)
        assert ex.ByteSize() == len(records[i])


def test_generation_is_seeded():
    a, b = demo_data.generate(1000, seed=3), demo_data.generate(1000, seed=3)
    assert demo_data.encode_examples(a, 0, 1000) == demo_data.encode_examples(b, 0, 1000)
    assert 0.05 < a["label"].mean() < 0.5


def test_demo_end_to_end(demo_run):
    out, summary, lines = demo_run
    text = "\n".join(lines)
    artifact = summary["artifact"]
    m = read_manifest(artifact)
    assert m.counts.steps == 39 and m.limits.source.startswith("planned")
    # The plan table: limits against TF's defaults, memory, drop rate, balance.
    assert "(TF 256)" in text and "KiB" in text and "drop rate" in text and "balance" in text
    assert "max_ids_per_chip_per_sample" in text
    # Balanced ids: the table of frequency order against them, and the target on the demo's data (per step
    # within 5 % of the floor and at most 1.10 where the floor allows; max_ids_per_table >= 20 % lower where
    # frequency order is >= 1.3x its floor).
    assert "frequency -> balanced" in text and "floor" in text
    from profiles import load_plan
    balance = load_plan(summary["plan"]).balance
    assert balance["ids"] == "balanced"
    for name, s in balance["stacks"].items():
        floor, f, b = s["floor"]["step_balance"], s["orders"]["frequency"], s["orders"]["balanced"]
        assert b["step_balance"] <= 1.05 * floor and (floor > 1.10 or b["step_balance"] <= 1.10), (name, b, floor)
        if f["step_balance"] >= 1.3 * floor:
            assert b["max_ids_per_table"] <= 0.8 * f["max_ids_per_table"], (name, f, b)
    # Training: loss falls; held-out AUC above chance.
    t = summary["train"]
    assert t["train_steps"] == 35 and t["eval_steps"] == 4
    assert t["last_loss"] < t["first_loss"]
    assert t["eval_auc"] > 0.55, t
    assert "steps/s" in text and "AUC" in text
    # Report and summary.
    report = summary["report"]
    assert os.path.exists(report)
    pngs = [f for f in os.listdir(os.path.dirname(report)) if f.endswith(".png")]
    assert len(pngs) >= 4
    assert "Next:" in text and f"tpu-embed inspect {artifact}" in text
    assert json.load(open(os.path.join(out, demo.MARKER)))["status"] == "done"


def test_demo_replaces_only_an_earlier_demo_and_only_what_it_wrote(tmp_path):
    """An earlier demo's entries (demo.json marks the directory) are replaced, other files kept; a directory with
    files and no demo.json is refused, nothing deleted (the whole demo twice: test_cli_first_hour.py)."""
    earlier = tmp_path / "earlier"
    (earlier / "data").mkdir(parents=True)
    (earlier / "data" / "part-0.tfrecord").write_text("x")
    (earlier / demo.MARKER).write_text("{}")
    (earlier / "spec.yaml").write_text("x")
    (earlier / "notes.txt").write_text("mine")
    assert demo.prepare_output(str(earlier)) == [demo.DATA_DIR, demo.MARKER, "spec.yaml"]
    assert sorted(os.listdir(earlier)) == ["notes.txt"]
    other = tmp_path / "not_a_demo"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    (other / "data").mkdir()
    with pytest.raises(demo.DemoError, match="did not write"):
        demo.prepare_output(str(other))
    assert sorted(os.listdir(other)) == ["data", "precious.txt"]


def test_auc():
    assert demo.auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8])) == pytest.approx(0.75)
    assert demo.auc(np.array([0, 1, 0, 1]), np.array([0.5, 0.5, 0.5, 0.5])) == pytest.approx(0.5)


def test_two_days_keep_ids_and_the_warm_start_beats_a_cold_start(two_days):
    out, summary, lines = two_days
    text = "\n".join(lines)
    day1, day2 = (d["artifact"] for d in summary["days"])
    m1, m2 = read_manifest(day1), read_manifest(day2)
    assert (m1.lineage.day, m2.lineage.day, m2.lineage.base.day) == (1, 2, 1)
    capacities = demo_data.append_capacities(20_000)
    for key, info in m2.vocabularies.items():
        assert (info.mode, info.capacity) == ("append", capacities[key])
        v1, v2 = (open(os.path.join(d, "vocab", f"{key}.txt"), "rb").read().split(b"\n")[:-1] for d in (day1, day2))
        assert v2[:len(v1)] == v1, key  # every day-1 token keeps its id
    assert m1.vocab_sizes == m2.vocab_sizes and m2.lineage.table_rows_changed == []  # the checkpoint fits as is
    assert sum(v.new_tokens for v in m2.vocabularies.values()) > 0
    assert m2.vocabularies["history"].capacity_overflow_tokens > 0  # a full capacity, counted
    assert "day 2, base ../artifact-day1 (day 1)" in text and "over capacity" in text
    warm, cold = summary["days"][1]["warm"], summary["days"][1]["cold"]
    assert warm["train_steps"] == cold["train_steps"] == 17 and warm["eval_examples"] == cold["eval_examples"]
    assert warm["eval_loss"] < cold["eval_loss"], (warm, cold)
    assert f"log loss {warm['eval_loss']:.4f} warm vs {cold['eval_loss']:.4f} cold" in text
    assert summary["train"] == warm and json.load(open(os.path.join(out, demo.MARKER)))["status"] == "done"


def test_the_saved_model_scores_the_held_out_raw_rows_as_the_shards(two_days):
    out, summary, lines = two_days
    s = summary["serving"]
    assert s["path"] == os.path.join(out, demo.MODEL_DIR) and os.path.exists(os.path.join(s["path"], "saved_model.pb"))
    assert s["examples"] == summary["days"][1]["warm"]["eval_examples"] == 2048
    assert s["max_abs_difference"] < 1e-4
    assert s["auc_saved_model"] == pytest.approx(s["auc_shards"], abs=1e-6)
    assert s["auc_shards"] == pytest.approx(summary["days"][1]["warm"]["eval_auc"])
    assert f"AUC {s['auc_saved_model']:.4f} from the SavedModel, {s['auc_shards']:.4f} from the shards" in \
        "\n".join(lines)


def test_held_out_records_are_the_inputs_in_order(tmp_path):
    paths = demo_data.write_dataset(str(tmp_path), 100, seed=5, num_files=3)
    from tpu_embed.artifact import tfrecord
    every = [r for p in paths for r in tfrecord.read_records(p)]
    assert demo.held_out_records([str(tmp_path / "part-*.tfrecord")], 30, 40) == every[30:70]  # across files
    assert demo.held_out_records([str(tmp_path / "part-*.tfrecord")], 90, 10) == every[90:]


def test_the_append_spec_and_the_command_line(tmp_path):
    from pipelines import cli
    from tpu_embed.artifact.spec import load_spec
    capacities = demo_data.append_capacities(250_000)
    assert capacities["C9"] == 3 and capacities["C3"] == 62_500 and capacities["history"] == 62_500
    path = str(tmp_path / "spec.yaml")
    open(path, "w").write(demo_data.spec_text(["data/day1/part-*.tfrecord"], path, 1024, capacities))
    spec = load_spec(path)
    for f in spec.categorical:
        assert (f.vocabulary.mode, f.vocabulary.capacity) == ("append", capacities[f.name]), f.name
    plain = str(tmp_path / "plain.yaml")
    open(plain, "w").write(demo_data.spec_text(["data/part-*.tfrecord"], plain))
    assert {f.vocabulary.mode for f in load_spec(plain).categorical} == {"rebuild"}
    args, _ = cli.build_parser().parse_known_args(["demo", "--days", "2", "--no-serving"])
    assert (args.days, args.serving) == (2, False)
    args, _ = cli.build_parser().parse_known_args(["demo"])
    assert (args.days, args.serving) == (1, True)
    with pytest.raises(demo.DemoError, match="--days 3"):
        demo.run_demo(str(tmp_path / "d"), cfg=demo.DemoConfig(days=3))
