"""Deterministic shuffling (`shuffle: {seed}`, `epochs`): the batching and the jobs (the permutation itself:
tests/tpu_embed/core/test_permutation.py).

* `pipelines.sharding.batches.scatter_into_steps` + `assemble_shuffled_step` put example k at position p(k),
  whatever the chunking and the order the pieces arrive in; `FormGlobalBatches` does the same in Beam.
* The jobs with shuffling on: byte-identical for DirectRunner in_memory and multi_processing with 2
  workers; every step decodes to exactly the examples p says (labels, dense, tensor-core ids, every chip's
  CSR); every valid example appears once per epoch, bar the tail.
"""

from __future__ import annotations

import collections
import json
import os

import apache_beam as beam
import numpy as np
import pytest
import yaml
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that

from pipelines import runner
from pipelines.jobs import JobConfig, global_batches
from pipelines.sharding import batches as batching
from pipelines.sharding.batches import ExampleBlock, FeatureBlock
from tests.helpers import SPECS
from tests.helpers.plain_reference import (
    assert_real_example,
    decode_chip,
    expected_chip_entries,
    plain_ids,
    plain_vocabulary,
    raw_rows,
)
from tpu_embed.artifact import shard_records, tfrecord
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.shard_format import ShardFormat
from tpu_embed.artifact.spec import SpecError, parse_spec
from tpu_embed.core.permutation import ALGORITHM, ROUNDS, VERSION, Permutation, epoch_key

# ---------------------------------------------------------------- batching

def synthetic_block(n, rng, start=0):
    """n examples; label = global index, one weighted ragged feature, one dense column."""
    lengths = rng.integers(0, 4, n).astype(np.int64)
    ids = rng.integers(0, 50, int(lengths.sum())).astype(np.int64)
    weights = rng.random(ids.size).astype(np.float32)
    g = np.arange(start, start + n)
    lengths2 = rng.integers(0, 3, n).astype(np.int64)
    return ExampleBlock(g.astype(np.float32), np.stack([g * 2.0], 1).astype(np.float32), np.ones(n, np.float32),
                        {"f": FeatureBlock(lengths, ids, weights, (g % 3).astype(np.int32)),
                         "u": FeatureBlock(lengths2, rng.integers(0, 9, int(lengths2.sum())).astype(np.int64), None,
                                           (g % 2).astype(np.int32))})


def assert_blocks_equal(a, b):
    for x, y in ((a.label, b.label), (a.dense, b.dense), (a.mask, b.mask)):
        assert x.dtype == y.dtype and np.array_equal(x, y)
    assert list(a.features) == list(b.features)
    for k in a.features:
        fa, fb = a.features[k], b.features[k]
        assert (fa.weights is None) == (fb.weights is None)
        for x, y in ((fa.lengths, fb.lengths), (fa.ids, fb.ids), (fa.weights, fb.weights), (fa.oov, fb.oov)):
            assert x is None or (x.dtype == y.dtype and np.array_equal(x, y))


def test_take_gathers_ragged_rows():
    rng = np.random.default_rng(1)
    blk = synthetic_block(40, rng)
    rows = rng.permutation(40)[:25]
    got = blk.take(rows)
    expect = ExampleBlock.concat([blk.slice(int(r), int(r) + 1) for r in rows])
    assert_blocks_equal(got, expect)


@pytest.mark.parametrize("tail", ["drop", "pad"])
def test_scatter_then_assemble_is_the_permutation(tail):
    rng = np.random.default_rng(2)
    N, B, seed = 203, 16, 11
    full = synthetic_block(N, rng)
    S, _, _ = batching.step_count(N, B, tail)
    perm = Permutation(N, epoch_key(seed, 1))
    expect_rows = perm.inverse(np.arange(min(N, S * B)))
    for cuts in ([0, N], [0, 1, 2, 50, 51, 120, N], sorted({0, N, *rng.integers(1, N, 30).tolist()})):
        pieces = collections.defaultdict(list)
        for a, b in zip(cuts[:-1], cuts[1:]):
            for step, piece in batching.scatter_into_steps(full.slice(a, b), a, B, S, perm, first_step=S):
                pieces[step].append(piece)
        assert sorted(pieces) == list(range(S, 2 * S))
        for step, ps in pieces.items():
            rng.shuffle(ps)  # arrival order must not matter
            got = batching.assemble_shuffled_step(ps, B, 1)
            rows = expect_rows[(step - S) * B:(step - S + 1) * B]
            want = full.take(rows)
            if rows.size < B:
                want = ExampleBlock.concat([want, ExampleBlock.padding(B - rows.size, 1, want)])
            assert_blocks_equal(got, want)


