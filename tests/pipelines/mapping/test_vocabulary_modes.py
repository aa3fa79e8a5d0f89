"""Vocabulary modes append / frozen, capacity and lineages (`pipelines.mapping.vocabulary_modes`,
`tpu_embed.artifact.lineage`): a two-day lineage on the MovieLens sample split by its timestamp, the ordering
rule of new tokens against plain Python, the refusals, and the same bytes with one worker and two processes."""

from __future__ import annotations

import collections
import json
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines import cli, runner
from pipelines.jobs import JobConfig
from pipelines.mapping import ids as mapping
from pipelines.mapping import vocabulary_modes as modes
from pipelines.read.parse import FeatureValues
from pipelines.user_errors import UserError
from tests.helpers.lineage_days import spec as day_spec
from tests.helpers.lineage_days import split, token_counts
from tpu_embed.artifact import lineage
from tpu_embed.artifact.load import load_artifact
from tpu_embed.artifact.manifest import read_manifest

# ---------------------------------------------------------------- the ordering rule, against plain Python

def plain_mode(counts, base, *, mode, day, top_k, threshold, capacity):
    """The rule of docs/how-to/daily-retraining.md in plain Python. `base`: [(token, in vocabulary, count,
    last_day)], its vocabulary first. Returns (vocabulary, {token: (id, count, last_day)}, overflow tokens)."""
    base_vocab = [t for t, v, _, _ in base if v]
    merged = {t: (c + counts.get(t, 0), day if t in counts else last) for t, _, c, last in base}
    for t, c in counts.items():
        merged.setdefault(t, (c, day))
    vocab = list(base_vocab)
    others = sorted(((c, t) for t, (c, _) in merged.items() if t not in set(base_vocab)), reverse=True)
    overflow = []
    if mode == "append":
        qualified = [t for c, t in others if threshold is None or c >= threshold]
        if top_k is not None:
            qualified = qualified[:max(0, top_k - len(base_vocab))]
        room = len(qualified) if capacity is None else capacity - len(base_vocab)
        vocab += qualified[:room]
        overflow = qualified[room:]
    rows = {t: (vocab.index(t) if t in vocab else -1, *merged[t]) for t in merged}
    return vocab, rows, overflow


tokens = st.binary(min_size=1, max_size=3).filter(lambda b: b"\n" not in b and b"\r" not in b)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(tokens, st.integers(1, 6), max_size=25),
       st.dictionaries(tokens, st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 2)), max_size=16),
       st.sampled_from(["append", "frozen"]), st.one_of(st.none(), st.integers(1, 30)),
       st.one_of(st.none(), st.integers(0, 4)), st.integers(0, 20), st.integers(1, 3))
def test_new_tokens_are_ordered_as_tft_orders_a_vocabulary(counts, base_rows, mode, top_k, threshold, extra, day):
    # The base: its vocabulary (in any order: ids are positions) first, then the other tokens it counted.
    # (a token out of the base's vocabulary is there because it was counted: its count is at least 1)
    base = sorted(((t, v, c if v else max(c, 1), last) for t, (v, c, last) in base_rows.items()),
                  key=lambda r: not r[1])
    nb = sum(1 for r in base if r[1])
    capacity = nb + extra if extra < 15 else None  # some lineages with room to spare, some without a capacity
    table = pa.table({"token": pa.array(list(counts), pa.large_binary()), "count": pa.array(list(counts.values()),
                                                                                          pa.int64())})
    base_table = pa.table({"token": pa.array([r[0] for r in base], pa.large_binary()),
                           "id": pa.array([i if r[1] else -1 for i, r in enumerate(base)], pa.int64()),
                           "count": pa.array([r[2] for r in base], pa.int64()),
                           "last_day": pa.array([r[3] for r in base], pa.int64())})
    r = modes.apply_mode(table, base_table, mode=mode, day=day + 3, top_k=top_k, frequency_threshold=threshold,
                         capacity=capacity)
    vocab, rows, overflow = plain_mode(counts, base, mode=mode, day=day + 3, top_k=top_k, threshold=threshold,
                                       capacity=capacity)
    assert r.vocabulary == vocab
    got = r.table.to_pylist()
    assert {x["token"]: (x["id"], x["count"], x["last_day"]) for x in got} == rows
    assert [x["id"] for x in got] == list(range(len(vocab))) + [-1] * (len(got) - len(vocab))
    rest = [(x["count"], x["token"]) for x in got[len(vocab):]]
    assert rest == sorted(rest, reverse=True)  # the tokens left out, in TFT order too
    assert (r.tokens, r.base_tokens, r.new_tokens) == (len(vocab), nb, len(vocab) - nb)
    # The figures are about this run's data.
    seen_overflow = [t for t in overflow if t in counts]
    assert r.capacity_overflow_tokens == len(seen_overflow)
    assert r.capacity_overflow_count == sum(counts[t] for t in seen_overflow)
    assert r.not_admitted_tokens == len([t for t in counts if t not in vocab])
    assert r.not_admitted_count == sum(c for t, c in counts.items() if t not in vocab)
    assert r.covered_count == sum(c for t, c in counts.items() if t in vocab)
    # Bytes: the token-count file round-trips.
    assert lineage.parse_token_counts(lineage.token_counts_bytes(r.table)).to_pylist() == got


