"""What a `HostEmbedding` is built from, checked once: its model, tables, optimizers and options (`HostConfig`).

`host_config` turns `HostEmbedding`'s arguments (a `ModelConfig` or TF's feature-config nest, tensor-core
features, optimizers in any of the accepted forms) into one plain object that the embedding and its compiled
steps (`tpu_embed.training.host_compiled`) read; `table_seed` seeds a table's default initializer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from tpu_embed.core.model import FeatureConfig, ModelConfig, OptimizerConfig, TableConfig, from_tf_feature_config
from tpu_embed.core.nest import flatten_with_paths
from tpu_embed.core.topology import Topology
from tpu_embed.training import host_optimizers
from tpu_embed.training.host_index import HostIndex


@dataclasses.dataclass
class HostConfig:
    """A `HostEmbedding`'s plain Python state (tf.Module would wrap its dicts as dependencies)."""

    model: ModelConfig
    index: HostIndex
    tables: Dict[str, TableConfig]
    tc_features: Dict[str, FeatureConfig]
    optimizers: Dict[str, Optional[OptimizerConfig]]
    seed: int
    initializers: Dict[str, Callable]
    pipelining: bool
    multiplier_fn: Optional[Callable]
    global_step: Any
    semantics: str
    structure: Any  # TF's feature-config nest the activations come back in; None for a ModelConfig (a flat dict)

    def feature_order(self, flat: Mapping[str, Any]) -> List[str]:
        """Feature names as `lookup` returns them: the model's SparseCore features, then tensor-core ones."""
        sc = [f.name for f in self.model.features]
        return sc + [n for n in flat if n not in set(sc)]

    def pack(self, flat: Dict[str, Any]) -> Any:
        """{feature: tensor} nested like the feature config (as it is for a ModelConfig)."""
        if self.structure is None:
            return flat
        return tf.nest.pack_sequence_as(self.structure, [flat[f.name] for f in self.model.features])


def host_config(feature_config: Any, *, topology: Optional[Topology], optimizer: Any,
                tensor_core_features: Sequence[FeatureConfig], pipeline_execution_with_tensor_core: bool, seed: int,
                initializers: Optional[Mapping[str, Callable]],
                experimental_gradient_multiplier_fn: Optional[Callable[[Any], Mapping[str, Any]]],
                global_step: Any, optimizer_semantics: str) -> HostConfig:
    """`HostEmbedding`'s arguments checked and resolved (its docstring says what each is and what is refused)."""
    model = from_tf_feature_config(feature_config, topology)
    inits = {} if isinstance(feature_config, ModelConfig) else _tf_initializers(feature_config)
    inits.update(initializers or {})
    tc = tuple(tensor_core_features)
    if tc and not isinstance(feature_config, ModelConfig):
        raise ValueError("Tensor-core features need a tpu_embed.core.model.ModelConfig (activations are then one "
                         "flat {feature: tensor} dict); a TF feature-config nest has no place for them.")
    sc_names = {f.name for f in model.features}
    clash = sorted({f.name for f in tc} & sc_names)
    if clash:
        raise ValueError(f"Tensor-core features {clash} are also SparseCore features.")
    tables: Dict[str, TableConfig] = {t.name: t for t in model.tables}
    for f in tc:
        if tables.setdefault(f.table.name, f.table) != f.table:
            raise ValueError(f"Table {f.table.name!r} is configured twice, differently.")
    default_opt = _to_optimizer_config(optimizer)
    optimizers = {n: t.optimizer if t.optimizer is not None else default_opt for n, t in tables.items()}
    for n, opt in optimizers.items():
        if opt is not None:
            host_optimizers.check_supported(n, opt.kind, dict(opt.params), optimizer_semantics)
    if optimizer_semantics not in host_optimizers.SEMANTICS:
        raise ValueError(f"optimizer_semantics must be one of {host_optimizers.SEMANTICS}, "
                         f"got {optimizer_semantics!r}.")
    return HostConfig(
        model=model, index=HostIndex(model, {f.name: f for f in tc}, tables), tables=tables,
        tc_features={f.name: f for f in tc}, optimizers=optimizers, seed=int(seed), initializers=dict(inits),
        pipelining=bool(pipeline_execution_with_tensor_core), multiplier_fn=experimental_gradient_multiplier_fn,
        global_step=global_step, semantics=optimizer_semantics,
        structure=None if isinstance(feature_config, ModelConfig) else feature_config)


def table_seed(seed: int, table: str) -> Tuple[int, int]:
    """The stateless seed of `table`'s default initializer: from the embedding's `seed` and the table's name."""
    h = hashlib.sha256(f"{int(seed)}/{table}".encode()).digest()
    return int.from_bytes(h[:4], "little") >> 1, int.from_bytes(h[4:8], "little") >> 1


def _to_optimizer_config(opt: Any) -> Optional[OptimizerConfig]:
    if opt is None or isinstance(opt, OptimizerConfig):
        return opt
    if isinstance(opt, Mapping):
        return OptimizerConfig.from_dict(opt)
    if type(opt).__module__.startswith("tensorflow"):
        return OptimizerConfig.from_tf(opt)
    if hasattr(opt, "to_dict"):  # the seed API's parameter classes
        return OptimizerConfig.from_dict(opt.to_dict())
    raise TypeError(f"optimizer must be an OptimizerConfig, a seed-API parameter object, a "
                    f"tf.tpu.experimental.embedding optimizer or a dict, got {type(opt).__name__}.")


def _tf_initializers(feature_config: Any) -> Dict[str, Callable]:
    """Initializers of TF TableConfigs that are not TF's default (the default gets our seeded twin)."""
    out: Dict[str, Callable] = {}
    for _, f in flatten_with_paths(feature_config):
        table = getattr(f, "table", None)
        init = getattr(table, "initializer", None)
        if table is None or init is None:
            continue
        default = (type(init).__name__ == "TruncatedNormal" and getattr(init, "mean", None) == 0.0
                   and math.isclose(getattr(init, "stddev", 0.0), 1 / math.sqrt(table.dim))
                   and getattr(init, "seed", None) is None)
        if not default:
            out[table.name] = init
    return out
