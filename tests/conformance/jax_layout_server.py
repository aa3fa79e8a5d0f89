"""The JAX layout oracle: jax-tpu-embedding 0.2.0's own stacking and preprocessing; runs inside .venv-jax.

Started by tests/conformance/test_jax_layout_conformance.py through `jax_oracle.JaxOracle`. Of this repository it
imports only the pipe protocol (`pipelines.child_pipe`, standard library alone): it is the independent side.

What runs, per request: `TableSpec`s / `FeatureSpec`s built from plain data (input_shape and output_shape
[global samples, 1 | dim], as a jit-style global batch), `embedding.auto_stack_tables` (its defaults: short
stack names, 2 MiB activation limit, rotation = SparseCores per device) and
`prepare_feature_specs_for_training`; then, per step and per host,
`embedding.preprocess_sparse_dense_matmul_input(features, weights, specs, local_device_count,
global_device_count, num_sc_per_device=..., has_leading_dimension=...)` (minibatching off, no id dropping)
on the host's samples: per feature an int32 [n, 1] array when the case asks for dense input (every sample one
id), else an object array of per-sample int32 arrays; weights for every feature (ones where a feature has
none) when any feature is weighted, else None.

Limits are jax's own FDO loop done once: a first pass over every step and host with limits that cannot
overflow (max ids = the host's ids + 8, a COO buffer that holds them), its stats merged (max), installed
by `embedding.update_preprocessing_parameters`, and a second pass with them, whose arrays are returned.

Protocol (`pipelines.child_pipe`). Request:
  {"tables": [{"name", "vocabulary_size", "dim", "combiner", "optimizer": (kind, learning_rate)}],
   "features": [{"name", "table", "samples"}] (global samples; the order of the model's features),
   "num_devices", "num_sc_per_device", "num_hosts", "has_leading_dimension",
   "dense": [feature names given as [n, 1] arrays],
   "steps": [[{feature: (row_splits int64, ids int64, weights float32 | None)} per host] per step]}
-> {"features": {name: {"stack", "row_offset", "col_offset", "col_shift"}},
    "stacks": {stack: {"max_ids_per_partition", "max_unique_ids_per_partition", "coo_buffer_size_per_device",
                       "row_pointers_size_per_device"}},
    "steps": [[{stack: {"row_pointers", "embedding_ids", "sample_ids", "gains", "num_minibatches",
                        "max_ids_per_partition", "max_unique_ids_per_partition", "required_buffer_size",
                        "dropped_ids"}} per host] per step]}
"""

from __future__ import annotations

import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from pipelines import child_pipe  # noqa: E402


def _optimizer(es, spec):
    kind, lr = spec
    cls = {"sgd": es.SGDOptimizerSpec, "adagrad": es.AdagradOptimizerSpec, "adam": es.AdamOptimizerSpec,
           "ftrl": es.FTRLOptimizerSpec}[kind]
    return cls(learning_rate=lr)