def test_oov_ids_follow_the_capacity():
    spec = day_spec(["day1.csv"], "/tmp", {"zip": {"mode": "append", "capacity": 50, "num_oov_buckets": 3}})
    f = spec.feature("zip")
    fv = FeatureValues(np.array([2, 1], np.int64), pa.array([b"a", b"zz", b"b"], pa.large_binary()))
    block = mapping.map_feature(f, fv, spec, pa.array([b"a", b"b"], pa.large_binary()), collections.Counter(),
                                oov_base=50)
    buckets = mapping.fingerprint64_buckets(pa.array([b"zz"], pa.large_binary()), 3)
    assert block.ids.tolist() == [0, 50 + int(buckets[0]), 1]


# ---------------------------------------------------------------- a two-day lineage

FEATURES = {
    "genres": {"mode": "append", "capacity": 40},
    "zip": {"mode": "append", "capacity": 120, "num_oov_buckets": 2},  # day 2 overflows it
    "occupation": {"mode": "append"},  # no capacity: grows
    "age": {},  # rebuild beside them
}


def _vocab(d, name):
    return open(os.path.join(d, "vocab", f"{name}.txt"), "rb").read().split(b"\n")[:-1]


@pytest.fixture(scope="module")
def lineage_days(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("lineage"))
    header, (rows1, rows2) = split(d, parts=2)
    spec1 = day_spec(["day1.csv"], d, FEATURES)
    spec2 = day_spec(["day2.csv"], d, FEATURES)
    day1, day2 = os.path.join(d, "out1"), os.path.join(d, "out2")
    runner.run_all(JobConfig(spec=spec1, output=day1))
    runner.run_all(JobConfig(spec=spec2, output=day2, base=day1))
    return {"dir": d, "header": header, "rows": (rows1, rows2), "spec": spec2, "day1": day1, "day2": day2}


def test_append_keeps_every_base_id_and_adds_new_tokens_after_them(lineage_days):
    L = lineage_days
    m1, m2 = read_manifest(L["day1"]), read_manifest(L["day2"])
    for name in ("genres", "zip", "occupation"):
        v1, v2 = _vocab(L["day1"], name), _vocab(L["day2"], name)
        assert v2[:len(v1)] == v1, name  # every day-1 token keeps its id
        info = m2.vocabularies[name]
        assert (info.mode, info.base_tokens, info.tokens) == ("append", len(v1), len(v2))
        assert info.new_tokens == len(v2) - len(v1)
        new = v2[len(v1):]
        c2 = token_counts(L["header"], L["rows"][1], name)
        assert [c2[t] for t in new] == sorted((c2[t] for t in new), reverse=True)
    # The first day of an append lineage without a capacity is exactly the vocabulary rebuild makes.
    rebuilt = os.path.join(L["dir"], "rebuilt1")
    runner.run_vocab(JobConfig(spec=day_spec(["day1.csv"], L["dir"], {"occupation": {}}), output=rebuilt))
    assert _vocab(rebuilt, "occupation") == _vocab(L["day1"], "occupation")
    assert m1.lineage.day == 1 and m1.lineage.base is None


def test_capacity_keeps_the_table_rows_and_layout_and_counts_the_overflow(lineage_days):
    L = lineage_days
    m1, m2 = read_manifest(L["day1"]), read_manifest(L["day2"])
    for name, cap in (("genres", 40), ("zip", 120)):
        assert m1.vocab_sizes[name] == m2.vocab_sizes[name] == cap
        assert m2.features[name].table_vocabulary_size == cap + FEATURES[name].get("num_oov_buckets", 1)
    changed = sorted(k for k in m2.vocab_sizes if m1.vocab_sizes[k] != m2.vocab_sizes[k])
    assert m2.lineage.table_rows_changed == changed and not {"genres", "zip"} & set(changed)
    zip2 = m2.vocabularies["zip"]
    c2 = token_counts(L["header"], L["rows"][1], "zip")
    v1 = _vocab(L["day1"], "zip")
    unseen = {t: c for t, c in c2.items() if t not in v1}
    assert zip2.tokens == 120 and zip2.new_tokens == 120 - len(v1)
    assert zip2.capacity_overflow_tokens == len(unseen) - zip2.new_tokens > 0
    assert zip2.not_admitted_tokens == zip2.capacity_overflow_tokens  # no threshold: every one qualified
    vocab2 = set(_vocab(L["day2"], "zip"))
    assert m2.counts.ids["zip"]["oov"] == sum(c for t, c in c2.items() if t not in vocab2) == zip2.not_admitted_count
    # The model and its stacking are the same both days, but for the table that grew.
    a1, a2 = load_artifact(L["day1"]), load_artifact(L["day2"])
    rows = lambda a: {f.table.name: f.table.vocabulary_size for f in a.model.features}  # noqa: E731
    assert {k: v for k, v in rows(a1).items() if k != "occupation"} == \
        {k: v for k, v in rows(a2).items() if k != "occupation"}


