"""Windows of days for JAX (`tpu_embed.jax.input_iterator([day1, day2])`): a two-day MovieLens lineage with
`shards: {layout: jax}` (two hosts; day 2's shards GZIP-compressed), read as one window, equals each day read
alone with the window's COO buffers, one day after the other; shuffled, it is `step_order` of the whole
window's steps; windows one model cannot read are refused in one line, by the rule `input_fn` uses
(`tpu_embed.artifact.lineage.window`)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import jobs, lineage_days
from tpu_embed.artifact import lineage
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.jax.input import input_iterator, step_order, window_jax_format
from tpu_embed.training.input import step_order as input_fn_step_order
from tpu_embed.training.input import window_format

pytestmark = pytest.mark.slow  # builds a lineage with the real jobs

TOPOLOGY = {"num_chips": 2, "num_sc_per_chip": 4, "num_hosts": 2}


def _run(d, name, day_csv, shards, base=None, out_dir=None):
    """Day `day_csv` of the split under `d` run into `out_dir` (default `d`)/`name`, with these shards."""
    out = f"{out_dir or d}/{name}"
    s = lineage_days.spec([day_csv], d, topology=TOPOLOGY, shards=shards)
    jobs.run(s, out, base=base)
    return out


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("jax-window"))
    lineage_days.split(d, parts=2)
    d1 = _run(d, "day1", "day1.csv", {"layout": "jax"})
    d2 = _run(d, "day2", "day2.csv", {"layout": "jax", "compression": "GZIP"}, base=d1)
    return {"dir": d, "outs": [d1, d2]}


def _steps(it):
    return [s for s in it]


def _assert_same_step(a, b, where):
    assert (a.step, a.epoch) == (b.step, b.epoch), where
    for field in ("lhs_row_pointers", "lhs_embedding_ids", "lhs_sample_ids", "lhs_gains"):
        x, y = getattr(a.sparse, field), getattr(b.sparse, field)
        assert sorted(x) == sorted(y), where
        for stack in x:
            assert x[stack].dtype == y[stack].dtype and x[stack].shape == y[stack].shape, (where, field, stack)
            np.testing.assert_array_equal(x[stack].view(np.int32), y[stack].view(np.int32),
                                          err_msg=f"{where} {field} {stack}")
    np.testing.assert_array_equal(a.sparse.num_minibatches, b.sparse.num_minibatches, err_msg=where)
    for k in ("label", "mask", "dense"):
        np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=f"{where} {k}")
    assert sorted(a.tensor_core) == sorted(b.tensor_core), where


def test_a_window_reads_each_day_in_turn(days):
    outs = days["outs"]
    ms = [read_manifest(o) for o in outs]
    assert [m.lineage.day for m in ms] == [1, 2]
    assert [m.shard_format.compression for m in ms] == ["none", "GZIP"]
    # The window's COO buffers: per stack the largest its days recorded.
    fj = window_jax_format(outs, ms)
    sizes = {s["name"]: s["coo_buffer_size_per_device"] for s in fj["stacks"]}
    for i, s in enumerate(fj["stacks"]):
        assert s["coo_buffer_size_per_device"] == max(m.shard_format.jax["stacks"][i]["coo_buffer_size_per_device"]
                                                      for m in ms)
    for host in range(TOPOLOGY["num_hosts"]):
        window = _steps(input_iterator(outs, host_index=host, prefetch=0))
        alone = [s for o in outs for s in _steps(input_iterator(o, host_index=host, coo_buffer_sizes=sizes))]
        assert len(window) == len(alone) == sum(m.shards.steps for m in ms)
        assert [s.step for s in window] == [k for m in ms for k in range(m.shards.steps)]  # the step within its day
        for j, (w, a) in enumerate(zip(window, alone)):
            _assert_same_step(w, a, f"host {host} window step {j}")
            for stack, eid in w.sparse.lhs_embedding_ids.items():
                assert eid.size == sizes[stack] * 1, (stack, eid.size)  # one device per host
        # Prefetched, and verified by hash, the same.
        for w, p in zip(window, _steps(input_iterator(outs, host_index=host, verify="sha256"))):
            _assert_same_step(w, p, f"host {host} prefetched")


def test_a_shuffled_window_permutes_every_step_of_the_window(days):
    outs = days["outs"]
    window = _steps(input_iterator(outs, prefetch=0))
    shuffled = _steps(input_iterator(outs, shuffle_steps=11, num_epochs=2))
    n = len(window)
    assert len(shuffled) == 2 * n
    for epoch in range(2):
        order = step_order(n, 11, epoch)
        for j, s in enumerate(order):
            w = window[int(s)]
            _assert_same_step(shuffled[epoch * n + j], w._replace(epoch=epoch), f"epoch {epoch} position {j}")
    first_day = read_manifest(outs[0]).shards.steps
    assert sorted(step_order(n, 11, 0)[:first_day].tolist()) != list(range(first_day))
    # The same permutation as input_fn's over the same window.
    np.testing.assert_array_equal(step_order(n, 11, 1), input_fn_step_order(n, 11, 1))


def _refused(match, *args, **kwargs):
    with pytest.raises((lineage.LineageError, ValueError), match=match) as e:
        input_iterator(*args, **kwargs)
    assert "\n" not in str(e.value), str(e.value)
    return e.value


def test_windows_one_model_cannot_read_are_refused(days, tmp_path):
    d1, d2 = days["outs"]
    d = days["dir"]
    _refused("give the days in order", [d2, d1])
    _refused("give the days in order", [d1, d1])
    # Another lineage: day 2's data as a first day.
    other = _run(d, "other", "day2.csv", {"layout": "jax"}, out_dir=tmp_path)
    _refused("unrelated lineages", [d1, other])
    # A day whose shards hold TensorFlow's layout only: named, with the spec key to set.
    tf_only = _run(d, "tf", "day2.csv", {"layout": "tensorflow"}, base=d1, out_dir=tmp_path)
    e = _refused("hold no jax-tpu-embedding arrays", [d1, tf_only])
    assert str(tf_only) in str(e) and "shards: {layout: jax}" in str(e)
    # Both layouts on one day, jax's alone on the other: input_fn's rule refuses them as one format.
    both = _run(d, "both", "day2.csv", {"layout": "both"}, base=d1, out_dir=tmp_path)
    _refused("written for other hosts, batches, features or stacks", [d1, both])
    with pytest.raises(lineage.LineageError, match="written for other hosts, batches, features or stacks"):
        window_format([d1, both], [read_manifest(d1), read_manifest(both)])  # input_fn's: the same rule and words
    # The spec's fingerprint is the newest day's; the host must be one of the window's.
    _refused("was made for spec", [d1, d2], expected_fingerprint=read_manifest(d1).spec_fingerprint + "x")
    assert _steps(input_iterator([d1, d2], expected_fingerprint=read_manifest(d2).spec_fingerprint))
    _refused("is not a host of", [d1, d2], host_index=2)
    with pytest.raises(lineage.LineageError, match="non-empty list"):
        input_iterator([])