def handle(req):
    import jax
    import numpy as np
    from jax_tpu_embedding.sparsecore.lib.nn import embedding
    from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es

    D, nsc, H = req["num_devices"], req["num_sc_per_device"], req["num_hosts"]
    L = D // H
    lead = bool(req.get("has_leading_dimension", False))
    tables = {}
    for t in req["tables"]:
        tables[t["name"]] = es.TableSpec(
            vocabulary_size=t["vocabulary_size"], embedding_dim=t["dim"], initializer=jax.nn.initializers.zeros,
            optimizer=_optimizer(es, t["optimizer"]), combiner=t["combiner"], name=t["name"])
    specs = {}
    for f in req["features"]:
        t = tables[f["table"]]
        specs[f["name"]] = es.FeatureSpec(name=f["name"], table_spec=t, input_shape=[f["samples"], 1],
                                          output_shape=[f["samples"], t.embedding_dim])
    embedding.auto_stack_tables(specs, global_device_count=D, num_sc_per_device=nsc)
    embedding.prepare_feature_specs_for_training(specs, global_device_count=D, num_sc_per_device=nsc)
    names = list(specs)
    dense = set(req.get("dense", ()))
    weighted = any(w is not None for step in req["steps"] for host in step for _, _, w in host.values())

    def inputs(host):
        feats, weights = {}, {}
        for n in names:
            splits, ids, w = host[n]
            ids = np.asarray(ids).astype(np.int32)
            w = np.ones(ids.size, np.float32) if w is None else np.asarray(w, np.float32)
            if n in dense:
                feats[n], weights[n] = ids.reshape(-1, 1), w.reshape(-1, 1)
            else:
                rows = np.empty(len(splits) - 1, dtype=object)
                rows[:] = [ids[a:b] for a, b in zip(splits[:-1], splits[1:])]
                wrows = np.empty(len(splits) - 1, dtype=object)
                wrows[:] = [w[a:b] for a, b in zip(splits[:-1], splits[1:])]
                feats[n], weights[n] = rows, wrows
        return feats, (weights if weighted else None)

    def set_limits(limits):
        for f in specs.values():
            st = f.table_spec.stacked_table_spec
            ids, uniq, buf = limits[st.stack_name]
            f.table_spec.stacked_table_spec = dataclasses.replace(
                st, max_ids_per_partition=ids, max_unique_ids_per_partition=uniq,
                suggested_coo_buffer_size_per_device=buf)

    def run(host):
        x, w = inputs(host)
        return embedding.preprocess_sparse_dense_matmul_input(
            x, w, specs, local_device_count=L, global_device_count=D, num_sc_per_device=nsc,
            has_leading_dimension=lead, allow_id_dropping=False)

    stacks = sorted({f.table_spec.stacked_table_spec.stack_name for f in specs.values()})
    S = D * nsc
    most = max(1, max(int(np.asarray(h[n][1]).size) for step in req["steps"] for h in step for n in names))
    big = most * len(names) + 8
    set_limits({s: (big, big, nsc * (-(-(most * len(names) + 8 * S) // 8) * 8)) for s in stacks})
    stats = None
    for step in req["steps"]:
        for host in step:
            _, s = run(host)
            if stats is None:
                stats = s
            else:
                for field in ("max_ids_per_partition", "max_unique_ids_per_partition", "required_buffer_size_per_sc"):
                    a, b = getattr(stats, field), getattr(s, field)
                    for k in b:
                        a[k] = np.maximum(a[k], b[k])
    # An empty stack's maxima are 0: jax's buffer must stay positive.
    for field in ("max_ids_per_partition", "max_unique_ids_per_partition", "required_buffer_size_per_sc"):
        d = getattr(stats, field)
        for k in d:
            d[k] = np.maximum(d[k], 1 if field != "required_buffer_size_per_sc" else 8)
    embedding.update_preprocessing_parameters(specs, stats, nsc)
    out_steps = []
    for step in req["steps"]:
        hosts = []
        for host in step:
            out, s = run(host)
            hosts.append({k: {"row_pointers": np.asarray(out.lhs_row_pointers[k]),
                              "embedding_ids": np.asarray(out.lhs_embedding_ids[k]),
                              "sample_ids": np.asarray(out.lhs_sample_ids[k]),
                              "gains": np.asarray(out.lhs_gains[k]),
                              "num_minibatches": np.asarray(out.num_minibatches),
                              "max_ids_per_partition": np.asarray(s.max_ids_per_partition[k]),
                              "max_unique_ids_per_partition": np.asarray(s.max_unique_ids_per_partition[k]),
                              "required_buffer_size": np.asarray(s.required_buffer_size_per_sc[k]),
                              "dropped_ids": int(s.id_drop_counters[k])}
                          for k in out.lhs_row_pointers})
        out_steps.append(hosts)
    buffers = embedding.compute_coo_buffer_size_per_device(specs, global_device_count=D, num_sc_per_device=nsc)
    stack_info = {}
    for f in specs.values():
        st = f.table_spec.stacked_table_spec
        stack_info[st.stack_name] = {
            "max_ids_per_partition": st.max_ids_per_partition,
            "max_unique_ids_per_partition": st.max_unique_ids_per_partition,
            "coo_buffer_size_per_device": int(buffers[st.stack_name]),
            "row_pointers_size_per_device": embedding.compute_row_pointers_size_per_device(
                global_device_count=D, num_sc_per_device=nsc)}
    return {"features": {n: {"stack": f.table_spec.stacked_table_spec.stack_name,
                             "row_offset": f.id_transformation.row_offset,
                             "col_offset": f.id_transformation.col_offset,
                             "col_shift": f.id_transformation.col_shift} for n, f in specs.items()},
            "stacks": stack_info, "steps": out_steps}


def main():
    stdout = child_pipe.message_stdout()
    child_pipe.serve(handle, stdout=stdout)


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
