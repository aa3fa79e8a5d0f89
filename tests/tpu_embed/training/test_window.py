"""Windows of days (`input_fn([day1, day2, day3])`, `distribute_steps`): a three-day MovieLens lineage (the
sample split by its timestamp) read as one window equals each day read alone, one after the other; a
shuffled window is the permutation `step_order` of the whole window's steps; windows one model cannot read
are refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tpu_embed
from tests.helpers import ROOT, jobs, lineage_days
from tpu_embed import training
from tpu_embed.artifact import lineage
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.training.input import step_order, window_format

pytestmark = pytest.mark.slow  # builds a three-day lineage with the real jobs


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("window"))
    return {"dir": d, "outs": lineage_days.build(d, parts=3)}


def _elements(ds):
    return [_numpy(el) for el in ds]


def _numpy(x):
    if isinstance(x, dict):
        return {k: _numpy(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return [_numpy(v) for v in x]
    return x.numpy()


def _assert_same(window_el, alone_el, path=""):
    """Equal, a CSR buffer of the day read alone zero-padded to the window's length (a larger buffer holds
    zeros beyond the prefix)."""
    if isinstance(window_el, dict):
        assert sorted(window_el) == sorted(alone_el), path
        for k in window_el:
            _assert_same(window_el[k], alone_el[k], f"{path}/{k}")
    elif isinstance(window_el, list):
        assert len(window_el) == len(alone_el), path
        for i, (a, b) in enumerate(zip(window_el, alone_el)):
            _assert_same(a, b, f"{path}/{i}")
    else:
        a, b = np.asarray(window_el), np.asarray(alone_el)
        if a.ndim == 1 and b.ndim == 1 and len(a) > len(b):
            assert not a[len(b):].any(), path
            a = a[:len(b)]
        np.testing.assert_array_equal(a, b, err_msg=path)


def test_a_window_reads_each_day_in_turn(days):
    outs = days["outs"]
    ms = [read_manifest(o) for o in outs]
    assert [m.lineage.day for m in ms] == [1, 2, 3]
    window = _elements(tpu_embed.input_fn(outs))
    alone = [el for o in outs for el in _elements(tpu_embed.input_fn(o))]
    assert len(window) == len(alone) == sum(m.shards.steps for m in ms)
    for w, a in zip(window, alone):
        _assert_same(w, a)
    # Buffers: the window's are the largest of its days (the newest day's: its plan covers every day).
    fmt = window_format(outs, ms)
    assert fmt.stacks == ms[-1].shard_format.stacks
    for m in ms:
        assert all(r >= r0 and i >= i0 for (_, r, i), (_, r0, i0) in zip(fmt.stacks, m.shard_format.stacks))
    # The reader through tpu_embed.artifact.io gives the same.
    for w, a in zip(_elements(tpu_embed.input_fn(outs, reader="io")), window):
        _assert_same(w, a)


def test_a_shuffled_window_permutes_every_step_of_the_window(days):
    outs = days["outs"]
    window = _elements(tpu_embed.input_fn(outs))
    shuffled = _elements(tpu_embed.input_fn(outs, shuffle_steps=11, num_epochs=2))
    n = len(window)
    assert len(shuffled) == 2 * n
    for epoch in range(2):
        order = step_order(n, 11, epoch)
        for j, s in enumerate(order):
            _assert_same(shuffled[epoch * n + j], window[int(s)])
    # Steps of every day are mixed: the first day's steps are not all first.
    first_day = read_manifest(outs[0]).shards.steps
    assert sorted(step_order(n, 11, 0)[:first_day].tolist()) != list(range(first_day))


def test_per_chip_elements_of_a_window(days):
    outs = days["outs"]
    per_chip = _elements(training.per_chip_dataset(outs, 0))
    alone = [el for o in outs for el in _elements(training.per_chip_dataset(o, 0))]
    assert len(per_chip) == len(alone)
    for w, a in zip(per_chip, alone):
        _assert_same(w, a)


DISTRIBUTE = """
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import tpu_embed
from tpu_embed import training
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
steps = training.distribute_steps(json.loads(sys.argv[1]), strategy, shuffle_steps=int(sys.argv[2]))
seen = []
for el in steps:
    seen.append([[int(x) for x in strategy.experimental_local_results(el[k])[r].numpy().ravel()[:1]]
                 + strategy.experimental_local_results(el["label"])[r].numpy().tolist()
                 for r in range(2) for k in ("chip",)])
