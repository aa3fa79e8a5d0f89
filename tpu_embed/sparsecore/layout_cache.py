"""`stack_tables` remembered for the feature configurations `preprocess` is called with, batch after batch.

`preprocess(features, feature_config, topology)` takes the configuration with
every batch, as TF's enqueue does; converting and stacking 30 TF
FeatureConfigs costs more than packing their batch.  `layout_for` returns the
layout stacking would compute, without stacking again while nothing stacking
reads has changed:

* the key (`config_key`) holds, by value, every attribute that
  `from_tf_feature_config` and `stack_tables` read: per feature its path,
  output shape, sequence length and table; per table (numbered in order of
  first use: tables are shared by identity) its name, vocabulary, dim,
  combiner, optimizer group and quantization.  A configuration changed in
  place has another key and is stacked again; one with an attribute that
  cannot be keyed (unhashable) is stacked every call.
* the configuration of the last call is also remembered by identity, with
  the attributes read for its key: when the same dict of features comes back
  with the same feature, table and optimizer attributes (compared in a few C
  loops), its key is not rebuilt.  Only flat dicts whose attributes are
  immutable values are remembered that way.
"""

from __future__ import annotations

import operator
import types
from typing import Any, Dict, List, Mapping, Optional

from tpu_embed.core.model import ModelConfig, OptimizerConfig, TableConfig, optimizer_group_of
from tpu_embed.core.nest import flatten_with_paths
from tpu_embed.core.topology import Topology
from tpu_embed.sparsecore.layout import SparseCoreLayout, layout_of, stack_tables

_LAYOUTS: Dict[Any, SparseCoreLayout] = {}
_LAYOUTS_KEPT = 64


def layout_for(feature_config: Any, topology: Optional[Topology]) -> SparseCoreLayout:
    """`stack_tables(feature_config, topology)`, remembered (see the module docstring)."""
    if isinstance(feature_config, ModelConfig) and (topology is None or topology == feature_config.topology):
        return layout_of(feature_config)
    last = _Last.remembered
    if last is not None and last.unchanged(feature_config, topology):
        return last.layout
    try:
        key = config_key(feature_config, topology)
        hash(key)
    except TypeError:  # an unhashable attribute
        key = None
    if key is None:
        return stack_tables(feature_config, topology)
    layout = _LAYOUTS.get(key)
    if layout is None:
        layout = stack_tables(feature_config, topology)
        if len(_LAYOUTS) >= _LAYOUTS_KEPT:
            del _LAYOUTS[next(iter(_LAYOUTS))]
        _LAYOUTS[key] = layout
    if isinstance(topology, Topology):
        _Last.remember(feature_config, topology, layout)
    return layout


def config_key(feature_config: Any, topology: Optional[Topology]) -> Optional[tuple]:
    """What stacking reads of `feature_config`, as a hashable value; None where `stack_tables` would raise
    (it is left to say why)."""
    if not isinstance(topology, Topology):
        return None
    tables: Dict[int, tuple] = {}
    optimizers: Dict[int, Any] = {}  # tables usually share one optimizer object
    features = []
    for path, feature in _flat_features(feature_config):
        table = getattr(feature, "table", None)
        if table is None:
            return None
        t = tables.get(id(table))
        if t is None:
            t = tables[id(table)] = _table_key(table, len(tables), optimizers)
        shape = getattr(feature, "output_shape", None)
        features.append((path, t, None if shape is None else tuple(shape),
                         getattr(feature, "max_sequence_length", 0)))
    return (topology, tuple(features))


def _flat_features(feature_config: Any):
    """`flatten_with_paths`, with a shortcut for the common flat dict of FeatureConfigs."""
    if type(feature_config) is dict and not any(isinstance(v, (Mapping, list, tuple))
                                                for v in feature_config.values()):
        return [(str(k), feature_config[k]) for k in sorted(feature_config)]
    return flatten_with_paths(feature_config)


def _table_key(table: Any, number: int, optimizers: Dict[int, Any]) -> tuple:
    if isinstance(table, TableConfig):  # frozen: itself
        return (number, table)
    optimizer = getattr(table, "optimizer", None)
    opt = optimizers.get(id(optimizer))
    if opt is None:
        opt = optimizers[id(optimizer)] = optimizer_key(optimizer)
    quantization = getattr(table, "quantization_config", None)
    return (number, table.name, table.vocabulary_size, table.dim, getattr(table, "combiner", "mean"), opt,
            None if quantization is None else repr(quantization))


_PLAIN = (type(None), bool, int, str)


