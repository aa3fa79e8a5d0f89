"""Shards of artifacts with balanced ids (`partition: {ids: balanced}`) against TensorFlow's own SparseCore kernels
(tensorflow-tpu 2.20 in the oracle venv) and jax-tpu-embedding's preprocessing (the jax venv).

The ids are the vocabulary files' lines, so every consumer takes them as it takes frequency-ordered ids; these
tests check that the CSR packed from them is TF's and jax's bit for bit: for every step and chip of the example
variants, TF's `_preprocess_features` of the chip's raw CSV rows mapped through the artifact's (balanced)
vocabulary files by plain Python equals the shard records' arrays; and the jax records of every step equal jax's
own preprocessing (tests/conformance/test_jax_layout_conformance.py's check, run on balanced artifacts).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from pipelines import runner
from pipelines.jobs import JobConfig
from pipelines.mapping import vocabulary as pvocab
from tests.conformance.test_training_conformance import chip_batch
from tests.helpers.plain_reference import plain_vocabulary, raw_rows
from tests.helpers.training import variant_spec
from tpu_embed.artifact import shard_records, tfrecord
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.spec import PartitionSpec

pytestmark = pytest.mark.conformance


def balanced(spec):
    out = spec.model_copy(update={"partition": PartitionSpec(ids="balanced")})
    out._base_dir, out._source_path = spec.base_dir, spec.source_path
    return out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = {}
    for name in ("criteo4", "movielens2"):
        spec = balanced(variant_spec(name))
        d = str(tmp_path_factory.mktemp(name))
        runner.run_all(JobConfig(spec=spec, output=d))
        out[name] = (spec, d)
    return out


def _optimizer(spec, table):
    opt = spec.table(table).optimizer or spec.optimizer
    return (opt["type"], spec.table(table).learning_rate or opt["learning_rate"])


@pytest.mark.parametrize("name", ["criteo4", "movielens2"])
def test_shards_of_balanced_ids_equal_tensorflows_kernels(artifacts, oracle, name):
    spec, out = artifacts[name]
    m = read_manifest(out)
    sizes = m.vocabulary_sizes
    vocabs = {k: pvocab.read_vocabulary_file(open(os.path.join(out, "vocab", f"{fs[0].name}.txt"), "rb").read())
              for k, fs in spec.vocabulary_groups().items()}
    # The ids are not frequency order's (else this would test nothing new), and the same tokens.
    moved = [k for k in vocabs if vocabs[k] != plain_vocabulary(spec, k)]
    assert moved and all(sorted(vocabs[k]) == sorted(plain_vocabulary(spec, k)) for k in vocabs)
    model = spec.model(sizes)
    tables = [{"name": t.name, "vocabulary_size": t.vocabulary_size, "dim": t.dim, "combiner": t.combiner,
               "optimizer": _optimizer(spec, t.name)} for t in model.tables]
    features = [{"name": f.name, "table": f.table.name, "output_shape": list(f.output_shape)} for f in model.features]
    lim = m.limits
    fmt = m.shard_format
    rows = raw_rows(spec)
    records = [r for f in shard_records.shard_files(out, 0, m) for r in tfrecord.read_records(f)]
    assert len(records) == m.counts.steps
    compared = 0
    for step, rec in enumerate(records):
        ours = shard_records.decode_record(rec, fmt)["sparse_core"]
        for chip in range(spec.topology.num_chips):
            req = {"op": "preprocess", "tables": tables, "features": features,
                   "num_chips": spec.topology.num_chips, "num_sc_per_chip": spec.topology.num_sc_per_chip,
                   "inputs": chip_batch(spec, rows, vocabs, step, chip), "weights": None,
                   "max_ids_per_table": lim.max_ids_per_table, "max_unique_ids_per_table": lim.max_unique_ids_per_table,
                   "max_ids_per_chip_per_sample": lim.max_ids_per_chip_per_sample,
                   "allow_id_dropping": lim.allow_id_dropping}
            tf_out = oracle(req)
            assert "error" not in tf_out, tf_out.get("error")
            assert list(tf_out) == list(ours[chip])
            for stack, t in tf_out.items():
                x = ours[chip][stack]
                for field in ("row_pointers", "sorted_sample_ids", "sorted_token_ids"):
                    np.testing.assert_array_equal(x[field], t[field], err_msg=f"{name} {step} {chip} {stack} {field}")
                np.testing.assert_array_equal(x["sorted_gains"].view(np.uint32), t["sorted_gains"].view(np.uint32))
                compared += 1
    assert compared == m.counts.steps * spec.topology.num_chips * len(m.stacks)


@pytest.mark.parametrize("name", ["criteo", "movielens"])
def test_jax_records_of_balanced_ids_equal_jax_preprocessing(tmp_path, monkeypatch, name):
    """The jax layout's check of every step (its stacking, its limits from its own statistics, its arrays bit for
    bit) on the example specs with balanced ids."""
    from tests.conformance import test_jax_layout_conformance as J
    from tests.conformance.jax_oracle import JaxOracle

    real = J.example_artifact
    monkeypatch.setattr(J, "example_artifact", lambda tmp, n: real(
        tmp, n, edit=lambda text: text + "\npartition: {ids: balanced}\n"))
    o = JaxOracle(J.SERVER, name="jax-layout-oracle")
    try:
        J.test_example_shards_decode_to_jax_preprocessing(tmp_path, o, name, False)
    finally:
        o.close()
    from tpu_embed.artifact.manifest import read_manifest as read
    (out,) = [str(p) for p in tmp_path.iterdir() if p.is_dir() and (p / "manifest.json").exists()]
    assert any((v.ids or {}).get("order") == "balanced" for v in read(out).vocabularies.values())
