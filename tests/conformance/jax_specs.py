"""jax-tpu-embedding `FeatureSpec`s from a plain description; imported by the JAX oracle's scripts, in its venv.

Of tpu_embed it imports nothing: the description (tables, features with their global samples) is plain data
sent over `pipelines.child_pipe`.
"""

import jax
import numpy as np
from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec

_OPTIMIZERS = {"sgd": embedding_spec.SGDOptimizerSpec, "adagrad": embedding_spec.AdagradOptimizerSpec}


def feature_specs(req):
    """A list of FeatureSpecs, in the description's feature order; the output width is the table's dim."""
    tables = {}
    for t in req["tables"]:
        kind, lr = t.get("optimizer", ("sgd", 0.1))
        tables[t["name"]] = embedding_spec.TableSpec(
            name=t["name"], vocabulary_size=int(t["vocabulary_size"]), embedding_dim=int(t["dim"]),
            initializer=jax.nn.initializers.zeros, optimizer=_OPTIMIZERS[kind](learning_rate=lr),
            combiner=t["combiner"])
    out = []
    for f in req["features"]:
        t = tables[f["table"]]
        n = int(f["global_samples"])
        out.append(embedding_spec.FeatureSpec(name=f["name"], table_spec=t, input_shape=[n, 1],
                                              output_shape=[n, t.embedding_dim]))
    return out


def stacking_of(specs):
    """Per feature: where jax's stacking put it."""
    out = {}
    for f in specs:
        s, idt = f.table_spec.setting_in_stack, f.id_transformation
        out[f.name] = {"stack": f.table_spec.stacked_table_spec.stack_name, "table": f.table_spec.name,
                       "row_offset_in_shard": int(s.row_offset_in_shard), "shard_rotation": int(s.shard_rotation),
                       "padded_vocab_size": int(s.padded_vocab_size), "col_offset": int(idt.col_offset),
                       "col_shift": int(idt.col_shift), "row_offset": int(idt.row_offset)}
    return out


def limits_of(specs):
    """Per stacked table: the three FDO parameters of its StackedTableSpec."""
    out = {}
    for f in specs:
        s = f.table_spec.stacked_table_spec
        out[s.stack_name] = {"max_ids_per_partition": int(s.max_ids_per_partition),
                             "max_unique_ids_per_partition": int(s.max_unique_ids_per_partition),
                             "suggested_coo_buffer_size_per_device": s.suggested_coo_buffer_size_per_device}
    return out


def ragged(row_splits, values, dtype):
    """A 1-D object array of per-row arrays: jax-tpu-embedding's ragged input."""
    n = len(row_splits) - 1
    out = np.empty(n, dtype=object)
    for i in range(n):
        out[i] = np.asarray(values[row_splits[i]:row_splits[i + 1]], dtype)
    return out
