"""tpu_embed.jax.input_iterator up to the device boundary, against jax-tpu-embedding 0.2.0 on CPU.

Every step of the example specs' artifacts (criteo with `shards.layout: jax`, movielens with `both`, two
hosts): the iterator's `sparse` arrays equal, in structure, shape, dtype and bits, what jax's own
`preprocess_sparse_dense_matmul_input` makes of that step's global batch on the fly (jax_layout_server.py in
.venv-jax); labels, mask, dense and tensor-core features equal the parsed input rows. Then shuffled steps
(input_fn's permutation), epochs, verification and the one-line refusals. The iterator's `output="jax"` and
`tpu_embed.jax.specs` need jax: tests/conformance/test_jax_input_in_jax_venv.py runs them in .venv-jax.
"""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conformance.jax_examples import example_artifact, oracle_request
from tests.conformance.jax_oracle import JaxOracle
from tpu_embed.artifact.jax_records import segment_sizes
from tpu_embed.artifact.manifest import read_manifest
from tpu_embed.artifact.verify import ArtifactDamagedError
from tpu_embed.jax.input import PreprocessedArrays, input_iterator, step_order
from tpu_embed.sparsecore.jax_layout import PAD_ID

pytestmark = pytest.mark.conformance

SERVER = Path(__file__).with_name("jax_layout_server.py")
EXAMPLES = {"criteo": "jax", "movielens": "both"}  # criteo: jax's arrays alone; movielens: 2 hosts, TF's too


@pytest.fixture(scope="module")
def jax_oracle():
    o = JaxOracle(SERVER, name="jax-layout-oracle")
    yield o
    o.close()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """{name: (spec, artifact dir, steps' ExampleBlocks, {lead: the oracle's answer})}, built once."""
    cache: dict = {}

    def get(name, oracle=None, lead=False):
        if name not in cache:
            spec, out, sizes, steps = example_artifact(tmp_path_factory.mktemp(name), name, EXAMPLES[name])
            cache[name] = (spec, out, sizes, steps, {})
        spec, out, sizes, steps, answers = cache[name]
        if oracle is not None and lead not in answers:
            answers[lead] = oracle(oracle_request(spec, sizes, steps, lead))
            assert "error" not in answers[lead], answers[lead]
        return spec, out, steps, answers.get(lead)
    return get


def _same_shape(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, a.dtype, b.shape, b.dtype)


def _same_bits(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    _same_shape(a, b, what)
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg=what)


def _host_rows(spec, block, h):
    hb = spec.per_host_batch_size
    return block.slice(h * hb, (h + 1) * hb)


def _check_rows(spec, step, rows):
    """label, mask, dense and tensor-core features of a step == the host's parsed input rows."""
    _same_bits(step.label, rows.label.astype(np.float32), "label")
    _same_bits(step.mask, rows.mask.astype(np.float32), "mask")
    _same_bits(step.dense, rows.dense.astype(np.float32).reshape(spec.per_host_batch_size, -1), "dense")
    tc = {f.name: f for f in spec.tensor_core_features}
    assert sorted(step.tensor_core) == sorted(f.name for f in spec.tensor_core_features)
    for name, (ids, wts) in step.tensor_core.items():
        fb, width = rows.features[name], tc[name].tensor_core_width
        want_ids = np.zeros((fb.lengths.size, width), np.int32)
        want_w = np.zeros((fb.lengths.size, width), np.float32)
        starts = np.concatenate([[0], np.cumsum(fb.lengths)])
        for r in range(fb.lengths.size):
            n = min(int(fb.lengths[r]), width)
            want_ids[r, :n] = fb.ids[starts[r]:starts[r] + n]
            want_w[r, :n] = 1.0 if fb.weights is None else fb.weights[starts[r]:starts[r] + n]
        _same_bits(ids, want_ids, f"tc/{name}/ids")
        _same_bits(wts, want_w, f"tc/{name}/weights")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
