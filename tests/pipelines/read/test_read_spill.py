"""`run` reads its input once (pipelines.read.spill): the shard job replays the vocabulary job's read.

Byte-identity with a second read is also checked, with dead letters, split sizes and two worker
processes, in tests/pipelines/read/test_splits.py (every format) and on an object store in
tests/tpu_embed/artifact/test_object_store.py.
"""

from __future__ import annotations

import os

import pytest

from pipelines import process_memory, runner
from pipelines.jobs import JobConfig, build_shards
from pipelines.read import spill as read_spill
from pipelines.read import splits as psplits
from tests.helpers import ROOT
from tpu_embed.artifact.spec import load_spec

CRITEO = os.path.join(ROOT, "examples", "criteo", "spec.yaml")


def _tree(d):
    return {os.path.relpath(os.path.join(r, x), d): open(os.path.join(r, x), "rb").read()
            for r, _, xs in os.walk(d) for x in xs}


def test_parts_replay_in_order_and_a_missing_part_stops(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(os, "fsync", synced.append)
    d = str(tmp_path / "spill")
    items = [("chunks", bytes(range(i % 250)) * 3) for i in range(40)] + [("stats", {"records_read": 40})]
    w = read_spill.SpillWriter(d, 2, 1, part_bytes=500)
    for it in items:
        w.add(it)
    w.close()
    parts = sorted(os.listdir(d))
    assert len(parts) > 3 and parts[0] == "000002-000001-000000.pkl"
    assert list(read_spill.replay(d, 2, 1)) == items
    assert synced == []  # transient parts: not synced (run deletes them; a crash re-runs the job)
    os.remove(os.path.join(d, parts[-1]))  # the part with the end mark
    with pytest.raises(read_spill.IncompleteSpillError, match="re-run `tpu-embed run`"):
        list(read_spill.replay(d, 2, 1))
    with pytest.raises(read_spill.IncompleteSpillError, match="input file 3 \\(split 0\\)"):
        list(read_spill.replay(d, 3, 0))


def _count_reads(monkeypatch):
    reads = []
    real = psplits.read_split
    monkeypatch.setattr(psplits, "read_split",
                        lambda fmt, split, *a, **k: reads.append(split) or real(fmt, split, *a, **k))
    return reads


@pytest.mark.parametrize("reuse", [True, False])
def test_the_shard_job_replays_the_vocabulary_jobs_read(tmp_path, monkeypatch, reuse):
    reads = _count_reads(monkeypatch)
    arenas = []  # the jobs that read their input share one malloc arena while they run; a replay does not
    real_arena = process_memory.one_malloc_arena
    monkeypatch.setattr(process_memory, "one_malloc_arena", lambda: arenas.append(len(reads)) or real_arena())
    spec = load_spec(CRITEO)
    out = str(tmp_path / "out")
    runner.run_all(JobConfig(spec=spec, output=out, chunk_rows=50, steps_per_file=3, split_bytes=4096,
                             reuse_read=reuse))
    splits = psplits.plan_splits("csv", psplits.list_input_files(spec.input_patterns()), 4096)
    assert len(splits) > 2
    assert len(reads) == len(splits) * (1 if reuse else 2)
    assert arenas == ([0] if reuse else [0, len(splits)])  # entered before each job that reads
    assert not os.path.exists(read_spill.spill_dir(out))  # removed once the shard job ended
    if reuse:
        other = str(tmp_path / "again")
        runner.run_all(JobConfig(spec=spec, output=other, chunk_rows=50, steps_per_file=3, split_bytes=4096,
                                 reuse_read=False))
        a, b = _tree(out), _tree(other)
        assert sorted(a) == sorted(b) and [p for p in a if a[p] != b[p]] == []


def test_the_spill_is_removed_when_the_shard_job_fails(tmp_path, monkeypatch):
    def fail(self, kv):
        raise RuntimeError("injected")
        yield

    monkeypatch.setattr(build_shards._BuildStep, "process", fail)
    out = str(tmp_path / "out")
    with pytest.raises(Exception, match="injected"):
        runner.run_all(JobConfig(spec=load_spec(CRITEO), output=out, chunk_rows=50))
    assert os.path.exists(os.path.join(out, "vocab")) and not os.path.exists(read_spill.spill_dir(out))


def test_cli_reread_input_turns_the_replay_off(tmp_path):
    from pipelines import cli
    from pipelines.cli.job_commands import job_config
    argv = ["run", "--spec", CRITEO, "--output", str(tmp_path / "o")]
    assert job_config(cli.build_parser().parse_args(argv)).reuse_read is True
    assert job_config(cli.build_parser().parse_args(argv + ["--reread-input"])).reuse_read is False


def _chunk(rng, n, multivalent, encoded=False):
    import numpy as np
    import pyarrow as pa

    from pipelines.read.parse import FeatureValues, ParsedChunk
    from pipelines.token_index import dictionary_encode
    enc = dictionary_encode if encoded else (lambda t: t)
    lengths = rng.integers(0, 4 if multivalent else 2, n).astype(np.int64)
    m = int(lengths.sum())
    toks = pa.array([bytes(rng.integers(97, 123, rng.integers(0, 9)).astype(np.uint8)) for _ in range(m)],
                    pa.large_binary())
    feats = {"c": FeatureValues(lengths=lengths, tokens=enc(toks.slice(0, m))),
             "w": FeatureValues(lengths=lengths, tokens=enc(toks), weights=rng.random(m).astype(np.float32)),
             "i": FeatureValues(lengths=lengths, ints=rng.integers(-5, 10 ** 12, m)),
             "big": FeatureValues(lengths=lengths * 300, tokens=enc(pa.array([b"x"] * (m * 300), pa.large_binary()))),
             "none": FeatureValues(lengths=np.zeros(n, np.int64), tokens=enc(pa.array([], pa.large_binary())))}
    return ParsedChunk(3, 7, np.arange(n, dtype=np.int64), rng.random(n).astype(np.float32),
                       rng.random((n, 2)).astype(np.float32), feats, "f.csv")


@pytest.mark.parametrize("kept", [False, True], ids=["spilled", "kept"])
@pytest.mark.parametrize("encoded", [False, True], ids=["plain", "encoded"])
@pytest.mark.parametrize("n,multivalent", [(0, False), (1, False), (500, False), (500, True)])
def test_spilled_chunks_are_compact_and_replay_as_the_same_arrays(tmp_path, n, multivalent, encoded, kept):
    """Tokens as the parser gives them (dictionary-encoded) and plain; spilled to parts or kept in memory (its
    lengths held narrow there too)."""
    import pickle

    import numpy as np

    from pipelines.read.spill import approx_nbytes
    rng = np.random.default_rng(n + multivalent)
    chunk = _chunk(rng, n, multivalent, encoded)
    d = str(tmp_path / "spill")
    w = read_spill.SpillWriter(d, 0, 0, memory_bytes=(1 << 30) if kept else 0)
    w.add(("chunks", chunk))
    w.add(("stats", {"records_read": n}))
    w.close()
    if kept:
        assert not os.path.exists(d) or os.listdir(d) == []  # nothing spilled
        held = read_spill.kept_bytes()
        lengths = sum(fv.lengths.nbytes for fv in chunk.features.values())
        # every length below 2**16 here: 2 bytes at most instead of 8
        whole = approx_nbytes(("chunks", chunk)) + approx_nbytes(("stats", {"records_read": n}))
        assert held <= whole - lengths * 3 // 4
    (tag, got), stats = list(read_spill.replay(d, 0, 0))
    assert tag == "chunks" and stats == ("stats", {"records_read": n})
    for f in ("record_numbers", "label", "dense"):
        assert np.array_equal(getattr(got, f), getattr(chunk, f)) and getattr(got, f).dtype == getattr(chunk, f).dtype
    assert (got.file_index, got.chunk_index, got.path) == (3, 7, "f.csv")
    for name, want in chunk.features.items():
        have = got.features[name]
        assert have.lengths.dtype == np.int64 and np.array_equal(have.lengths, want.lengths), name
        assert (have.tokens is None) == (want.tokens is None), name
        assert have.tokens is None or (have.tokens.equals(want.tokens) and have.tokens.type == want.tokens.type)
        for f in ("ints", "weights"):
            a, b = getattr(have, f), getattr(want, f)
            assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a, b)), (name, f)
    if n >= 500 and not kept:
        spilled = sum(os.path.getsize(os.path.join(d, p)) for p in os.listdir(d))
        assert spilled < 0.8 * len(pickle.dumps(chunk, protocol=pickle.HIGHEST_PROTOCOL))


