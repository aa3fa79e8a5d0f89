"""pipelines.shard_runs: records written as runs wherever steps are built, read back in step order."""

from __future__ import annotations

import os
import random
import threading

import pytest
from hypothesis import given, settings, strategies as st

from pipelines import shard_runs
from tpu_embed.shards import tfrecord_frame


def _write(output, records, flush_bytes, order_seed):
    """records: {(key, step): payload}, added in a seeded order through several writers (bundles)."""
    items = sorted(records.items())
    random.Random(order_seed).shuffle(items)
    runs = {}
    cut = len(items) // 2
    for part in (items[:cut], items[cut:]):  # two bundles
        w = shard_runs.RunWriter(output, flush_bytes)
        written = []
        for (key, step), payload in part:
            written += w.add(key, step, payload)
        written += w.close()
        for key, run in written:
            runs.setdefault(key, []).append(run)
    return runs


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.integers(0, 300), min_size=1, max_size=60, unique=True),
       hosts=st.integers(1, 3), per_file=st.integers(1, 50), flush=st.integers(1, 400),
       seed=st.integers(0, 2 ** 16))
def test_any_flush_size_and_arrival_order_gives_the_step_ordered_file(tmp_path_factory, steps, hosts, per_file,
                                                                        flush, seed):
    out = str(tmp_path_factory.mktemp("runs"))
    rng = random.Random(seed)
    records = {((h, s // per_file), s): rng.randbytes(rng.randint(0, 40)) for s in steps for h in range(hosts)}
    runs = _write(out, records, flush, seed)
    expected_keys = {k for k, _ in records}
    assert set(runs) == expected_keys
    for key, key_runs in runs.items():
        got = b"".join(shard_runs.frames_in_step_order(key_runs))
        want = b"".join(tfrecord_frame(records[(key, s)]) for s in sorted(s for k, s in records if k == key))
        assert got == want
    shard_runs.remove(out)
    assert not os.path.exists(shard_runs.runs_dir(out))


def test_a_step_delivered_twice_is_refused(tmp_path):
    w = shard_runs.RunWriter(str(tmp_path))
    w.add((0, 0), 3, b"a")
    (_, first), = w.flush()
    w.add((0, 0), 3, b"a")
    (_, again), = w.close()
    with pytest.raises(ValueError, match="step 3 was built twice"):
        list(shard_runs.frames_in_step_order([first, again]))


def test_a_truncated_run_is_an_error_naming_it(tmp_path):
    w = shard_runs.RunWriter(str(tmp_path))
    w.add((0, 0), 0, b"x" * 100)
    (_, run), = w.close()
    with open(run.path, "r+b") as fh:
        fh.truncate(50)
    with pytest.raises(IOError, match=os.path.basename(run.path)):
        list(shard_runs.frames_in_step_order([run]))


def test_the_buffer_is_written_when_full_and_only_then(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(os, "fsync", synced.append)
    w = shard_runs.RunWriter(str(tmp_path), flush_bytes=100)
    assert w.add((0, 0), 0, b"x" * 50) == []  # 66 framed bytes buffered
    written = w.add((0, 1), 1, b"y" * 50)  # 132 >= 100: both shard files' buffers written, one run each
    assert sorted(k for k, _ in written) == [(0, 0), (0, 1)]
    assert w.close() == []
    assert len(os.listdir(shard_runs.runs_dir(str(tmp_path)))) == 2
    assert synced == []  # transient runs: not synced (the shard job merges and deletes them)


def test_runs_are_written_behind_and_close_waits_for_them(tmp_path, monkeypatch):
    from tpu_embed import io as tio
    release, started, orig = threading.Event(), threading.Event(), tio.write_atomic

    def slow(path, data, **kw):
        started.set()
        assert release.wait(10)
        return orig(path, data, **kw)

    monkeypatch.setattr(tio, "write_atomic", slow)
    w = shard_runs.RunWriter(str(tmp_path), flush_bytes=10)
    (_, run), = w.add((0, 0), 0, b"x" * 20)  # full: the run is named at once, written by the thread
    assert started.wait(10) and not os.path.exists(run.path)
    threading.Timer(0.2, release.set).start()
    assert w.close() == []
    assert os.path.getsize(run.path) == len(tfrecord_frame(b"x" * 20))


def test_a_failed_run_write_fails_the_bundle_at_close(tmp_path, monkeypatch):
    from tpu_embed import io as tio

    def full(path, data, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tio, "write_atomic", full)
    w = shard_runs.RunWriter(str(tmp_path))
    w.add((0, 0), 0, b"x")
    with pytest.raises(OSError, match="No space left"):
        w.close()


def test_remove_of_a_missing_directory_is_a_no_op(tmp_path):
    shard_runs.remove(str(tmp_path / "nothing"))
