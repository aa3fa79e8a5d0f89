"""End to end: `run` on both example specs, every shard decoded back and compared with the raw rows.

Nothing lost, nothing invented: for every training step, chip, SparseCore
feature and example, the (vocabulary id, gain) pairs decoded from the CSR
buffers equal the raw CSV rows mapped through the vocabularies by plain
Python; vocabularies equal a plain Python count with TFT's ordering; labels,
dense values, masks and tensor-core ids match; the manifest's counts and
checksums are right; `tpu_embed.input_fn` reads the same tensors.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os

import numpy as np
import pytest

from pipelines import runner
from pipelines.jobs import JobConfig
from tests.helpers import SPECS
from tests.helpers.plain_reference import assert_shards_decode_to_raw_rows, plain_vocabulary
from tpu_embed.artifact import shard_records, tfrecord
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.shard_format import ShardFormat
from tpu_embed.artifact.spec import load_spec
from tpu_embed.compat.from_spec import embedding_config_spec
from tpu_embed.training.input import input_fn


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory):
    out = {}
    for name, path in SPECS.items():
        d = str(tmp_path_factory.mktemp(name))
        spec = load_spec(path)
        runner.run_all(JobConfig(spec=spec, output=d))
        out[name] = (spec, d)
    return out


# ---------------------------------------------------------------- tests

@pytest.mark.parametrize("name", ["criteo", "movielens"])
def test_vocabularies_equal_plain_python_count(artifacts, name):
    spec, d = artifacts[name]
    m = json.load(open(os.path.join(d, "manifest.json")))
    for key, feats in spec.vocabulary_groups().items():
        expect = plain_vocabulary(spec, key)
        for f in feats:
            with open(os.path.join(d, "vocab", f"{f.name}.txt"), "rb") as fh:
                got = fh.read().split(b"\n")[:-1]
            assert got == expect, (name, f.name)
        assert m["vocabularies"][key]["size"] == len(expect)


@pytest.mark.parametrize("name", ["criteo", "movielens"])
def test_shards_decode_to_raw_rows(artifacts, name):
    spec, d = artifacts[name]
    assert_shards_decode_to_raw_rows(spec, d, name)


@pytest.mark.parametrize("name", ["criteo", "movielens"])
def test_manifest_files_and_checksums(artifacts, name):
    spec, d = artifacts[name]
    m = json.load(open(os.path.join(d, "manifest.json")))
    assert m["schema_version"] == 1 and m["spec_fingerprint"] == spec.fingerprint
    # No limits in the spec: planned from the run's own profile (exact maxima), recorded with plan.json.
    plan = json.load(open(os.path.join(d, "plan.json")))
    assert m["limits"]["source"].startswith("planned: plan.json")
    assert m["limits"]["max_ids_per_table"] == plan["sparse_core_config"]["max_ids_per_table"]
    assert m["limits"]["max_ids_per_chip_per_sample"] == plan["sparse_core_config"]["max_ids_per_chip_per_sample"]
    kinds = collections.Counter(f["kind"] for f in m["files"])
    assert kinds["shard"] == spec.topology.num_hosts and kinds["profile"] > 0
    assert kinds["vocabulary"] == sum(len(v) for v in spec.vocabulary_groups().values())
    for f in m["files"]:
        data = open(os.path.join(d, f["path"]), "rb").read()
        assert hashlib.sha256(data).hexdigest() == f["sha256"] and len(data) == f["bytes"], f["path"]
    on_disk = {os.path.relpath(os.path.join(r, x), d) for r, _, xs in os.walk(d) for x in xs} - {"manifest.json"}
    assert on_disk == {f["path"] for f in m["files"]}, "files without a manifest entry (or temp files left)"
    for feat in spec.categorical:
        assert m["features"][feat.name]["table_vocabulary_size"] >= 1


def test_profile_written_through_profiles_store(artifacts):
    import profiles
    spec, d = artifacts["criteo"]
    m = json.load(open(os.path.join(d, "manifest.json")))
    prof = profiles.ProfileStore(os.path.join(d, m["profile"]["directory"])).read()
    assert prof.steps == m["shards"]["steps"]


def test_input_fn_matches_numpy_decoder(artifacts):
    spec, d = artifacts["movielens"]
    m = read_manifest(d)
    fmt = ShardFormat.from_json(m["shards"]["format"])
    ds = input_fn(d, host_index=1, expected_fingerprint=spec.fingerprint)
    recs = [shard_records.decode_record(r, fmt) for p in shard_records.shard_files(d, 1)
            for r in tfrecord.read_records(p)]
    n = 0
    for el, rec in zip(ds, recs):
        n += 1
        np.testing.assert_array_equal(el["label"].numpy(), rec["label"])
        np.testing.assert_array_equal(el["dense"].numpy(), rec["dense"])
        for stack, dd in rec["sparse_core"][0].items():
            t = el["sparse_core"][0][stack]
            ids = dd["ids_unpadded_size"]
            assert int(t["ids_unpadded_size"]) == ids
            _, rp_buf, ids_buf = [s for s in fmt.stacks if s[0] == stack][0]
            assert t["sorted_token_ids"].shape[0] == ids_buf and t["row_pointers"].shape[0] == rp_buf
            np.testing.assert_array_equal(t["sorted_token_ids"].numpy()[:ids], dd["sorted_token_ids"])
            np.testing.assert_array_equal(t["sorted_gains"].numpy()[:ids], dd["sorted_gains"])
        g = el["tensor_core"]["gender"]
        assert g.to_list() == [rec["tensor_core"]["gender"]["ids"][a:b].tolist() for a, b in zip(
            np.concatenate([[0], np.cumsum(rec["tensor_core"]["gender"]["lengths"])])[:-1],
            np.cumsum(rec["tensor_core"]["gender"]["lengths"]))]
    assert n == len(recs) == m["shards"]["steps"]
    with pytest.raises(ValueError, match="made for spec"):
        input_fn(d, expected_fingerprint="0" * 64)


def test_vocab_files_work_with_tensorflow_lookups(artifacts):
    """The files are what categorical_column_with_vocabulary_file / tft.apply_vocabulary read; OOV agrees."""
    import tensorflow as tf
    spec, d = artifacts["criteo"]
    path = os.path.join(d, "vocab", "C3.txt")
    tokens = open(path, "rb").read().split(b"\n")[:-1]
    table = tf.lookup.StaticVocabularyTable(tf.lookup.TextFileInitializer(
        path, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER),
        num_oov_buckets=1)
    probe = tokens[:5] + [b"never-seen-token"]
    assert table.lookup(tf.constant(probe)).numpy().tolist() == [0, 1, 2, 3, 4, len(tokens)]
    # The seed API's columns load from the same files.
    ecs = embedding_config_spec(spec, vocab_dir=os.path.join(d, "vocab"),
                                vocab_sizes=read_manifest(d).vocabulary_sizes)
    assert len(ecs.feature_columns) == 26
    fc = ecs.to_feature_config(spec.per_chip_batch_size)
    assert fc["C3"].table.vocabulary_size == len(tokens) + 1