def _items(n):
    return [("chunks", bytes(range(i % 250)) * 40) for i in range(n)] + [("stats", {"records_read": n})]


def test_a_writer_keeps_the_first_items_in_memory_then_writes_parts(tmp_path):
    """Under `memory_bytes` (counted by `approx_nbytes` over every writer of the process) the items are kept as
    they are; the split's later items go to parts; the reader takes both, in order, and releases the memory."""
    from pipelines.read.spill import approx_nbytes
    d = str(tmp_path / "spill")
    items = _items(30)
    budget = sum(approx_nbytes(it) for it in items[:10])
    w = read_spill.SpillWriter(d, 1, 0, part_bytes=2000, memory_bytes=budget)
    for it in items:
        w.add(it)
    w.close()
    assert read_spill.kept_bytes() == budget
    got = list(read_spill.replay(d, 1, 0))
    assert got == items and all(a is b for a, b in zip(got[:10], items[:10]))  # kept: the same objects
    assert read_spill.kept_bytes() == 0
    on_disk = []
    for p in sorted(os.listdir(d)):
        with open(os.path.join(d, p), "rb") as fh:
            on_disk += [x for x in iter(lambda: _load(fh), None)]
    assert on_disk[:-1] == items[10:]  # only the items not kept, then the end mark


