"""The shard job streams: the vocabulary job records every chunk's size (pipelines.read.chunk_sizes), the
shard job cuts steps from them without a side input over the mapped data, builds the steps a chunk holds
whole where the chunk is mapped, and sends only the straddling pieces through the GroupByKey. `run` passes
the sizes on; `tpu-embed shard` alone reads the record `tpu-embed vocab` left, or, without one for its read,
reads the input in a first pass that records them and keeps the read for the second.

Exactness: every output byte equals the side-input path's (offsets from every mapped block), unshuffled and
shuffled, with tail drop and pad, with 1 worker and 2 processes, and for `shard` alone either way. Safety:
sizes that do not match what the shard job reads stop it before a manifest is written (`shard` alone then
reads the input again); sizes from another read are ignored; `run` leaves no record.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

from pipelines import runner
from pipelines.jobs import JobConfig, ShardPass, global_batches
from pipelines.read import chunk_sizes, splits
from pipelines.read import spill as read_spill
from pipelines.sharding import runs as shard_runs
from tests.helpers import ROOT
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import load_spec, parse_spec

CRITEO = os.path.join(ROOT, "examples", "criteo", "spec.yaml")


def _files(d):
    return {os.path.relpath(os.path.join(r, x), d): open(os.path.join(r, x), "rb").read()
            for r, _, xs in os.walk(d) for x in xs}


def _spec(**changes):
    spec = load_spec(CRITEO)
    raw = spec.to_dict()
    raw.update(changes)
    return parse_spec(raw, base_dir=os.path.dirname(CRITEO))


def _split(cfg):
    return runner.split_bytes_for(cfg)


def _side_input_path(cfg):
    """The vocabulary job, then the shard pipeline given no sizes: offsets from a side input over every mapped
    block (no runner path takes it: the reference the streaming paths are checked against)."""
    runner.run_vocab(dataclasses.replace(cfg, vocab_dir=None))
    cfg = runner.paths.for_workers(cfg)
    files = splits.list_input_files(cfg.spec.input_patterns())
    runner._shard(cfg, ShardPass(), files, runner.vocab_sizes_for(cfg), _split(cfg), [])
    os.remove(chunk_sizes.path(cfg.output))  # the vocabulary job's record: compared apart


def _spy_known_sizes(monkeypatch):
    seen = []
    orig = global_batches.FormGlobalBatches.__init__

    def spy(self, *a, **k):
        orig(self, *a, **k)
        seen.append(self.known_sizes)
    monkeypatch.setattr(global_batches.FormGlobalBatches, "__init__", spy)
    return seen


def _same_files(a, b):
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb) and [p for p in fa if fa[p] != fb[p]] == []


CASES = {
    "unshuffled drop": dict(),
    "unshuffled pad": dict(policies={"tail": "pad"}),
    "shuffled, 2 epochs": dict(shuffle={"seed": 7}, epochs=2),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("flush_bytes", [None, 1], ids=["runs per bundle", "a run per record"])
def test_run_with_recorded_sizes_writes_the_bytes_of_the_side_input_path(tmp_path, case, flush_bytes, monkeypatch):
    if flush_bytes is not None:  # every shard record its own run file (pipelines.sharding.runs), read back in order
        monkeypatch.setattr(shard_runs, "FLUSH_BYTES", flush_bytes)
    spec = _spec(**CASES[case])
    # chunk_rows 50 with global batch 32: each chunk holds one step whole and pieces of others.
    kw = dict(chunk_rows=50, steps_per_file=4)
    seen = _spy_known_sizes(monkeypatch)
    a, b = str(tmp_path / "run"), str(tmp_path / "side_input")
    runner.run_all(JobConfig(spec=spec, output=a, **kw))
    _side_input_path(JobConfig(spec=spec, output=b, **kw))
    assert seen[0] is not None and len(seen[0]) > 3 and seen[1] is None  # run used recorded sizes, the other not
    assert chunk_sizes.FILENAME not in _files(a)  # taken and deleted by run
    assert not any(os.path.exists(os.path.join(d, shard_runs.RUNS_DIR)) for d in (a, b))  # runs deleted
    _same_files(a, b)
    assert read_manifest(a).shards.steps > 4


@pytest.mark.slow
def test_recorded_sizes_two_processes(tmp_path):
    spec = _spec()
    kw = dict(chunk_rows=50, steps_per_file=4)
    a, b = str(tmp_path / "one"), str(tmp_path / "two")
    runner.run_all(JobConfig(spec=spec, output=a, **kw))
    runner.run_all(JobConfig(spec=spec, output=b, **kw),
                   ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb) and [p for p in fa if fa[p] != fb[p]] == []
    assert not any(os.path.exists(os.path.join(d, shard_runs.RUNS_DIR)) for d in (a, b))


@pytest.mark.slow
@pytest.mark.parametrize("record", ["vocabulary job's", "none", "of another read"])
def test_shard_alone_streams_and_writes_the_bytes_of_run(tmp_path, monkeypatch, record):
    """`vocab` then `shard` (also `shard --vocab DIR` into another output): with the vocabulary job's record the
    shard job streams its one read; without a record for its read it reads twice (sizes recorded and the read
    kept in the first pass, replayed in the second). The same bytes as `run` either way."""
    spec = _spec(shuffle={"seed": 3}, epochs=2)
    kw = dict(chunk_rows=50, steps_per_file=4)
    reads = []
    real = splits.read_split
    monkeypatch.setattr(splits, "read_split", lambda fmt, split, *a, **k: reads.append(split) or
                        real(fmt, split, *a, **k))
    a, v, b = str(tmp_path / "run"), str(tmp_path / "vocab"), str(tmp_path / "shard")
    runner.run_all(JobConfig(spec=spec, output=a, **kw))
    runner.run_vocab(JobConfig(spec=spec, output=v, **kw))
    assert os.path.exists(chunk_sizes.path(v))  # left for shard
    if record == "none":
        os.remove(chunk_sizes.path(v))
    elif record == "of another read":
        shutil.copy(chunk_sizes.path(v), tmp_path / "record")
        body = json.loads(open(chunk_sizes.path(v)).read())
        body["key"]["chunk_rows"] = 64
        open(chunk_sizes.path(v), "w").write(json.dumps(body))
    seen = _spy_known_sizes(monkeypatch)
    del reads[:]
    runner.run_shard(JobConfig(spec=spec, output=b, vocab_dir=v, **kw))
    nfiles = len(splits.list_input_files(spec.input_patterns()))
    assert len(reads) == nfiles and seen and all(k is not None for k in seen)  # one read; sizes known: streamed
    if record != "vocabulary job's":
        assert not os.path.exists(os.path.join(b, read_spill.SPILL_DIR))  # the kept read is gone
        assert not os.path.exists(chunk_sizes.path(b, chunk_sizes.READ_PASS_FILENAME))
    for sub in ("vocab", "manifest.json", "spec.yaml"):  # the vocabularies stay in v
        shutil.rmtree(os.path.join(a, sub)) if sub == "vocab" else os.remove(os.path.join(a, sub))
        if sub != "vocab":
            os.remove(os.path.join(b, sub))
    _same_files(a, b)


def test_shard_alone_reads_again_when_the_input_changed_after_the_vocabulary_job(tmp_path, monkeypatch, caplog):
    """Input files of the same paths and sizes whose records are no longer those the vocabulary job read: the
    record does not match what the shard job reads, and it records the sizes itself (a warning says so)."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(os.path.join(ROOT, "data", "criteo_sample.csv"), data)
    spec = load_spec(CRITEO).with_inputs([str(data / "*")], base_dir=str(tmp_path))
    kw = dict(chunk_rows=50, steps_per_file=4)
    v, b = str(tmp_path / "vocab"), str(tmp_path / "shard")
    runner.run_vocab(JobConfig(spec=spec, output=v, **kw))
    first = sorted(data.iterdir())[0]
    text = first.read_bytes()
    lines = text.split(b"\n")
    # A record that parsed becomes one that does not (a label "x"), the same number of bytes: one example less.
    k = next(i for i in range(1, len(lines)) if lines[i][:1] in b"01" and lines[i][1:2] == b",")
    lines[k] = b"x" + lines[k][1:]
    first.write_bytes(b"\n".join(lines))
    assert first.stat().st_size == len(text)
    seen = _spy_known_sizes(monkeypatch)
    m = runner.run_shard(JobConfig(spec=spec, output=b, vocab_dir=v, **kw))
    assert len(seen) == 2 and all(s is not None for s in seen) and seen[0] != seen[1]  # the record, then its own
    assert "the input changed since the vocabulary job read it" in caplog.text
    assert m.counts.examples_valid == sum(n for _, n in seen[1])