@pytest.mark.parametrize("lead", [False, True])
def test_every_step_equals_jax_preprocessing_on_the_fly(artifacts, jax_oracle, name, lead):
    spec, out, steps, got = artifacts(name, jax_oracle, lead)
    stacks = sorted(got["stacks"])
    fj = read_manifest(out).shard_format.jax
    for s in fj["stacks"]:  # the buffer the iterator pads to by default: jax's own, from its statistics
        assert s["coo_buffer_size_per_device"] == got["stacks"][s["name"]]["coo_buffer_size_per_device"]
    for h in range(spec.topology.num_hosts):
        seen = list(input_iterator(out, host_index=h, has_leading_dimension=lead))
        assert [s.step for s in seen] == list(range(len(steps))) and {s.epoch for s in seen} == {0}
        for s in seen:
            theirs = got["steps"][s.step][h]
            assert isinstance(s.sparse, PreprocessedArrays)  # jax-tpu-embedding is not installed in this venv
            for st in stacks:
                where = f"step {s.step} host {h} {st}"
                _same_bits(s.sparse.lhs_row_pointers[st], theirs[st]["row_pointers"], f"{where} row pointers")
                seg = segment_sizes(s.sparse.lhs_row_pointers[st], fj).reshape(-1)
                for field, key in (("lhs_embedding_ids", "embedding_ids"), ("lhs_sample_ids", "sample_ids"),
                                   ("lhs_gains", "gains")):
                    ours = getattr(s.sparse, field)
                    assert sorted(ours) == stacks, field
                    _same_shape(ours[st], theirs[st][key], f"{where} {field}")
                    # jax writes each (device, SparseCore) segment up to its aligned end, and leaves the rest
                    # of the buffer as it found it (its kernel reads up to the row pointers): ours is padding.
                    mine = ours[st].reshape(seg.size, -1).view(np.int32)
                    them = np.asarray(theirs[st][key]).reshape(seg.size, -1).view(np.int32)
                    pad = np.float32(np.nan).view(np.int32) if field == "lhs_gains" else PAD_ID
                    for k, n in enumerate(seg.tolist()):
                        np.testing.assert_array_equal(mine[k, :n], them[k, :n], err_msg=f"{where} {field} {k}")
                        assert np.all(mine[k, n:] == pad), (where, field, k)
            nmb = np.asarray(theirs[stacks[0]]["num_minibatches"])
            np.testing.assert_array_equal(s.sparse.num_minibatches, nmb)
            assert s.sparse.num_minibatches.shape == nmb.shape
            _check_rows(spec, s, _host_rows(spec, steps[s.step], h))


def test_prefetch_and_the_caller_s_thread_give_the_same_steps(artifacts):
    spec, out, steps, _ = artifacts("movielens")
    a = list(input_iterator(out, host_index=1, prefetch=0))
    b = list(input_iterator(out, host_index=1, prefetch=3))
    assert len(a) == len(b) == len(steps)
    for x, y in zip(a, b):
        assert x.step == y.step
        for u, v in zip(_flat(x), _flat(y)):
            _same_bits(u, v, f"step {x.step}")


def _flat(s):
    out = [s.label, s.mask, s.dense, s.sparse.num_minibatches]
    for d in s.sparse[:4]:
        out += [d[k] for k in sorted(d)]
    for k in sorted(s.tensor_core):
        out += list(s.tensor_core[k])
    return out


def test_shuffled_steps_are_input_fn_s_permutation_and_epochs(artifacts):
    from tpu_embed.training.input import input_fn

    spec, out, steps, _ = artifacts("movielens")
    n = len(steps)
    in_order = {s.step: s for s in input_iterator(out, host_index=0)}
    seen = list(input_iterator(out, host_index=0, shuffle_steps=7, num_epochs=2))
    assert [s.step for s in seen] == [int(e["step"]) for e in input_fn(out, num_epochs=2, shuffle_steps=7)]
    assert [s.step for s in seen] == step_order(n, 7, 0).tolist() + step_order(n, 7, 1).tolist()
    assert [s.epoch for s in seen] == [0] * n + [1] * n
    assert step_order(n, 7, 0).tolist() != step_order(n, 7, 1).tolist() != list(range(n))
    for s in seen:  # each element is its step's own
        for u, v in zip(_flat(s), _flat(in_order[s.step])):
            _same_bits(u, v, f"step {s.step}")
    # num_epochs None: forever, in order; 0: nothing.
    it = input_iterator(out, host_index=1, num_epochs=None)
    many = list(itertools.islice(it, 2 * n + 1))
    it.close()
    assert [s.step for s in many] == list(range(n)) * 2 + [0] and many[-1].epoch == 2
    assert list(input_iterator(out, num_epochs=0)) == []


