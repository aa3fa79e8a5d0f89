"""`tpu-embed remap`: the summary of a remap, the restorable output, and one line for each mistake."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.cli import main
from tests.helpers import remap as days


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import tensorflow as tf

    from tpu_embed.training.host_embedding import HostEmbedding
    d = tmp_path_factory.mktemp("remap_cli")
    spec = days.write_inputs(str(d))
    a = days.build_day(spec, "day1", str(d / "day1"))
    b = days.build_day(spec, "day2", str(d / "day2"))
    emb = HostEmbedding.from_artifact(a, seed=1)
    emb.build()
    path = tf.train.Checkpoint(embedding=emb).save(str(d / "ckpt" / "ckpt"))
    return d, a, b, path, emb


def test_remap_prints_the_tables_and_writes_a_restorable_checkpoint(setup, capsys):
    import tensorflow as tf

    from tpu_embed.training.host_embedding import HostEmbedding
    d, a, b, path, emb = setup
    out = str(d / "out" / "ckpt-0")
    # The checkpoint's directory stands for its latest checkpoint.
    assert main(["remap", "--from", a, "--to", b, "--checkpoint", str(d / "ckpt"), "--output", out,
                 "--chunk-rows", "16"]) == 0
    printed = capsys.readouterr().out
    assert f"-> {out} (host_embedding at 'embedding'" in printed
    assert "zip" in printed and "identity (copied)" in printed and "accumulators, linears" in printed
    emb_b = HostEmbedding.from_artifact(b)
    emb_b.build()
    tf.train.Checkpoint(embedding=emb_b).restore(out).assert_consumed()
    np.testing.assert_array_equal(emb_b.tables["user_id"].numpy(), emb.tables["user_id"].numpy())


@pytest.mark.parametrize("case, message, exit_code", [  # exit codes: pipelines.user_errors
    ("exists", "exists; pass overwrite=True", 1),  # the output holds a checkpoint (as `run`'s does an artifact)
    ("chunk", "--chunk-rows must be a positive number", 2),  # a bad flag value
    ("prefix", "has no variables of table", 1),  # the checkpoint does not hold it
    ("swapped", "was not trained on artifact A's vocabulary", 1),  # checkpoint and artifacts do not fit
])
def test_mistakes_are_one_line(setup, capsys, tmp_path, case, message, exit_code):
    d, a, b, path, _ = setup
    out = str(tmp_path / "ckpt-0")
    frm, to, extra = a, b, []
    if case == "exists":
        assert main(["remap", "--from", a, "--to", b, "--checkpoint", path, "--output", out]) == 0
        capsys.readouterr()
    elif case == "chunk":
        extra = ["--chunk-rows", "0"]
    elif case == "prefix":
        extra = ["--prefix", "model"]
    else:
        frm, to = b, a
    code = main(["remap", "--from", frm, "--to", to, "--checkpoint", path, "--output", out] + extra)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == exit_code and len(err) == 1 and err[0].startswith("tpu-embed remap: ") and message in err[0], err


def test_new_rows_are_seeded_by_artifact_b_unless_seed_is_given(setup, capsys, tmp_path):
    """Without --seed the summary names artifact B's fingerprint and a re-run writes the same bytes;
    --seed N writes other values, the same on every run."""
    d, a, b, path, _ = setup

    def run(name, *extra):
        out = str(tmp_path / name / "ckpt-0")
        assert main(["remap", "--from", a, "--to", b, "--checkpoint", path, "--output", out, *extra]) == 0
        printed = capsys.readouterr().out
        return printed, [open(out + s, "rb").read() for s in (".index", ".data-00000-of-00001")]

    printed, first = run("first")
    assert "new rows of default-initialized tables: seeded by artifact B's fingerprint" in printed
    assert run("again")[1] == first
    printed, seeded = run("seeded", "--seed", "5")
    assert "seeded by seed 5 and the table" in printed
    assert seeded != first and run("seeded-again", "--seed", "5")[1] == seeded
