"""Random models and host batches for jax-tpu-embedding's layout (`jax_cases`), as plain data: compared with
jax itself (test_jax_layout_conformance.py) and with the per-id reference (tests/tpu_embed/sparsecore/
test_jax_layout.py, no jax needed)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from tpu_embed.core.model import FeatureConfig, ModelConfig, OptimizerConfig, TableConfig
from tpu_embed.core.topology import Topology


@st.composite
def jax_cases(draw, max_devices=8):
    nsc = draw(st.sampled_from([4, 2]))
    devices = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= max_devices]))
    hosts = draw(st.sampled_from([h for h in (1, 2) if devices % h == 0]))
    per_chip = nsc * draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    n_tables = draw(st.integers(1, 4))
    tables = []
    for i in range(n_tables):
        tables.append({"name": f"t{i}" + draw(st.sampled_from(["", "_a", "_long_table_name_to_make_stack_names_long"])),
                       "vocabulary_size": draw(st.one_of(st.integers(1, 40), st.integers(40, 3000))),
                       "dim": draw(st.sampled_from([4, 8, 12, 16, 64])),
                       "combiner": draw(st.sampled_from(["sum", "mean", "sqrtn"])),
                       "optimizer": draw(st.sampled_from([("sgd", 0.1), ("sgd", 0.1), ("sgd", 0.5),
                                                          ("adagrad", 0.1)]))})
    n_features = draw(st.integers(1, 5))
    weighted = draw(st.booleans())
    tiny = weighted and draw(st.booleans())  # weights near and below float32's smallest normal, 2**-126
    steps = draw(st.integers(1, 2))
    features, dense = [], []
    for j in range(n_features):
        t = tables[draw(st.integers(0, n_tables - 1))]
        mult = draw(st.sampled_from([1, 1, 2]))  # a feature with more samples (a sequence's positions)
        features.append({"name": f"f{j:02d}", "table": t["name"], "samples": per_chip * mult * devices,
                         "per_chip": per_chip * mult, "max_len": draw(st.sampled_from([1, 1, 3, 6])),
                         "skew": draw(st.booleans()), "weighted": weighted and draw(st.booleans())})
        if features[-1]["max_len"] == 1 and draw(st.booleans()):
            dense.append(f"f{j:02d}")
    by_name = {t["name"]: t for t in tables}
    data = []
    for _ in range(steps):
        hosts_data = []
        for _h in range(hosts):
            host = {}
            for f in features:
                n = f["samples"] // hosts
                vocab = by_name[f["table"]]["vocabulary_size"]
                per = np.ones(n, np.int64) if f["name"] in dense else rng.integers(0, f["max_len"] + 1, size=n)
                splits = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
                hot = min(vocab, 5)
                ids = rng.integers(0, hot if f["skew"] else vocab, size=int(splits[-1])).astype(np.int64)
                w = None
                if f["weighted"]:
                    w = rng.uniform(-2, 2, size=ids.size).astype(np.float32)
                    w[rng.random(ids.size) < 0.1] = 0.0
                    if tiny:
                        w = np.where(rng.random(ids.size) < 0.4, tiny_weights(rng, ids.size), w).astype(np.float32)
                host[f["name"]] = (splits, ids, w)
            hosts_data.append(host)
        data.append(hosts_data)
    return {"tables": tables, "features": features, "num_devices": devices, "num_sc_per_device": nsc,
            "num_hosts": hosts, "dense": dense, "steps": data,
            "has_leading_dimension": draw(st.booleans())}


def tiny_weights(rng, n: int) -> np.ndarray:
    """float32 weights of either sign where jax's flushing of denormals shows: subnormals; normals within 4x of
    2**-126 (quotients and sums of them fall below it); ~1e-20 (their squares underflow float32)."""
    kind = rng.integers(0, 3, n)
    mag = np.where(kind == 0, rng.uniform(0, 1, n) * 2.0 ** -126,
                   np.where(kind == 1, rng.uniform(1, 4, n) * 2.0 ** -126, rng.uniform(0.5, 2, n) * 1e-20))
    return (mag * rng.choice([-1.0, 1.0], n)).astype(np.float32)


def model_of(case) -> ModelConfig:
    tables = {t["name"]: TableConfig(t["name"], t["vocabulary_size"], t["dim"], t["combiner"],
                                     OptimizerConfig.from_dict({"optimizer": t["optimizer"][0],
                                                                "learning_rate": t["optimizer"][1]}))
              for t in case["tables"]}
    feats = tuple(FeatureConfig(f["name"], tables[f["table"]], (f["per_chip"],)) for f in case["features"])
    return ModelConfig(feats, Topology(case["num_devices"], case["num_sc_per_device"], case["num_hosts"]))