def test_form_global_batches_in_beam_ignores_the_chunking():
    """Two chunkings of the same 103 examples (as two worker layouts would give) -> the same steps."""
    rng = np.random.default_rng(3)
    N, B, seed, epochs = 103, 8, 5, 2
    full = synthetic_block(N, rng)
    S = N // B
    expect = {e * S + s: Permutation(N, epoch_key(seed, e)).inverse(np.arange(s * B, (s + 1) * B)).tolist()
              for e in range(epochs) for s in range(S)}

    def check(steps):
        got = {step: blk.label.astype(np.int64).tolist() for step, blk in steps}
        assert got == expect
        return True

    for cuts in ([0, 40, N], [0, 1, 7, 8, 60, 99, N]):
        # chunks keyed (file, chunk): file 0 holds the first cut, file 1 the rest
        keyed = [((0 if i == 0 else 1, i), full.slice(a, b)) for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))]
        with BeamTestPipeline(argv=["--runner=DirectRunner", "--direct_running_mode=in_memory"], blocking=True) as p:
            out = (p | beam.Create(keyed)) | global_batches.FormGlobalBatches(B, 1, "drop", shuffle_seed=seed,
                                                                              epochs=epochs)
            assert_that(out["steps"] | beam.combiners.ToList(), lambda xs: check(xs[0]))
            assert_that(out["info"], lambda xs: xs[0]["steps"] == epochs * S and xs[0]["steps_per_epoch"] == S
                        and xs[0]["tail_dropped"] == epochs * (N - S * B), label="info")


# ---------------------------------------------------------------- spec

BASE = {"inputs": {"format": "csv", "patterns": ["x.csv"]}, "categorical": ["C1"],
        "tables": [{"name": "C1", "dim": 8}], "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "global_batch_size": 8}


def test_spec_keys():
    plain = parse_spec(BASE)
    assert plain.shuffle is None and plain.epochs == 1 and "shuffle" not in plain.to_dict()
    s1 = parse_spec(dict(BASE, shuffle={"seed": 1}, epochs=3))
    assert s1.to_dict()["shuffle"] == {"seed": 1} and s1.to_dict()["epochs"] == 3
    assert parse_spec(yaml.safe_load(s1.to_yaml())).fingerprint == s1.fingerprint
    fps = {plain.fingerprint, s1.fingerprint, parse_spec(dict(BASE, shuffle={"seed": 2}, epochs=3)).fingerprint,
           parse_spec(dict(BASE, shuffle={"seed": 1})).fingerprint}
    assert len(fps) == 4
    with pytest.raises(SpecError, match="spec key 'epochs'.*without `shuffle`"):
        parse_spec(dict(BASE, epochs=2))
    with pytest.raises(SpecError, match="spec key 'shuffle.seed'"):
        parse_spec(dict(BASE, shuffle={"seed": 2 ** 64}))


# ---------------------------------------------------------------- the jobs, end to end

SEED, EPOCHS = 20240611, 2
KW = {"criteo": dict(chunk_rows=50, steps_per_file=3), "movielens": dict(chunk_rows=37, steps_per_file=5)}


def shuffled_spec(name, seed=SEED, epochs=EPOCHS):
    path = SPECS[name]
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh)
    raw.update(shuffle={"seed": seed}, epochs=epochs)
    return parse_spec(raw, base_dir=os.path.dirname(path), source_path=path)


def _files(d):
    return {os.path.relpath(os.path.join(r, x), d): open(os.path.join(r, x), "rb").read()
            for r, _, xs in os.walk(d) for x in xs}


@pytest.fixture(scope="module")
def shuffled(tmp_path_factory):
    out = {}
    for name in SPECS:
        d = str(tmp_path_factory.mktemp(f"shuffled-{name}"))
        spec = shuffled_spec(name)
        runner.run_all(JobConfig(spec=spec, output=d, **KW[name]))
        out[name] = (spec, d)
    return out