def _recorded(tmp_path, spec, kw):
    out = str(tmp_path / "out")
    cfg = JobConfig(spec=spec, output=out, **kw)
    runner.run_vocab(cfg)
    files = splits.list_input_files(spec.input_patterns())
    return cfg, files, chunk_sizes.take(out, chunk_sizes.read_key(cfg, files, _split(cfg)))


@pytest.mark.parametrize("change", ["count", "missing chunk", "extra chunk"])
def test_sizes_that_do_not_match_the_read_stop_the_shard_job(tmp_path, change):
    spec = _spec()
    cfg, _, sizes = _recorded(tmp_path, spec, dict(chunk_rows=50))
    assert sizes and not os.path.exists(chunk_sizes.path(cfg.output))  # take() deletes the record
    (k0, n0), rest = sizes[0], sizes[1:]
    bad = {"count": [(k0, n0 - 1)] + rest, "missing chunk": rest,
           "extra chunk": sizes + [((k0[0], 10 ** 9), 5)]}[change]
    with pytest.raises(Exception, match="the input changed after the vocabulary job") as e:
        runner.run_shard(cfg, handed=ShardPass(chunk_sizes=bad))
    assert "re-run `tpu-embed run`" in str(e.value)
    assert read_manifest(cfg.output).shards is None  # the shard job wrote no manifest


def test_sizes_from_another_read_are_ignored(tmp_path):
    spec = _spec()
    cfg, files, sizes = _recorded(tmp_path, spec, dict(chunk_rows=50))
    assert sizes is not None
    key = chunk_sizes.read_key(cfg, files, _split(cfg))
    chunk_sizes.write(cfg.output, key, sizes)
    small = min(f.size for f in files) - 1
    for other in (chunk_sizes.read_key(dataclasses.replace(cfg, chunk_rows=64), files, _split(cfg)),  # chunking
                  chunk_sizes.read_key(cfg, files, small),  # splits
                  chunk_sizes.read_key(dataclasses.replace(cfg, strict=True), files, _split(cfg)),
                  chunk_sizes.read_key(dataclasses.replace(cfg, spec=_spec(dense=[])), files, _split(cfg)),
                  chunk_sizes.read_key(cfg, files[1:], _split(cfg))):
        assert other != key and chunk_sizes.read(cfg.output, other) is None  # the record does not apply
    assert chunk_sizes.read_key(cfg, files, 1 << 40) == key  # a split size no file reaches: whole files
    assert chunk_sizes.read(cfg.output, key) == sizes  # read leaves it
    assert chunk_sizes.take(cfg.output, key) == sizes
    assert not os.path.exists(chunk_sizes.path(cfg.output))
    assert chunk_sizes.take(cfg.output, key) is None  # nothing recorded: None
