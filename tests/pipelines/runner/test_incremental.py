"""Incremental runs (`--base` over a day's files only): a three-day MovieLens lineage (the sample split by its
timestamp) where each day reads and shards its own data, merges the token counts into the lineage's and its
profile into the base's (the plan made from the merged profile, the manifest naming the days it covers)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import profiles
from pipelines import runner
from pipelines.jobs import JobConfig
from tests.helpers import lineage_days
from tpu_embed.artifact import lineage
from tpu_embed.artifact.manifest import read_manifest

pytestmark = pytest.mark.slow  # builds a three-day lineage with the real jobs


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("incremental"))
    outs = lineage_days.build(d, parts=3)
    header, rows = lineage_days.split(d, parts=3)  # the same files again: the rows of each day
    return {"dir": d, "outs": outs, "header": header, "rows": rows}


def _profile(out):
    m = read_manifest(out)
    return profiles.ProfileStore(os.path.join(out, m.profile.directory)).read()


def test_a_day_reads_and_shards_its_own_data_only(days):
    for k, (out, rows) in enumerate(zip(days["outs"], days["rows"]), 1):
        m = read_manifest(out)
        assert [os.path.basename(i.path) for i in m.jobs["shard"].inputs] == [f"day{k}.csv"]
        assert m.counts.records_read == len(rows)
        assert m.counts.examples_written == len(rows)  # tail: pad
        assert m.vocabularies["zip"].tokens_counted == len(rows)  # this day's occurrences


def test_counts_are_merged_over_the_lineage(days):
    header, rows, outs = days["header"], days["rows"], days["outs"]
    for name in lineage_days.VOCABULARIES:
        per_day = [lineage_days.token_counts(header, r, name) for r in rows]
        for k, out in enumerate(outs, 1):
            t = lineage.read_token_counts(out, name).to_pylist()
            seen = [c for c in per_day[:k]]
            tokens = set().union(*seen)
            assert {x["token"]: x["count"] for x in t} == {tok: sum(c[tok] for c in seen) for tok in tokens}
            for x in t:
                assert x["last_day"] == max(d for d in range(1, k + 1) if x["token"] in per_day[d - 1])
        # New tokens come after the base's, ordered by their count over the lineage.
        t3 = lineage.read_token_counts(outs[2], name).to_pylist()
        base = read_manifest(outs[2]).vocabularies[name].base_tokens
        new = [(x["count"], x["token"]) for x in t3 if x["id"] >= base]
        assert new == sorted(new, reverse=True)


def test_the_profile_is_merged_into_the_base_and_the_plan_made_from_it(days, tmp_path):
    outs = days["outs"]
    ms = [read_manifest(o) for o in outs]
    assert [m.profile.days for m in ms] == [[1], [1, 2], [1, 2, 3]]
    assert [m.profile.base for m in ms] == [None, "../out1", "../out2"]
    steps = [m.shards.steps for m in ms]
    assert [_profile(o).steps for o in outs] == [steps[0], steps[0] + steps[1], sum(steps)]
    plan = json.load(open(os.path.join(outs[2], "plan.json")))
    assert plan["steps"] == sum(steps)  # the plan of day 3 is made from the merged profile
    # Day 2's profile is day 1's merged with the profile of day 2's own steps: run day 2 again over a copy of
    # day 1 without its profile (not merged, and the manifest says why).
    bare = str(tmp_path / "day1_without_profile")
    shutil.copytree(outs[0], bare)
    shutil.rmtree(os.path.join(bare, "profiles"))
    alone = str(tmp_path / "day2_alone")
    runner.run_all(JobConfig(spec=lineage_days.spec(["day2.csv"], days["dir"]), output=alone, base=bare))
    m = read_manifest(alone)
    assert m.profile.days == [2] and m.profile.base is None and "missing" in m.profile.not_merged
    assert open(os.path.join(alone, "vocab", "zip.txt"), "rb").read() == \
        open(os.path.join(outs[1], "vocab", "zip.txt"), "rb").read()
    assert _profile(outs[1]) == profiles.merge(_profile(outs[0]), _profile(alone))
    # The plan covers the window: day 3's limits are at least each day's alone.
    limits = ms[2].limits.max_ids_per_table
    assert all(limits[s] >= read_manifest(alone).limits.max_ids_per_table[s] for s in limits)


def test_a_profile_of_other_table_rows_is_not_merged(days, tmp_path):
    grows = {**lineage_days.VOCABULARIES, "zip": {"mode": "append", "num_oov_buckets": 2}}  # no capacity
    d = days["dir"]
    g1, g2 = str(tmp_path / "g1"), str(tmp_path / "g2")
    runner.run_all(JobConfig(spec=lineage_days.spec(["day1.csv"], d, grows), output=g1))
    runner.run_all(JobConfig(spec=lineage_days.spec(["day2.csv"], d, grows), output=g2, base=g1))
    m = read_manifest(g2)
    assert m.lineage.table_rows_changed == ["zip"]
    assert m.profile.days == [2] and "table rows changed" in m.profile.not_merged
    assert _profile(g2).steps == m.shards.steps


def test_the_profile_job_of_a_day_merges_as_run_does(days, tmp_path):
    d, outs = days["dir"], days["outs"]
    out = str(tmp_path / "profile3")
    runner.run_profile(JobConfig(spec=lineage_days.spec(["day3.csv"], d), output=out, vocab_dir=outs[2]))
    m = read_manifest(out)
    assert m.profile.days == [1, 2, 3] and m.profile.base == "../out2"
    assert _profile(out) == _profile(outs[2])
    # A profile directory shared with the base would merge the base into itself: not merged, and said so.
    shared = str(tmp_path / "shared3")
    base_profiles = os.path.join(outs[1], read_manifest(outs[1]).profile.directory)
    copy = str(tmp_path / "base_profiles")
    shutil.copytree(base_profiles, copy)
    try:
        runner.run_profile(JobConfig(spec=lineage_days.spec(["day3.csv"], d), output=shared, vocab_dir=outs[2],
                                     profile_dir=base_profiles))
        m = read_manifest(shared)
        assert m.profile.days == [3] and "this job's" in m.profile.not_merged
    finally:  # the base's profile as it was
        shutil.rmtree(base_profiles)
        shutil.copytree(copy, base_profiles)
