"""pipelines.sharding.runs: records written as runs wherever steps are built, read back in step order."""

from __future__ import annotations

import hashlib
import os
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.sharding import runs as shard_runs
from tests.helpers import SPECS
from tpu_embed.artifact import tfrecord


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
        want = b"".join(tfrecord.frame(records[(key, s)]) for s in sorted(s for k, s in records if k == key))
        assert got == want
        for run in key_runs:  # a run's hash and size are those of its bytes
            with open(run.path, "rb") as fh:
                data = fh.read()
            assert (run.size, run.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        if len(key_runs) == 1 and key_runs[0].is_whole_file():  # moved into place as it is: the file's bytes
            assert data == want
    shard_runs.remove(out)
    assert not os.path.exists(shard_runs.runs_dir(out))


def test_a_step_delivered_twice_is_refused(tmp_path):
    runs = []
    for _ in range(2):  # two bundles that both built step 3
        w = shard_runs.RunWriter(str(tmp_path))
        w.add((0, 0), 3, b"a")
        (_, run), = w.close()
        runs.append(run)
    with pytest.raises(ValueError, match="step 3 was built twice"):
        list(shard_runs.frames_in_step_order(runs))


def test_a_truncated_run_is_an_error_naming_it(tmp_path):
    w = shard_runs.RunWriter(str(tmp_path))
    w.add((0, 0), 0, b"x" * 100)
    (_, run), = w.close()
    with open(run.path, "r+b") as fh:
        fh.truncate(50)
    with pytest.raises(IOError, match=os.path.basename(run.path)):
        list(shard_runs.frames_in_step_order([run]))


def test_one_run_per_shard_file_unless_flush_bytes_ends_it(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(os, "fsync", synced.append)
    w = shard_runs.RunWriter(str(tmp_path))
    for step in range(5):
        assert w.add((0, step % 2), step, b"x" * 50) == []
    ended = w.close()
    assert sorted(k for k, _ in ended) == [(0, 0), (0, 1)]
    assert [len(r.records) for _, r in ended] == [3, 2] and all(r.is_whole_file() for _, r in ended)
    w = shard_runs.RunWriter(str(tmp_path / "b"), flush_bytes=100)
    ended = [run for step in range(3) for run in w.add((0, 0), step, b"y" * 50)]  # 66 framed bytes each
    ended += w.close()  # (a run that ended is returned by the next add, or by close, once written)
    # The run ends at 132 >= 100 bytes; step 2 starts another.
    assert [[s for s, _, _ in r.records] for _, r in ended] == [[0, 1], [2]]
    assert synced == []  # runs below SYNC_BYTES: not synced by the writer


def test_a_local_run_is_synced_as_it_grows_by_the_writer_thread(tmp_path, monkeypatch):
    """Every SYNC_BYTES the writer's thread syncs the run's data, so the fsync of the move into place
    (`tio.move`) at the end of the job has only the last part left to wait for."""
    synced, orig = [], os.fdatasync

    def fdatasync(fd):
        synced.append((threading.current_thread().name, os.fstat(fd).st_size))
        orig(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(shard_runs, "SYNC_BYTES", 150)
    w = shard_runs.RunWriter(str(tmp_path))
    for step in range(5):
        w.add((0, 0), step, b"x" * 50)  # 66 framed bytes each
    (_, run), = w.close()
    # Synced once 150 bytes were written since the last sync: after steps 2 (198 bytes) and 4 (330 - 198 = 132
    # < 150: not yet), and never on the bundle's own thread.
    assert [size for _, size in synced] == [198]
    assert all(name != threading.current_thread().name for name, _ in synced)
    assert open(run.path, "rb").read() == b"".join(tfrecord.frame(b"x" * 50) for _ in range(5))


def test_a_run_is_a_whole_file_only_in_step_order_with_each_step_once():
    assert shard_runs.Run("r", ((3, 0, 10), (4, 10, 5)), "h", 15).is_whole_file()
    assert not shard_runs.Run("r", ((4, 0, 10), (3, 10, 5)), "h", 15).is_whole_file()  # out of order
    assert not shard_runs.Run("r", ((3, 0, 10), (3, 10, 5)), "h", 15).is_whole_file()  # a step twice
    assert not shard_runs.Run("r", ((3, 0, 10), (4, 11, 5)), "h", 16).is_whole_file()  # a gap
    assert not shard_runs.Run("r", ((3, 0, 10),), "h", 12).is_whole_file()  # bytes after the records
    assert not shard_runs.Run("r", ((3, 0, 10),), None, 10).is_whole_file()  # no hash


def test_runs_are_written_behind_and_close_waits_for_them(tmp_path, monkeypatch):
    release, started, orig = threading.Event(), threading.Event(), shard_runs._Open.append

    def slow(self, step, frame):
        started.set()
        assert release.wait(10)
        return orig(self, step, frame)

    monkeypatch.setattr(shard_runs._Open, "append", slow)
    w = shard_runs.RunWriter(str(tmp_path))
    assert w.add((0, 0), 0, b"x" * 20) == []  # returns while the thread writes
    assert started.wait(10)
    threading.Timer(0.2, release.set).start()
    (_, run), = w.close()
    assert os.path.getsize(run.path) == len(tfrecord.frame(b"x" * 20)) == run.size


def test_a_failed_run_write_fails_the_bundle(tmp_path, monkeypatch):
    """The writer thread's error is raised in the bundle's thread: at the next add, else at close."""
    from tpu_embed.artifact import io as tio

    def full(path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tio, "open_write", full)
    w = shard_runs.RunWriter(str(tmp_path))
    with pytest.raises(OSError, match="No space left"):
        w.add((0, 0), 0, b"x")
        w.add((0, 0), 1, b"y")
        w.close()


def test_remove_of_a_missing_directory_is_a_no_op(tmp_path):
    shard_runs.remove(str(tmp_path / "nothing"))


@pytest.mark.parametrize("store", ["local", "memory"])
def test_a_run_moved_into_place_and_a_retry_that_finds_it_moved(tmp_path, store, monkeypatch):
    """`output.move_into_place` (`tpu_embed.artifact.io.move`): the run becomes the file; a retried bundle that
    finds the run gone and the file in place accepts it when its bytes hash the same, and refuses it otherwise. On
    object stores without the filesystem's `mv` (gcsfs's first tries GCS's moveTo, which plain buckets and the
    emulator refuse, and retries at length per object)."""
    import uuid

    from fsspec.implementations.memory import MemoryFileSystem

    from pipelines import output
    from tpu_embed.artifact import io as tio

    def no_mv(*a, **k):
        raise AssertionError("tio.move must not call the filesystem's mv")

    monkeypatch.setattr(MemoryFileSystem, "mv", no_mv)
    root = str(tmp_path) if store == "local" else f"memory://runs-{uuid.uuid4().hex}"
    src = tio.join(shard_runs.runs_dir(root), "00000-00000-x.run")
    with tio.open_write(src) as fh:
        fh.write(b"abc")
    sha = hashlib.sha256(b"abc").hexdigest()
    info = output.move_into_place(src, root, "shards/f.tfrecord", sha, 3, records=1)
    assert tio.read_bytes(tio.join(root, "shards/f.tfrecord")) == b"abc" and not tio.exists(src)
    assert (info.path, info.sha256, info.bytes, info.records) == ("shards/f.tfrecord", sha, 3, 1)
    assert output.move_into_place(src, root, "shards/f.tfrecord", sha, 3, records=1) == info
    with pytest.raises(IOError, match="is not the file it held"):
        output.move_into_place(src, root, "shards/f.tfrecord", hashlib.sha256(b"x").hexdigest(), 3)
    if store == "local":  # a run's name is new: a local file of that name is an error, not replaced
        with pytest.raises(FileExistsError):
            tio.open_write(tio.join(root, "shards/f.tfrecord"))


def test_shard_files_moved_from_their_runs_are_the_merged_ones(tmp_path, monkeypatch):
    """A shard file that one run holds whole in step order is that run, moved into place
    (`shard_runs.Run.is_whole_file`); the same files and manifest as merging the runs record by record."""
    from pipelines import output, runner
    from pipelines.jobs import JobConfig
    from tpu_embed.artifact.manifest import read_manifest
    from tpu_embed.artifact.spec import load_spec
    spec = load_spec(SPECS["movielens"])
    moved = []
    real_move = output.move_into_place
    monkeypatch.setattr(output, "move_into_place", lambda *a, **k: moved.append(a[2]) or real_move(*a, **k))
    a = str(tmp_path / "moved")
    runner.run_all(JobConfig(spec=spec, output=a, steps_per_file=5))
    monkeypatch.setattr(shard_runs.Run, "is_whole_file", lambda self: False)
    b = str(tmp_path / "merged")
    runner.run_all(JobConfig(spec=spec, output=b, steps_per_file=5))
    files = sorted(f.path for f in read_manifest(a).files if f.kind == "shard")
    # Moved where one bundle built all of a file's steps; merged where a step straddled two bundles.
    assert moved and set(moved) <= set(files)
    for rel in files:
        with open(os.path.join(a, rel), "rb") as x, open(os.path.join(b, rel), "rb") as y:
            assert x.read() == y.read()
    with open(os.path.join(a, "manifest.json"), "rb") as x, open(os.path.join(b, "manifest.json"), "rb") as y:
        assert x.read() == y.read()
    assert not os.path.exists(shard_runs.runs_dir(a))
