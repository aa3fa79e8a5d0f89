"""jax-tpu-embedding `FeatureSpec`s for an artifact's model, stacked as its jax records are.

    specs = feature_specs("build/criteo", fdo_dir="build/criteo-fdo")   # {feature: FeatureSpec}

One `TableSpec` per table of the artifact's spec (vocabulary rows, width, combiner, optimizer) and one
`FeatureSpec` per SparseCore feature (its global samples per step: `[samples, 1]` in, `[samples, dim]` out),
in the spec's feature order; stacked by jax's own `auto_stack_tables` and
`prepare_feature_specs_for_training` (the stacking the records were written for, checked), with the exact
limits of `tpu-embed plan --artifact ARTIFACT --format jax-fdo --output FDO_DIR` when `fdo_dir` is given
(`tpu_embed.jax.limits.apply_limits`): every stack of that stacking, from the manifest's recorded maxima or
the profile (`profiles.jax_fdo.artifact_jax_fdo_stats`). jax and jax-tpu-embedding are imported by the
function.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional

from tpu_embed.core.model import OptimizerConfig


def jax_optimizer(opt: OptimizerConfig) -> Any:
    """The jax-tpu-embedding `OptimizerSpec` of a table's optimizer (sgd, adagrad, adam, ftrl: the parameters both
    have; clipping and weight decay have no counterpart there and are refused)."""
    from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es

    p = dict(opt.params)
    extra = [k for k in ("clip_gradient_max", "clip_gradient_min", "clip_weight_max", "clip_weight_min",
                         "weight_decay_factor") if p.get(k) is not None]
    if extra:
        raise ValueError(f"optimizer {opt.kind} with {extra}: jax-tpu-embedding's optimizer specs have no such "
                         "parameters; drop them from the spec's optimizer for JAX training")
    lr = opt.learning_rate_fn if opt.learning_rate_fn is not None else p["learning_rate"]
    if opt.kind == "sgd":
        return es.SGDOptimizerSpec(learning_rate=lr)
    if opt.kind == "adagrad":
        return es.AdagradOptimizerSpec(learning_rate=lr, initial_accumulator_value=p["initial_accumulator"])
    if opt.kind == "adam":
        return es.AdamOptimizerSpec(learning_rate=lr, beta_1=p["beta1"], beta_2=p["beta2"], epsilon=p["epsilon"])
    if opt.kind == "ftrl":
        return es.FTRLOptimizerSpec(
            learning_rate=lr, learning_rate_power=p["learning_rate_power"],
            l1_regularization_strength=p["l1_regularization_strength"],
            l2_regularization_strength=p["l2_regularization_strength"], beta=p["beta"],
            initial_accumulator_value=p["initial_accumulator_value"],
            multiply_linear_by_learning_rate=p["multiply_linear_by_learning_rate"])
    raise ValueError(f"optimizer {opt.kind!r} has no jax-tpu-embedding counterpart here (sgd, adagrad, adam, ftrl)")


def feature_specs(artifact_dir: str, *, fdo_dir: Optional[str] = None,
                  initializer: Optional[Callable[..., Any]] = None) -> Dict[str, Any]:
    """{feature name: jax-tpu-embedding FeatureSpec} of the artifact's SparseCore features, stacked as its jax
    records (a mismatch is a ValueError), with `fdo_dir`'s exact limits set when given.

    `initializer`: the tables' initializer (default `jax.nn.initializers.truncated_normal(stddev=1/sqrt(dim))`
    per table, as keras-rs' default)."""
    import jax
    from jax_tpu_embedding.sparsecore.lib.nn import embedding
    from jax_tpu_embedding.sparsecore.lib.nn import embedding_spec as es

    from tpu_embed.artifact.load import load_artifact
    from tpu_embed.jax import limits as jax_limits

    art = load_artifact(artifact_dir)
    fmt = art.manifest.shard_format
    if fmt.jax is None:
        raise ValueError(f"{artifact_dir}: its shards hold no jax-tpu-embedding arrays: add `shards: {{layout: jax}}` "
                         "(or `both`) to the spec and run `tpu-embed run` again.")
    fj = fmt.jax
    devices, nsc = int(fj["num_devices"]), int(fj["num_sc_per_device"])
    model = art.model
    tables = {}
    for t in model.tables:
        if t.optimizer is None:
            raise ValueError(f"table {t.name!r} has no optimizer in the spec: jax-tpu-embedding needs one per table")
        init = initializer or jax.nn.initializers.truncated_normal(stddev=1.0 / max(1, t.dim) ** 0.5)
        tables[t.name] = es.TableSpec(vocabulary_size=t.vocabulary_size, embedding_dim=t.dim, initializer=init,
                                      optimizer=jax_optimizer(t.optimizer), combiner=t.combiner, name=t.name)
    specs: Dict[str, Any] = {}
    for f in model.features:
        t = tables[f.table.name]
        n = f.samples * model.topology.num_chips
        specs[f.name] = es.FeatureSpec(name=f.name, table_spec=t, input_shape=[n, 1], output_shape=[n, t.embedding_dim])
    embedding.auto_stack_tables(specs, global_device_count=devices, num_sc_per_device=nsc)
    embedding.prepare_feature_specs_for_training(specs, global_device_count=devices, num_sc_per_device=nsc)
    _check_stacking(specs, fj, artifact_dir)
    if fdo_dir is not None:
        try:
            jax_limits.apply_limits(specs, fdo_dir, num_sc_per_device=nsc)
        except ValueError as e:
            fix = f"`tpu-embed plan --artifact {artifact_dir} --format jax-fdo --output {fdo_dir}`"
            raise ValueError(f"{fdo_dir} holds no limits for {artifact_dir}'s jax stacking ({e}): write them with "
                             f"{fix}") from None
    return specs


def _check_stacking(specs: Mapping[str, Any], fj: Mapping[str, Any], artifact_dir: str) -> None:
    """ValueError unless jax stacked `specs` as the artifact's jax records (`fj`): the same stacked tables, each with
    the same tables and the same features' id transformations."""
    want = {s["name"]: (tuple(t["name"] for t in s["tables"]),
                        tuple((x["name"], x["row_offset"], x["col_offset"], x["col_shift"]) for x in s["features"]))
            for s in fj["stacks"]}
    got: Dict[str, Any] = {}
    for f in specs.values():
        st = f.table_spec.stacked_table_spec.stack_name
        tabs, feats = got.setdefault(st, (set(), set()))
        tabs.add(f.table_spec.name)
        idt = f.id_transformation
        feats.add((f.name, idt.row_offset, idt.col_offset, idt.col_shift))
    for name in sorted(set(want) | set(got)):
        w = want.get(name)
        g = got.get(name)
        if w is None or g is None or set(w[0]) != g[0] or set(w[1]) != g[1]:
            raise ValueError(f"jax-tpu-embedding stacks these feature specs otherwise than {artifact_dir}'s jax "
                             f"records (stacked table {name!r}: records {w}, jax {g}); the records were written for "
                             "another jax-tpu-embedding stacking")