def optimizer_key(optimizer: Any) -> Any:
    """Equal keys only for optimizers `optimizer_group_of` puts in one group.

    TF's optimizers (plain attributes) are keyed by class and attributes: floats by repr (-0.0, nan),
    callables by identity (the key holds them, so an id is not reused while it is remembered).  Other
    objects by their group itself."""
    if isinstance(optimizer, OptimizerConfig):
        return optimizer
    attrs = _keyed_attrs(optimizer)
    if attrs is not None:
        try:
            return (type(optimizer), tuple((k, _value_key(v)) for k, v in attrs.items()))
        except TypeError:
            pass
    return ("group", optimizer_group_of(optimizer))


def _keyed_attrs(optimizer: Any) -> Optional[dict]:
    """The attributes an optimizer is keyed by (TF's plain optimizers), None for those keyed by group."""
    attrs = getattr(optimizer, "__dict__", None)
    if attrs is None or callable(optimizer) or hasattr(optimizer, "to_dict") or hasattr(optimizer, "_PARAMS"):
        return None
    return attrs


def _value_key(v: Any) -> Any:
    if type(v) in _PLAIN:
        return (type(v), v)
    if type(v) is float:
        return (float, repr(v))
    if isinstance(v, (list, tuple)):
        return (type(v), tuple(_value_key(x) for x in v))
    if callable(v) and not hasattr(v, "_PARAMS"):  # optimizer_group_of tags callables by identity
        return ("callable", id(v), v)
    raise TypeError("not a plain value")


_FEATURE_ATTRS = operator.attrgetter("table", "output_shape", "max_sequence_length")
_TABLE_ATTRS = operator.attrgetter("name", "vocabulary_size", "dim", "combiner", "optimizer", "quantization_config")


def _immutable_shape(shape: Any) -> bool:
    if type(shape) is tuple:
        return all(type(d) is int for d in shape)
    return type(shape).__name__ == "TensorShape"  # TF's, immutable


class _Last:
    """The last flat dict of features given, with the attributes its key was built from."""

    remembered: Optional["_Last"] = None

    def __init__(self, config: dict, topology: Topology, layout: SparseCoreLayout, features: List[Any],
                 feature_attrs: List[tuple], tables: List[Any], table_attrs: List[tuple], optimizers: List[Any]):
        self.config, self.snapshot, self.topology, self.layout = config, dict(config), topology, layout
        self.features, self.feature_attrs = features, feature_attrs
        self.tables, self.table_attrs = tables, table_attrs
        self.optimizers, self.optimizer_keys = optimizers, [optimizer_key(o) for o in optimizers]
        self.optimizer_attrs = [_plain_attrs(o) for o in optimizers]

    @classmethod
    def remember(cls, config: Any, topology: Topology, layout: SparseCoreLayout) -> None:
        cls.remembered = None
        if type(config) is not dict:
            return
        features = list(config.values())
        try:
            feature_attrs = list(map(_FEATURE_ATTRS, features))
            tables = list({id(a[0]): a[0] for a in feature_attrs}.values())
            table_attrs = list(map(_TABLE_ATTRS, tables))
        except AttributeError:
            return
        if isinstance(tables[0], TableConfig) or not all(
                _immutable_shape(s) and type(m) is int for _, s, m in feature_attrs) or not all(
                type(n) is str and type(v) is int and type(d) is int and type(c) is str and q is None
                for n, v, d, c, _, q in table_attrs):
            return
        optimizers = list({id(a[4]): a[4] for a in table_attrs}.values())
        cls.remembered = cls(config, topology, layout, features, feature_attrs, tables, table_attrs, optimizers)

    def unchanged(self, config: Any, topology: Optional[Topology]) -> bool:
        return (config is self.config and topology == self.topology and config == self.snapshot
                and list(map(_FEATURE_ATTRS, self.features)) == self.feature_attrs
                and list(map(_TABLE_ATTRS, self.tables)) == self.table_attrs
                and all(map(_optimizer_unchanged, self.optimizers, self.optimizer_attrs, self.optimizer_keys)))


_IMMUTABLE = (type(None), bool, int, float, str, types.FunctionType, types.BuiltinFunctionType)


def _plain_attrs(optimizer: Any) -> Optional[tuple]:
    """(names, values) of an optimizer's attributes when every value is immutable, else None."""
    attrs = _keyed_attrs(optimizer)
    if type(attrs) is not dict or not all(type(v) in _IMMUTABLE for v in attrs.values()):
        return None
    return tuple(attrs), tuple(attrs.values())


def _optimizer_unchanged(optimizer: Any, attrs: Optional[tuple], key: Any) -> bool:
    """The optimizer still has `key`: its attributes are the very objects they were (a few C loops), or else
    its key is rebuilt and compared."""
    if attrs is not None:
        now = optimizer.__dict__
        if tuple(now) == attrs[0] and all(map(operator.is_, now.values(), attrs[1])):
            return True
    return optimizer_key(optimizer) == key
