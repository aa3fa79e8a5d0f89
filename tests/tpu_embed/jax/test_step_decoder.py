"""`tpu_embed.jax.step_decoder.StepDecoder` (what `input_iterator` decodes each record with: parsed in place, each
COO array copied once) against `tpu_embed.artifact.jax_records.decode_step`, the plain numpy decoder of the same
records, on small random models and batches packed by `pack_host` (no jax, no jobs)."""

from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conformance.jax_cases import jax_cases, model_of
from tpu_embed.artifact import jax_records
from tpu_embed.artifact.example_wire import encode_example
from tpu_embed.jax.step_decoder import StepDecoder
from tpu_embed.sparsecore import jax_layout as J


def _f32(a) -> tuple:
    return "bytes", [np.ascontiguousarray(a, "<f4").tobytes()]


def _record(step: int, hb: int, batches, fmt_jax) -> bytes:
    """A host's step record as the shard job writes it, without TF's arrays or tensor-core features."""
    feats = {"step": ("int64", [step]), "host": ("int64", [0]), "label": _f32(np.arange(hb)),
             "mask": _f32(np.ones(hb)), "dense": _f32(np.zeros(0))}
    feats.update(jax_records.encode_jax_features(batches, fmt_jax))
    return encode_example(feats)


def _format(jl, hb: int):
    return types.SimpleNamespace(jax=jax_records.jax_format(jl), host_batch_size=hb, dense_features=(),
                                 tensor_core_features=())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=jax_cases(max_devices=4), lead=st.booleans(), extra=st.sampled_from([None, 0, 8]))
def test_step_decoder_is_decode_step(case, lead, extra):
    """The same four arrays per stack (gains bit for bit), at each step's least COO buffers or larger ones."""
    jl = J.jax_layout(model_of(case))
    hb = 4
    fmt = _format(jl, hb)
    for s, step in enumerate(case["steps"]):
        batches = J.pack_host(jl, {n: J.HostFeature(*v) for n, v in step[0].items()})
        sizes = None if extra is None else {
            n: b.required_buffer_size_per_device + extra * jl.num_sc_per_device for n, b in batches.items()}
        rec = _record(s, hb, batches, fmt.jax)
        got_step, got = StepDecoder(fmt, sizes or {}, lead).decode(rec)
        want = jax_records.decode_step(rec, fmt.jax, has_leading_dimension=lead, coo_buffer_sizes=sizes)
        assert got_step == s
        rps, eids, sids, gains, nmb = got["sparse"]
        assert set(rps) == set(want)
        for name, (rp, eid, sid, g) in want.items():
            np.testing.assert_array_equal(rps[name], rp)
            np.testing.assert_array_equal(eids[name], eid)
            np.testing.assert_array_equal(sids[name], sid)
            np.testing.assert_array_equal(gains[name].view(np.int32), g.view(np.int32))
            assert rps[name].dtype == rp.dtype and gains[name].dtype == g.dtype and eids[name].shape == eid.shape
        np.testing.assert_array_equal(nmb, jax_records.num_minibatches(fmt.jax, lead))
        np.testing.assert_array_equal(got["label"], np.arange(hb, dtype=np.float32))


def test_a_buffer_too_small_names_the_step_and_the_size():
    case = {"tables": [{"name": "t", "vocabulary_size": 40, "dim": 8, "combiner": "sum", "optimizer": ("sgd", 0.1)}],
            "features": [{"name": "f", "table": "t", "per_chip": 4}],
            "num_devices": 1, "num_sc_per_device": 4, "num_hosts": 1}
    jl = J.jax_layout(model_of(case))
    splits = np.arange(5, dtype=np.int64) * 3
    batches = J.pack_host(jl, {"f": J.HostFeature(splits, np.arange(12, dtype=np.int64) % 5)})
    fmt = _format(jl, 4)
    name = jl.stacks[0].name
    with pytest.raises(ValueError, match=r"step 7, jax stack .*give at least"):
        StepDecoder(fmt, {name: 4}, False).decode(_record(7, 4, batches, fmt.jax))
