"""Gains of tiny weights against TensorFlow's own kernels (tensorflow-tpu 2.20 on CPU), bit for bit.

TF's preprocessing kernels run with the CPU's flush-to-zero and denormals-are-zero modes: a subnormal
weight reads as zero of its sign wherever it is an operand (combiner sums, merged duplicates, the product
with the combiner scale), and a result below 2**-126 is written as zero of its sign. The weights here are
drawn near and below 2**-126, with normal weights whose gains or sums underflow, for every combiner and
with duplicate ids in a sample; every implementation of `preprocess` is compared.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conformance import cases as C
from tests.conformance.test_csr_conformance import _compare
from tpu_embed.sparsecore import csr

pytestmark = pytest.mark.conformance

_TINY = [1e-40, 1e-39, 2.0 ** -126, 2.0 ** -127, 2.0 ** -149, 1e-45,  # subnormal, or the smallest normal
         2.0 ** -125, 1.5 * 2.0 ** -126, 2.0 ** -100, 1e-30, 2.0 ** -63, 2.0 ** -64, 1e-20]  # tiny normals
_ORDINARY = [0.0, 0.5, 1.0, 1.5, 3.0]
# Mean: a sum above 2**126 has a scale below 2**-126; sqrtn: squares that overflow. Positive only, so that
# no sum is inf - inf.
_HUGE = [1e38, 2e38, 1e20]
POOL = np.array(_TINY + [-x for x in _TINY] + _ORDINARY + [-x for x in _ORDINARY[1:]] + _HUGE, np.float32)
# Normal weights whose squares stay normal, with gains or scales below 2**-126 all the same (2**-60 / 1e20,
# mean sums above 2**126): what the numpy path detects after computing with gradual underflow.
_SMALL = [2.0 ** -63, 2.0 ** -60, 1e-18]
UNDERFLOWING = np.array(_SMALL + [-x for x in _SMALL] + [0.0, 1.0, -1.0, 1e20, 1e38, 2e38], np.float32)


@st.composite
def tiny_weight_cases(draw):
    case = draw(C.cases(weighted=True, allow_sequence=False, limit_modes=("default",), max_chips=4))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    p_tiny = draw(st.sampled_from([0.2, 0.5, 0.9]))
    underflowing = draw(st.booleans())
    for spec in case["weights"].values():
        w = spec["values"]
        if underflowing:
            spec["values"] = rng.choice(UNDERFLOWING, w.shape).astype(np.float32)
            continue
        tiny = rng.random(w.shape) < p_tiny
        spec["values"] = np.where(tiny, rng.choice(POOL[:2 * len(_TINY)], w.shape),
                                  rng.choice(POOL, w.shape)).astype(np.float32)
    return case


IMPLEMENTATIONS = ("native", "numpy", "reference") if csr.native_available() else ("numpy", "reference")


@settings(max_examples=80)
@given(case=tiny_weight_cases())
def test_gains_of_tiny_weights_match_tensorflow(case, oracle):
    _compare(case, oracle, implementations=IMPLEMENTATIONS)


def test_subnormal_weights_are_flushed_as_tensorflow_flushes(oracle):
    """By hand, per combiner and with a sum table stacked beside a mean one (a sum sample's gains are copied,
    the others' multiplied): what TF writes for subnormal weights and underflowing gains."""
    w = np.array([1e-40, -1e-40, 1e-40, 2.0 ** -125, -1.5 * 2.0 ** -126, 1e-30, 1e10, 1e-40], np.float32)
    ids = np.array([3, 3, 5, 7, 7, 9, 11, 13])
    splits = np.array([0, 3, 5, 7, 8])
    for combiners in (["sum"], ["mean"], ["sqrtn"], ["sum", "mean"]):
        tables = [{"name": f"t{i}", "vocabulary_size": 16, "dim": 8, "combiner": c} for i, c in enumerate(combiners)]
        names = [f"f{i:02d}" for i in range(len(combiners))]
        case = {"tables": tables, "num_chips": 1, "num_sc_per_chip": 4,
                "features": [{"name": n, "table": t["name"], "output_shape": [4]} for n, t in zip(names, tables)],
                "inputs": {n: {"kind": "ragged", "values": ids, "row_splits": splits} for n in names},
                "weights": {n: {"kind": "ragged", "values": w, "row_splits": splits} for n in names}}
        assert _compare(case, oracle, implementations=IMPLEMENTATIONS) == "ok", combiners