print(json.dumps({"steps_per_epoch": steps.steps_per_epoch, "seen": seen}))
"""


def test_distribute_steps_over_a_window(days):
    outs = days["outs"]
    out = subprocess.run([sys.executable, "-c", DISTRIBUTE, json.dumps(outs), "5"], cwd=ROOT, capture_output=True,
                         text=True, check=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    got = json.loads(out.stdout.strip().splitlines()[-1])
    per_chip = _elements(training.per_chip_dataset(outs, 0, shuffle_steps=5))
    assert got["steps_per_epoch"] == sum(read_manifest(o).shards.steps for o in outs)
    expected = [[[int(per_chip[2 * s + r]["chip"])] + per_chip[2 * s + r]["label"].tolist() for r in range(2)]
                for s in range(len(per_chip) // 2)]
    assert got["seen"] == expected


def test_windows_one_model_cannot_read_are_refused(days, tmp_path):
    d1, d2, d3 = days["outs"]
    d = days["dir"]
    with pytest.raises(lineage.LineageError, match="give the days in order"):
        tpu_embed.input_fn([d2, d1])
    with pytest.raises(lineage.LineageError, match="give the days in order"):
        tpu_embed.input_fn([d1, d1])
    # Another lineage: day 2's data as a first day.
    other = str(tmp_path / "other")
    jobs.run(lineage_days.spec(["day2.csv"], d), other)
    with pytest.raises(lineage.LineageError, match="unrelated lineages"):
        tpu_embed.input_fn([d1, other])
    # A vocabulary without a capacity grows: the table rows differ, the layout with them.
    grows = {**lineage_days.VOCABULARIES, "zip": {"mode": "append", "num_oov_buckets": 2}}
    g1, g2 = str(tmp_path / "g1"), str(tmp_path / "g2")
    jobs.run(lineage_days.spec(["day1.csv"], d, grows), g1)
    jobs.run(lineage_days.spec(["day2.csv"], d, grows), g2, base=g1)
    with pytest.raises(lineage.LineageError, match=r"the table rows of vocabulary 'zip' differ .*give the vocabular"):
        tpu_embed.input_fn([g1, g2])
    with pytest.raises(lineage.LineageError, match="table rows of vocabulary 'zip'"):
        training.distribute_steps([g1, g2], None)
    # A vocabulary of mode rebuild beside them: its ids change from day to day.
    rebuilt = {**lineage_days.VOCABULARIES, "age": {}}
    r1, r2 = str(tmp_path / "r1"), str(tmp_path / "r2")
    jobs.run(lineage_days.spec(["day1.csv"], d, rebuilt), r1)
    jobs.run(lineage_days.spec(["day3.csv"], d, rebuilt), r2, base=r1)
    if open(os.path.join(r2, "vocab", "age.txt"), "rb").read().startswith(
            open(os.path.join(r1, "vocab", "age.txt"), "rb").read()):
        pytest.fail("the test's data no longer reorders 'age' between day 1 and day 3")
    with pytest.raises(lineage.LineageError, match=r"vocabulary 'age' of .* is not a prefix .*mode rebuild"):
        tpu_embed.input_fn([r1, r2])
    for bad in ([], d1 + "-missing"):
        with pytest.raises((lineage.LineageError, FileNotFoundError, ValueError)):
            tpu_embed.input_fn([bad] if isinstance(bad, str) else bad)


def test_a_day_parsed_to_larger_buffers_equals_its_records_parsed_with_them(days):
    """What a window does where its days' buffers differ (`window_format`): a day's records parsed with their
    own format and zero-padded equal the same records parsed with the larger buffers."""
    import dataclasses

    import tensorflow as tf

    from tpu_embed.artifact import tfrecord
    from tpu_embed.artifact.shard_records import shard_files
    from tpu_embed.training.input import _parser
    from tpu_embed.training.shard_parse import parse_fn
    out = days["outs"][0]
    fmt = read_manifest(out).shard_format
    for grow_rp, grow_ids in ((0, 64), (8, 16), (16, 4096)):  # 4096: ids buffers far larger than the data
        big = dataclasses.replace(fmt, stacks=tuple((s, r + grow_rp, i + grow_ids) for s, r, i in fmt.stacks))
        padded, direct = _parser(fmt, big), parse_fn(big)
        records = [r for f in shard_files(out, 0, read_manifest(out)) for r in tfrecord.stream_records(f, "none")]
        assert records
        for rec in records:
            _assert_same(_numpy(padded(tf.constant(rec))), _numpy(direct(tf.constant(rec))))
            a = _numpy(padded(tf.constant(rec)))["sparse_core"][0]
            assert all(len(v["row_pointers"]) == r and len(v["sorted_token_ids"]) == i
                       for (s, r, i), v in zip(big.stacks, [a[s] for s, _, _ in big.stacks]))


def test_a_compressed_window_read_shuffled_and_verified(days, tmp_path):
    """The shuffled reader over days whose files are compressed (each decompressed once, into a temporary file)
    and checked (sha256) gives what the uncompressed days give."""
    d = days["dir"]
    g1, g2 = str(tmp_path / "gz1"), str(tmp_path / "gz2")
    gz = {"shards": {"compression": "GZIP"}}
    jobs.run(lineage_days.spec(["day1.csv"], d, **gz), g1)
    jobs.run(lineage_days.spec(["day2.csv"], d, **gz), g2, base=g1)
    assert read_manifest(g2).shard_format.compression == "GZIP"
    got = _elements(tpu_embed.input_fn([g1, g2], shuffle_steps=3, verify="sha256"))
    want = _elements(tpu_embed.input_fn(days["outs"][:2], shuffle_steps=3))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        _assert_same(a, b)