@pytest.mark.slow
def test_shuffled_one_worker_and_two_processes_give_identical_bytes(shuffled, tmp_path):
    spec, ref = shuffled["movielens"]
    b = str(tmp_path / "two")
    runner.run_all(JobConfig(spec=spec, output=b, **KW["movielens"]),
                   ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    fa, fb = _files(ref), _files(b)
    assert sorted(fa) == sorted(fb) and any(p.startswith("shards/") for p in fa)
    assert [p for p in sorted(fa) if fa[p] != fb[p]] == []


@pytest.mark.slow
@pytest.mark.parametrize("name", ["criteo", "movielens"])
def test_shuffled_shards_decode_to_the_permuted_rows(shuffled, name):
    spec, d = shuffled[name]
    m = json.load(open(os.path.join(d, "manifest.json")))
    fmt = ShardFormat.from_json(m["shards"]["format"])
    vocabs = {k: plain_vocabulary(spec, k) for k in spec.vocabulary_groups()}
    rows = raw_rows(spec)
    N, B = len(rows), spec.global_batch_size
    H, hb, per_chip, cph = spec.topology.num_hosts, spec.per_host_batch_size, spec.per_chip_batch_size, \
        spec.topology.chips_per_host
    tail = spec.policies.tail
    S = N // B if tail == "drop" else -(-N // B)
    assert m["batching"] == {
        "examples": N, "steps": EPOCHS * S, "epochs": EPOCHS, "steps_per_epoch": S, "tail_policy": tail,
        "tail_dropped_per_epoch": N - S * B if tail == "drop" else 0,
        "tail_padding_per_epoch": S * B - N if tail == "pad" else 0,
        "shuffle": {"algorithm": ALGORITHM, "version": VERSION, "rounds": ROUNDS, "seed": SEED}}
    assert read_manifest(d).batching.shuffle.seed == SEED
    assert m["shards"]["steps"] == m["counts"]["steps"] == EPOCHS * S
    perms = [Permutation(N, epoch_key(SEED, e)) for e in range(EPOCHS)]

    def example_at(step, position):
        """Row index at a position (within the step) of a step, or None for padding."""
        e, s = divmod(step, S)
        q = s * B + position
        return int(perms[e].inverse(np.array([q]))[0]) if q < N else None

    seen = [collections.Counter() for _ in range(EPOCHS)]
    for h in range(H):
        records = [shard_records.decode_record(r, fmt) for p in shard_records.shard_files(d, h)
                   for r in tfrecord.read_records(p)]
        assert [r["step"] for r in records] == list(range(EPOCHS * S))
        for r in records:
            ks = [example_at(r["step"], h * hb + pos) for pos in range(hb)]
            for pos, k in enumerate(ks):
                if k is None:
                    assert r["mask"][pos] == 0 and r["label"][pos] == 0
                    continue
                seen[r["step"] // S][k] += 1
                assert_real_example(r, pos, rows[k], spec)
            for f in spec.tensor_core_features:
                tc = r["tensor_core"][f.name]
                starts = np.concatenate([[0], np.cumsum(tc["lengths"])])
                for pos, k in enumerate(ks):
                    expect = plain_ids(spec, f, rows[k], vocabs)[:f.tensor_core_width] if k is not None else []
                    assert tc["ids"][starts[pos]:starts[pos + 1]].tolist() == expect
            for c in range(cph):
                got = decode_chip(r["sparse_core"][c], m["layout"], m["topology"])
                expect = expected_chip_entries(spec, vocabs, rows, ks[c * per_chip:(c + 1) * per_chip])
                assert set(got) == set(expect), (name, r["step"], c, sorted(set(got) ^ set(expect))[:5])
                for key, g in expect.items():
                    assert got[key] == pytest.approx(g, rel=1e-6), key
    # Every valid example once per epoch, except the tail (the examples whose position is past S * B).
    for e in range(EPOCHS):
        tail_rows = set(perms[e].inverse(np.arange(min(N, S * B), N)).tolist())
        assert set(seen[e]) == set(range(N)) - tail_rows and set(seen[e].values()) == {1}
        assert len(tail_rows) == m["batching"]["tail_dropped_per_epoch"]
    # Shuffled for real: not the input order, and the epochs differ.
    first = [example_at(0, i) for i in range(B)]
    assert first != list(range(B)) and first != [example_at(S, i) for i in range(B)]
    c = m["counts"]
    assert c["examples_valid"] == N and c["examples_written"] == sum(sum(s.values()) for s in seen)
    assert c["examples_dropped"]["tail"] == EPOCHS * m["batching"]["tail_dropped_per_epoch"]
    assert c["examples_padding"] == EPOCHS * m["batching"]["tail_padding_per_epoch"]
    import profiles
    assert profiles.ProfileStore(os.path.join(d, m["profile"]["directory"])).read().steps == EPOCHS * S
