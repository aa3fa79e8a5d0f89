"""jax-tpu-embedding's CSR packing: the vectorised `pack_host` against `pack_host_reference`, its per-id
transcription of jax's C++ loops, on small random models and batches (no jax needed; both are compared with jax
itself in tests/conformance/test_jax_layout_conformance.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from tests.conformance.jax_cases import jax_cases, model_of
from tpu_embed.sparsecore import LimitExceededError
from tpu_embed.sparsecore import jax_layout as J
from tpu_embed.sparsecore.jax_layout_reference import pack_host_reference

FIELDS = ("row_pointers", "embedding_ids", "sample_ids", "segment_sizes", "max_ids_per_partition",
          "max_unique_ids_per_partition", "required_buffer_size")


def _host_features(host: dict) -> dict:
    return {n: J.HostFeature(*v) for n, v in host.items()}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=jax_cases(max_devices=4))
def test_pack_host_is_its_reference(case):
    """Every array and statistic equal, gains bit for bit (weights down to subnormals among the cases)."""
    jl = J.jax_layout(model_of(case))
    for step in case["steps"]:
        for host in step:
            feats = _host_features(host)
            a, b = J.pack_host(jl, feats), pack_host_reference(jl, feats)
            assert set(a) == set(b) == {s.name for s in jl.stacks}
            for name in a:
                for field in FIELDS:
                    np.testing.assert_array_equal(getattr(a[name], field), getattr(b[name], field), err_msg=field)
                np.testing.assert_array_equal(a[name].gains.view(np.int32), b[name].gains.view(np.int32))
                assert a[name].dropped_ids == b[name].dropped_ids == 0


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=jax_cases(max_devices=2))
def test_limits_check_the_largest_partition(case):
    """`pack_host(limits=...)` accepts the statistics it reports and refuses one id less, naming the stack."""
    jl = J.jax_layout(model_of(case))
    feats = _host_features(case["steps"][0][0])
    packed = J.pack_host(jl, feats)
    exact = {n: (int(b.max_ids_per_partition.max(initial=0)), int(b.max_unique_ids_per_partition.max(initial=0)))
             for n, b in packed.items()}
    J.pack_host(jl, feats, limits=exact)
    name, (ids, unique) = next(iter(exact.items()))
    if ids > 0:
        with pytest.raises(LimitExceededError, match=re.escape(name[:20])):
            J.pack_host(jl, feats, limits={name: (ids - 1, unique)})