def test_counts_and_last_day_of_every_token(lineage_days):
    L = lineage_days
    for name in ("genres", "zip", "occupation"):
        c1 = token_counts(L["header"], L["rows"][0], name)
        c2 = token_counts(L["header"], L["rows"][1], name)
        t = lineage.read_token_counts(L["day2"], name).to_pylist()
        v2 = _vocab(L["day2"], name)
        assert [x["token"] for x in t[:len(v2)]] == v2 and [x["id"] for x in t[:len(v2)]] == list(range(len(v2)))
        # Counts are merged: each token's count over both days, every token of either day listed.
        both = set(c1) | set(c2)
        assert {x["token"]: x["count"] for x in t} == {tok: c1.get(tok, 0) + c2.get(tok, 0) for tok in both}
        for x in t:
            assert x["last_day"] == (2 if x["token"] in c2 else 1), (name, x)
            assert x["token"] in c1 or x["token"] in c2
    assert not os.path.exists(os.path.join(L["day2"], "vocab", lineage.counts_filename("age")))  # rebuild: none


def test_lineage_records_the_base(lineage_days):
    L = lineage_days
    m1, m2 = read_manifest(L["day1"]), read_manifest(L["day2"])
    assert m2.lineage.id == m1.lineage.id == m1.lineage.vocabulary_fingerprint[:32]
    assert (m2.lineage.day, m2.lineage.base.day, m2.lineage.base.path) == (2, 1, "../out1")
    assert m2.lineage.base.vocabulary_fingerprint == m1.lineage.vocabulary_fingerprint
    assert m2.spec_fingerprint == m1.spec_fingerprint  # same spec, other data and base
    assert lineage.check_same_lineage([L["day1"], L["day2"]])[1].lineage.day == 2
    with pytest.raises(lineage.LineageError, match="give the days in order"):
        lineage.check_same_lineage([L["day2"], L["day1"]])
    text = cli.summary(m2, L["day2"])
    assert "lineage " + m1.lineage.id[:12] + " day 2, base ../out1 (day 1)" in text
    assert "zip: append, 120 tokens of capacity 120" in text


def test_frozen_keeps_the_base_vocabulary_and_counts_the_rest(lineage_days):
    L = lineage_days
    frozen = {k: dict(v, mode="frozen") if v else v for k, v in FEATURES.items()}
    out = os.path.join(L["dir"], "frozen2")
    runner.run_all(JobConfig(spec=day_spec(["day2.csv"], L["dir"], frozen), output=out, base=L["day1"], day=5))
    m = read_manifest(out)
    assert m.lineage.day == 5
    for name in ("genres", "zip", "occupation"):
        assert _vocab(out, name) == _vocab(L["day1"], name)
        c2 = token_counts(L["header"], L["rows"][1], name)
        v1 = set(_vocab(L["day1"], name))
        info = m.vocabularies[name]
        assert (info.mode, info.new_tokens) == ("frozen", 0)
        assert info.not_admitted_tokens == len([t for t in c2 if t not in v1])
        assert m.counts.ids[name]["oov"] == sum(c for t, c in c2.items() if t not in v1) == info.not_admitted_count
    assert m.lineage.table_rows_changed == []


