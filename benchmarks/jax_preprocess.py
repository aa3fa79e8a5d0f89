"""jax-tpu-embedding's C++ input preprocessing on benchmarks/csr.py's batches; runs inside .venv-jax.

Started by benchmarks/csr.py as a subprocess (`.venv-jax/bin/python
benchmarks/jax_preprocess.py`, made by `make jax-oracle`).  Of this repository it
imports only the pipe protocol (`pipelines.child_pipe`, standard library
alone): it is the independent side of the comparison.

What runs: `embedding.preprocess_sparse_dense_matmul_input` (pybind over the
C++ `PreprocessSparseDenseMatmulInput`, the jax-tpu-embedding of .venv-jax) for one
host with `local_device_count = global_device_count = num_chips` and
`num_sc_per_device` SparseCores: one call packs the global batch of every
local chip, i.e. the per-chip batches of benchmarks/csr.py's steps taken
`num_chips` at a time (chip c of a global batch is per-chip batch c of its
group, so the same ids are packed).  Tables: `TableSpec`s with the same
vocabularies, dim and combiner, SGD, stacked by `embedding.auto_stack_tables`.
Limits: a first pass over every batch with limits of 2**20 (nothing dropped)
gives the stats, which `embedding.update_preprocessing_parameters` installs
(max ids, max unique ids and the COO buffer per device, as the library
advises), so the timed calls allocate what they need and drop nothing.

Two input forms, each timed:
  "numpy"   the form `preprocess_sparse_dense_matmul_input` documents: per
            feature an int32 [batch, 1] array (univalent) or an object array
            of per-sample int32 arrays (multivalent); weights None (all 1).
  "sparse"  `preprocess_sparse_dense_matmul_input_from_sparse_tensor`: per
            feature int64 indices [n, 2], int32 values, dense shape.
Conversions to these forms are done once, outside the timing.

Protocol: `pipelines.child_pipe`.  Requests:
  {"op": "setup", "tables": [{"name", "vocabulary_size", "dim", "combiner"}],
   "features": [{"name", "table"}] (features use tables by name), "num_chips",
   "num_sc_per_chip", "global_batches": [{feature: (values int64, row_splits int64)}]}
   -> {"stacks", "ids_per_batch", "packed_ids": per global batch, the ids jax packed (dedup'd,
       padding excluded), "limits": the installed stacked-table limits, "versions": jax-tpu-embedding's, jax's
       and Python's, "threads": the process's threads
       after packing (its C++ pool's among them)}
  {"op": "bench", "repeats": n} -> {form: best seconds per global batch}
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # pipelines.child_pipe, not installed
from pipelines import child_pipe  # noqa: E402

_BIG = 1 << 20


class JaxBench:
    def __init__(self, req):
        import jax
        import numpy as np
        from jax_tpu_embedding.sparsecore.lib.nn import embedding, embedding_spec
        self.np, self.embedding = np, embedding
        self.chips, self.nsc = req["num_chips"], req["num_sc_per_chip"]
        tables = {t["name"]: t for t in req["tables"]}
        batches = req["global_batches"]
        gb = batches[0][req["features"][0]["name"]][1].size - 1
        sgd = embedding_spec.SGDOptimizerSpec(learning_rate=0.1)
        specs = {}
        for f in req["features"]:
            t = tables[f["table"]]
            table = embedding_spec.TableSpec(
                vocabulary_size=t["vocabulary_size"], embedding_dim=t["dim"],
                initializer=jax.nn.initializers.zeros, optimizer=sgd, combiner=t["combiner"], name=t["name"],
                max_ids_per_partition=_BIG, max_unique_ids_per_partition=_BIG)
            specs[f["name"]] = embedding_spec.FeatureSpec(
                name=f["name"], table_spec=table, input_shape=[gb, 1], output_shape=[gb, t["dim"]])
        embedding.auto_stack_tables(specs, global_device_count=self.chips, num_sc_per_device=self.nsc,
                                    stack_to_max_ids_per_partition=lambda name, batch: _BIG,
                                    stack_to_max_unique_ids_per_partition=lambda name, batch: _BIG)
        embedding.prepare_feature_specs_for_training(specs, global_device_count=self.chips,
                                                     num_sc_per_device=self.nsc)
        self.specs = specs
        names = list(specs)
        self.numpy_inputs, self.sparse_inputs = [], []
        for b in batches:
            dense, ind, val, shp = {}, {}, {}, {}
            for n in names:
                values, splits = b[n]
                values = values.astype(np.int32)
                lengths = np.diff(splits)
                if (lengths == 1).all():
                    dense[n] = values.reshape(-1, 1)
                else:
                    rows = np.empty(lengths.size, dtype=object)
                    rows[:] = np.split(values, splits[1:-1])
                    dense[n] = rows
                row = np.repeat(np.arange(lengths.size), lengths)
                col = np.arange(values.size) - np.repeat(splits[:-1], lengths)
                ind[n] = np.stack([row, col], axis=1).astype(np.int64)
                val[n] = values
                shp[n] = np.array([lengths.size, max(1, int(lengths.max()))], np.int64)
            self.numpy_inputs.append(dense)
            self.sparse_inputs.append((ind, val, shp))
        self.ids_per_batch = [int(sum(b[n][0].size for n in names)) for b in batches]

        # Stats over every batch, then the library's own update: limits and buffers that fit them.
        stats = None
        for x in self.numpy_inputs:
            _, s = self.run_numpy(x)
            stats = s if stats is None else _max_stats(stats, s, np)
            dropped = sum(int(v) for v in s.id_drop_counters.values())
            if dropped:
                raise RuntimeError(f"jax dropped {dropped} ids under limits of {_BIG}")
        embedding.update_preprocessing_parameters(self.specs, stats, self.nsc)
        self.packed = []
        for x in self.numpy_inputs:
            out, s = self.run_numpy(x)
            if sum(int(v) for v in s.id_drop_counters.values()):
                raise RuntimeError("jax dropped ids under the limits of its own stats")
            self.packed.append(_packed_ids(out, np))
        st = next(iter(self.specs.values())).table_spec.stacked_table_spec
        self.limits = {"max_ids_per_partition": st.max_ids_per_partition,
                       "max_unique_ids_per_partition": st.max_unique_ids_per_partition,
                       "coo_buffer_per_device": st.suggested_coo_buffer_size_per_device}
        self.stacks = sorted({f.table_spec.stacked_table_spec.stack_name for f in self.specs.values()})

    def run_numpy(self, x):
        return self.embedding.preprocess_sparse_dense_matmul_input(
            x, None, self.specs, local_device_count=self.chips, global_device_count=self.chips,
            num_sc_per_device=self.nsc, allow_id_dropping=False)

    def run_sparse(self, x):
        ind, val, shp = x
        return self.embedding.preprocess_sparse_dense_matmul_input_from_sparse_tensor(
            ind, val, shp, self.specs, local_device_count=self.chips, global_device_count=self.chips,
            num_sc_per_device=self.nsc, allow_id_dropping=False)

    def bench(self, repeats):
        out = {}
        for form, fn, inputs in (("numpy", self.run_numpy, self.numpy_inputs),
                                 ("sparse", self.run_sparse, self.sparse_inputs)):
            fn(inputs[0])
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                for x in inputs:
                    fn(x)
                best = min(best, (time.perf_counter() - t0) / len(inputs))
            out[form] = best
        return out


def _max_stats(a, b, np):
    for field in ("max_ids_per_partition", "max_unique_ids_per_partition", "required_buffer_size_per_sc"):
        x, y = getattr(a, field), getattr(b, field)
        for k in y:
            x[k] = np.maximum(x[k], y[k]) if k in x else y[k]
    return a


def _packed_ids(out, np):
    """Ids the CSR holds (every stack), padding excluded."""
    total = 0
    ids = out.sparse_dense_matmul_input if hasattr(out, "sparse_dense_matmul_input") else out[0]
    for emb in ids.lhs_embedding_ids.values():
        total += int(np.count_nonzero(np.asarray(emb) != np.iinfo(np.int32).max))
    return total


def main():
    stdout = child_pipe.message_stdout()
    state = {}

    def handle(req):
        if req["op"] == "setup":
            b = state["bench"] = JaxBench(req)
            import importlib.metadata
            import platform

            import jax

            return {"stacks": b.stacks, "ids_per_batch": b.ids_per_batch, "packed_ids": b.packed,
                    "limits": b.limits, "threads": len(os.listdir("/proc/self/task")),
                    "versions": f"jax-tpu-embedding {importlib.metadata.version('jax-tpu-embedding')}, jax "
                                f"{jax.__version__}, Python {platform.python_version()}"}
        if req["op"] == "bench":
            return state["bench"].bench(int(req["repeats"]))
        raise ValueError(f"unknown op {req['op']!r}")

    child_pipe.serve(handle, stdout=stdout)


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