def test_compressed_shards_read_in_order_and_shuffled(tmp_path, artifacts):
    _, plain, steps, _ = artifacts("criteo")
    _, out, _, _ = example_artifact(tmp_path, "criteo", "jax", shards="compression: gzip")
    want = {s.step: s for s in input_iterator(plain)}
    for kw in ({}, {"shuffle_steps": 3}, {"verify": "sha256"}, {"verify": "sha256", "shuffle_steps": 3}):
        got = list(input_iterator(out, **kw))
        assert sorted(s.step for s in got) == list(range(len(steps))), kw
        for s in got:
            for u, v in zip(_flat(s), _flat(want[s.step])):
                _same_bits(u, v, f"{kw} step {s.step}")


def _copy(out, tmp_path):
    dst = str(tmp_path / "copy")
    shutil.copytree(out, dst)
    return dst, [os.path.join(dst, e.path) for e in read_manifest(dst).shard_files(0)]


def test_verification_refuses_damaged_shards(tmp_path, artifacts):
    _, out, _, _ = artifacts("criteo")
    dst, files = _copy(out, tmp_path)
    data = bytearray(Path(files[0]).read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of a payload: the CRC and the sha256 both see it
    Path(files[0]).write_bytes(bytes(data))
    with pytest.raises(Exception, match=os.path.basename(files[0])):
        list(input_iterator(dst, verify="sha256"))
    with pytest.raises(ArtifactDamagedError, match=os.path.basename(files[0])):  # as input_fn: when first opened
        list(input_iterator(dst, shuffle_steps=1))
    Path(files[0]).write_bytes(bytes(data[:-5]))  # a truncated file: refused at once by its size
    with pytest.raises(Exception, match=os.path.basename(files[0])):
        input_iterator(dst)
    os.remove(files[0])
    with pytest.raises(Exception, match=os.path.basename(files[0])):
        input_iterator(dst)


def test_one_line_refusals(tmp_path, artifacts):
    spec, out, steps, _ = artifacts("criteo")
    _, tf_only, _, _ = example_artifact(tmp_path, "criteo", "tensorflow")
    stack = input_iterator(out).__next__().sparse.lhs_row_pointers
    name = sorted(stack)[0]
    cases = [
        (dict(artifact_dir=tf_only), "shards: {layout: jax}"),
        (dict(host_index=1), "host_index 1 is not a host"),
        (dict(output="torch"), "output must be one of"),
        (dict(output="jax"), "output='jax' needs jax"),
        (dict(shuffle_steps=-1), "shuffle_steps must be"),
        (dict(shuffle_steps=True), "shuffle_steps must be"),
        (dict(num_epochs=-1), "num_epochs must be"),
        (dict(prefetch=-1), "prefetch must be"),
        (dict(verify="md5"), "verify"),
        (dict(expected_fingerprint="0" * 16), "was made for spec"),
        (dict(coo_buffer_sizes={"nope": 8}), "not jax stacks"),
    ]
    for kw, message in cases:
        kw = dict(kw)
        art = kw.pop("artifact_dir", out)
        with pytest.raises(ValueError, match=message) as e:
            list(input_iterator(art, **kw))
        assert "\n" not in str(e.value), str(e.value)
    # A COO buffer too small for a step: refused naming the step and the size that holds it.
    with pytest.raises(ValueError, match=r"step \d+, jax stack .*give at least \d+") as e:
        list(input_iterator(out, coo_buffer_sizes={name: 8 * spec.topology.num_sc_per_chip}))
    assert "\n" not in str(e.value)