def test_unrelated_or_unusable_bases_are_refused(lineage_days, tmp_path):
    L = lineage_days
    d = L["dir"]

    def run(spec, **kw):
        runner.run_vocab(JobConfig(spec=spec, output=str(tmp_path / "out"), **kw))

    other = day_spec(["day2.csv"], d, {**FEATURES, "zip": {"mode": "append", "capacity": 120, "num_oov_buckets": 1}})
    with pytest.raises(lineage.LineageError, match=r"other features or tables \(feature 'zip'"):
        run(other, base=L["day1"])
    wider = day_spec(["day2.csv"], d, FEATURES, tables=[{"name": "zip", "dim": 16}])
    with pytest.raises(lineage.LineageError, match="table 'zip'"):
        run(wider, base=L["day1"])
    with pytest.raises(lineage.LineageError, match=r"capacity 50 is below the \d+ tokens of the base"):
        run(day_spec(["day2.csv"], d, {**FEATURES, "zip": {"mode": "append", "capacity": 50, "num_oov_buckets": 2}}),
            base=L["day1"])
    with pytest.raises(lineage.LineageError, match="--day 1 is not after the base's day 1"):
        run(L["spec"], base=L["day1"], day=1)
    with pytest.raises(lineage.LineageError, match="is the run's --output"):
        runner.run_vocab(JobConfig(spec=L["spec"], output=L["day1"], base=L["day1"]))
    frozen = day_spec(["day2.csv"], d, {"zip": {"mode": "frozen"}})
    with pytest.raises(lineage.LineageError, match=r"vocabularies \['zip'\] have mode frozen"):
        run(frozen)
    with pytest.raises(UserError, match="no vocabulary of this spec has mode append or frozen"):
        run(day_spec(["day2.csv"], d, {"zip": {}}), base=L["day1"])
    with pytest.raises(UserError, match="tft"):
        run(L["spec"], base=L["day1"], vocab_engine="tft")
    # A rebuild artifact has no lineage; a lineage of other data has another id.
    rebuilt = os.path.join(d, "rebuilt_base")
    runner.run_vocab(JobConfig(spec=day_spec(["day1.csv"], d, {k: {} for k in FEATURES}), output=rebuilt))
    with pytest.raises(lineage.LineageError, match="has no lineage"):
        run(L["spec"], base=rebuilt)
    elsewhere = os.path.join(d, "elsewhere1")
    runner.run_vocab(JobConfig(spec=day_spec(["day2.csv"], d, FEATURES), output=elsewhere))
    with pytest.raises(lineage.LineageError, match="unrelated lineages"):
        lineage.check_same_lineage([L["day1"], elsewhere])


def test_the_spec_base_and_the_cli_flag(lineage_days, tmp_path, capsys):
    L = lineage_days
    spec_path = tmp_path / "spec.yaml"
    raw = json.loads(json.dumps(L["spec"].to_dict()))
    raw["inputs"]["patterns"] = [os.path.join(L["dir"], "day2.csv")]
    raw["base"] = os.path.relpath(L["day1"], tmp_path)  # relative to the spec file
    import yaml
    spec_path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "day2"
    assert cli.main(["vocab", "--spec", str(spec_path), "--output", str(out)]) == 0
    assert read_manifest(str(out)).lineage.base.day == 1
    assert "lineage" in capsys.readouterr().out
    # --base overrides the spec's; a refusal is one line, exit code 1.
    assert cli.main(["vocab", "--spec", str(spec_path), "--output", str(tmp_path / "x"), "--base",
                     str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--base" in err[0] and "missing" in err[0]
    # The base given as the output, with --overwrite: refused before the output (the base) is touched.
    before = open(os.path.join(out, "manifest.json"), "rb").read()
    assert cli.main(["vocab", "--spec", str(spec_path), "--output", str(out), "--base", str(out),
                     "--overwrite"]) == 1
    assert "is the run's --output" in capsys.readouterr().err
    assert open(os.path.join(out, "manifest.json"), "rb").read() == before


def test_the_feature_column_api_refuses_a_capacity(lineage_days):
    from tpu_embed.compat.from_spec import feature_columns
    with pytest.raises(ValueError, match="capacity=40 rows, which categorical_column_with_vocabulary_file cannot"):
        feature_columns(lineage_days["spec"], os.path.join(lineage_days["day2"], "vocab"))


@pytest.mark.slow
def test_one_worker_and_two_processes_give_identical_bytes(lineage_days, tmp_path):
    L = lineage_days
    outs = []
    for name, args in (("one", []), ("two", ["--direct_num_workers=2", "--direct_running_mode=multi_processing"])):
        out = str(tmp_path / name / "day2")
        runner.run_all(JobConfig(spec=L["spec"], output=out, base=L["day1"], chunk_rows=23, steps_per_file=3), args)
        outs.append(out)

    def files(d):
        return {os.path.relpath(os.path.join(r, x), d): open(os.path.join(r, x), "rb").read()
                for r, _, xs in os.walk(d) for x in xs}
    fa, fb = files(outs[0]), files(outs[1])
    assert sorted(fa) == sorted(fb) and "vocab/zip.counts.parquet" in fa
    for p in fa:
        assert fa[p] == fb[p], p
    assert fa["vocab/zip.txt"] == open(os.path.join(L["day2"], "vocab", "zip.txt"), "rb").read()