def _load(fh):
    import pickle
    try:
        return pickle.load(fh)
    except EOFError:
        return None


def test_a_split_kept_whole_writes_nothing_and_a_second_split_spills_past_the_budget(tmp_path):
    from pipelines.read.spill import approx_nbytes
    d = str(tmp_path / "spill")
    a, b = _items(5), _items(7)
    budget = sum(approx_nbytes(it) for it in a) + approx_nbytes(b[0])
    for split, items in ((0, a), (1, b)):
        w = read_spill.SpillWriter(d, 0, split, part_bytes=1 << 20, memory_bytes=budget)
        for it in items:
            w.add(it)
        w.close()
    assert sorted(os.listdir(d)) == ["000000-000001-000000.pkl"]  # split 0 kept whole; split 1 from item 1 on
    assert list(read_spill.replay(d, 0, 1)) == b and list(read_spill.replay(d, 0, 0)) == a
    assert read_spill.kept_bytes() == 0


def test_kept_items_are_released_by_a_reader_that_stops_by_remove_and_by_a_retried_split(tmp_path):
    out = str(tmp_path / "out")
    d = read_spill.spill_dir(out)
    items = _items(6)

    def write(split):
        w = read_spill.SpillWriter(d, 0, split, memory_bytes=1 << 30)
        for it in items:
            w.add(it)
        w.close()

    write(0)
    held = read_spill.kept_bytes()
    write(0)  # a retried split replaces what the first attempt kept
    assert held > 0 and read_spill.kept_bytes() == held
    reader = read_spill.replay(d, 0, 0)
    assert next(reader) == items[0]
    reader.close()  # a reader that stops early (a failed bundle)
    assert read_spill.kept_bytes() == 0
    write(1)
    read_spill.remove(out)
    assert read_spill.kept_bytes() == 0
    with pytest.raises(read_spill.IncompleteSpillError):
        list(read_spill.replay(d, 0, 1))


@pytest.mark.parametrize("mb", [0, 0.05, None], ids=["spilled", "partly-kept", "kept"])
def test_run_gives_the_same_bytes_whatever_it_keeps_in_memory(tmp_path, monkeypatch, mb):
    """`run` in this process keeps up to `read_memory_bytes` of its read in memory, the rest spilled: the same
    outputs as a second read of the input; parts are written only for what did not fit."""
    flushed, kept = [], []
    flush, reserve = read_spill.SpillWriter._flush, read_spill._reserve
    monkeypatch.setattr(read_spill.SpillWriter, "_flush", lambda self: flushed.append(1) or flush(self))
    monkeypatch.setattr(read_spill, "_reserve", lambda n, limit: kept.append(reserve(n, limit)) or kept[-1])
    spec = load_spec(CRITEO)
    kw = dict(spec=spec, chunk_rows=50, steps_per_file=3)
    if mb is not None:
        kw["read_memory_bytes"] = int(mb * (1 << 20))
    out = str(tmp_path / "out")
    runner.run_all(JobConfig(output=out, **kw))
    assert read_spill.kept_bytes() == 0
    if mb is None:  # all kept, no parts
        assert flushed == [] and kept and all(kept)
    elif mb == 0:  # all spilled
        assert flushed and not any(kept)
    else:  # the first items kept, then the rest of that split spilled
        assert flushed and kept[0] and not kept[-1]
    other = str(tmp_path / "again")
    runner.run_all(JobConfig(output=other, reuse_read=False, **kw))
    a, b = _tree(out), _tree(other)
    assert sorted(a) == sorted(b) and [p for p in a if a[p] != b[p]] == []


def test_memory_is_kept_only_where_both_jobs_run_in_this_process():
    assert runner.runs_in_process([])
    assert runner.runs_in_process(["--direct_num_workers=2", "--direct_running_mode=multi_threading"])
    assert not runner.runs_in_process(["--direct_num_workers=2"])  # worker processes
    assert not runner.runs_in_process(["--direct_running_mode=multi_processing"])
    assert not runner.runs_in_process(["--runner=dask"])


def test_cli_read_memory_mb(tmp_path):
    from pipelines import cli
    from pipelines.cli.job_commands import job_config
    from pipelines.user_errors import UserError
    argv = ["run", "--spec", CRITEO, "--output", str(tmp_path / "o")]
    assert job_config(cli.build_parser().parse_args(argv)).read_memory_bytes == read_spill.MEMORY_BYTES
    run_help = cli.build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "(default %d)" % (read_spill.MEMORY_BYTES >> 20) in " ".join(run_help.split())  # the help says it
    assert job_config(cli.build_parser().parse_args(argv + ["--read-memory-mb", "3"])).read_memory_bytes == 3 << 20
    with pytest.raises(UserError, match="--read-memory-mb"):
        job_config(cli.build_parser().parse_args(argv + ["--read-memory-mb", "-1"]))
