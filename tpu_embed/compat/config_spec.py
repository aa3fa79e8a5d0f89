"""`EmbeddingConfigSpec`: the estimator-era embedding spec, converted for TPUEmbeddingV2.

`EmbeddingConfigSpec` is `tf.compat.v1.estimator.tpu.experimental.
EmbeddingConfigSpec` (source: tensorflow_estimator/python/estimator/tpu/
_tpu_estimator_embedding.py; tf.estimator is gone from TF 2.21): the same
namedtuple fields, constructor signature, defaults and error messages. As in
TF, `feature_columns` keeps the columns looked up by the embedding core
(SparseCore here) and `tensor_core_feature_columns` those with
`embedding_lookup_device='tpu_tensor_core'`.

`EstimatorTableConfig` / `EstimatorFeatureConfig` are the old v1
`tpu_embedding.TableConfig` / `FeatureConfig` namedtuples (with their checks)
for the `feature_to_config_dict` / `table_to_config_dict` form of the spec;
named apart from the model's `tpu_embed.core.model.TableConfig` /
`FeatureConfig`.  Their type errors keep TF's wording (`TableConfig`).

What the spec adds for this project: conversion to
`tf.tpu.experimental.embedding.FeatureConfig`s (`to_feature_config`), the
tensor-core side (`tensor_core_features`, `to_tensor_core_config`), a
`SparseCoreEmbeddingConfig` (`to_sparse_core_config`) and a content
fingerprint for manifests (`fingerprint`).
"""

from __future__ import annotations

import collections
import dataclasses
import numbers
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3

from tpu_embed.compat import feature_column as _fc
from tpu_embed.core import canonical
from tpu_embed.core import optimizers as _opt

__all__ = ["EmbeddingConfigSpec", "EstimatorFeatureConfig", "EstimatorTableConfig"]

_TPU_EMBEDDING_COLUMN_CLASSES = (_fc.TPUEmbeddingColumn, _fc.TPUSharedEmbeddingColumn)

# Bumped whenever the fingerprinted description changes shape.
_FINGERPRINT_VERSION = 1


class EstimatorTableConfig(
        collections.namedtuple('EstimatorTableConfig', [
            'vocabulary_size', 'dimension', 'initializer', 'combiner',
            'hot_id_replication', 'learning_rate', 'learning_rate_fn',
            'optimization_parameters'])):
    """Embedding table configuration: the v1 `tpu_embedding.TableConfig`.

    Same fields, defaults and checks as TF's. `hot_id_replication` has no
    SparseCore equivalent: it is kept but ignored by the conversion.
    """

    def __new__(cls,
                vocabulary_size,
                dimension,
                initializer=None,
                combiner='mean',
                hot_id_replication=False,
                learning_rate=None,
                learning_rate_fn=None,
                optimization_parameters=None):
        if not isinstance(vocabulary_size, int) or vocabulary_size < 1:
            raise ValueError('Invalid vocabulary_size {}.'.format(vocabulary_size))
        if not isinstance(dimension, int) or dimension < 1:
            raise ValueError('Invalid dimension {}.'.format(dimension))
        if (initializer is not None) and (not callable(initializer)):
            raise ValueError('initializer must be callable if specified.')
        if initializer is None:
            initializer = _fc._default_initializer(dimension)  # pylint: disable=protected-access
        if combiner not in ('mean', 'sum', 'sqrtn', None):
            raise ValueError('Invalid combiner {}'.format(combiner))
        if learning_rate is not None and learning_rate_fn is not None:
            raise ValueError('At most one of learning_rate and learning_rate_fn '
                             'can be None; got {} and {}'.format(
                                 learning_rate, learning_rate_fn))
        if optimization_parameters is not None:
            if not isinstance(optimization_parameters, _opt._OptimizationParameters):  # pylint: disable=protected-access
                raise ValueError('`optimization_parameters` must inherit from '
                                 '`_OptimizationParameters`. '
                                 '`type(optimization_parameters)`={}'.format(
                                     type(optimization_parameters)))
        return super().__new__(cls, vocabulary_size, dimension, initializer, combiner,
                               hot_id_replication, learning_rate, learning_rate_fn,
                               optimization_parameters)


class EstimatorFeatureConfig(
        collections.namedtuple('EstimatorFeatureConfig',
                               ['table_id', 'max_sequence_length', 'weight_key'])):
    """Feature configuration: the v1 `tpu_embedding.FeatureConfig` (same checks)."""

    def __new__(cls, table_id, max_sequence_length=0, weight_key=None):
        if not isinstance(max_sequence_length, int) or max_sequence_length < 0:
            raise ValueError(
                'Invalid max_sequence_length {}.'.format(max_sequence_length))
        return super().__new__(cls, table_id, max_sequence_length, weight_key)


@dataclasses.dataclass(frozen=True)
class _Table:
    """One SparseCore table, whichever form of the spec it came from."""
    name: str
    vocabulary_size: int
    dim: int
    initializer: Any
    combiner: str
    optimization_parameters: Any  # one of the four classes, or None
    learning_rate: Any  # static per-table override, or None
    learning_rate_fn: Any  # fn(global_step), or None


@dataclasses.dataclass(frozen=True)
class _Feature:
    name: str
    table: str
    max_sequence_length: int
    weight_key: Optional[str]


def _positive_int(value, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f'{what} must be a positive integer, got {value!r}.')
    return int(value)


def _check_limits(limits, what):
    if limits is None:
        return None
    if not isinstance(limits, dict):
        raise TypeError(f'{what} must be a dict {{stacked table name: limit}}, got '
                        f'{type(limits).__name__}.')
    return {str(k): _positive_int(v, f'{what}[{k!r}]') for k, v in limits.items()}


class EmbeddingConfigSpec(
        collections.namedtuple('EmbeddingConfigSpec', [
            'feature_columns', 'tensor_core_feature_columns',
            'optimization_parameters', 'clipping_limit',
            'pipeline_execution_with_tensor_core',
            'experimental_gradient_multiplier_fn', 'feature_to_config_dict',
            'table_to_config_dict', 'partition_strategy', 'profile_data_directory'
        ])):
    """Specification of the TPU embeddings of a model (TF's class).

    Give either `feature_columns` (from `tpu_embed.embedding_column` /
    `shared_embedding_columns`) with `optimization_parameters` (one of the
    four parameter classes), or the pair `feature_to_config_dict` /
    `table_to_config_dict` (of this module's `EstimatorFeatureConfig` / `EstimatorTableConfig`).

    `clipping_limit`, `pipeline_execution_with_tensor_core` and
    `experimental_gradient_multiplier_fn` are carried as in TF; SparseCore
    has no equivalent, so the conversions below do not use them.
    `profile_data_directory` is where this project's profile job writes
    lookup statistics.
    """

    def __new__(cls,
                feature_columns=None,
                optimization_parameters=None,
                clipping_limit=None,
                pipeline_execution_with_tensor_core=False,
                experimental_gradient_multiplier_fn=None,
                feature_to_config_dict=None,
                table_to_config_dict=None,
                partition_strategy='div',
                profile_data_directory=None):
        # TF's condition, plus: columns together with a lone dict is also
        # ambiguous (TF silently ignores the dict there).
        if (not feature_columns and
                not (feature_to_config_dict and table_to_config_dict) or
                (feature_columns and
                 (feature_to_config_dict or table_to_config_dict))):
            raise ValueError('Exactly one of `feature_columns` and the pair '
                             '`feature_to_config_dict` and `table_to_config_dict` '
                             'must be be specified.')

        if partition_strategy not in ('div', 'mod'):
            raise ValueError('Invalid partition_strategy {}. Must be one of "mod" or '
                             '"div".'.format(partition_strategy))

        tensor_core_feature_columns = None
        embedding_core_feature_columns = None
        if feature_columns:
            embedding_core_feature_columns, tensor_core_feature_columns = _columns_by_device(
                feature_columns, optimization_parameters)
        else:
            _check_config_dicts(feature_to_config_dict, table_to_config_dict, optimization_parameters)

        return super().__new__(
            cls,
            feature_columns=embedding_core_feature_columns,
            tensor_core_feature_columns=tensor_core_feature_columns,
            optimization_parameters=optimization_parameters,
            clipping_limit=clipping_limit,
            pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core,
            experimental_gradient_multiplier_fn=experimental_gradient_multiplier_fn,
            feature_to_config_dict=feature_to_config_dict,
            table_to_config_dict=table_to_config_dict,
            partition_strategy=partition_strategy,
            profile_data_directory=profile_data_directory)

    # -- one description of the SparseCore tables and features ----------------

    def _sparse_core_tables(self) -> Tuple[Dict[str, _Table], Dict[str, _Feature]]:
        tables: Dict[str, _Table] = {}
        features: Dict[str, _Feature] = {}
        if self.feature_columns is not None or self.tensor_core_feature_columns is not None:
            for column in self.feature_columns or []:
                tables.setdefault(column.table_name, _Table(
                    name=column.table_name,
                    vocabulary_size=column.vocabulary_size,
                    dim=int(column.dimension),
                    initializer=column.initializer,
                    combiner=column.combiner,
                    optimization_parameters=self.optimization_parameters,
                    learning_rate=None,
                    learning_rate_fn=column.learning_rate_fn))
                features[column.feature_name] = _Feature(
                    name=column.feature_name, table=column.table_name,
                    max_sequence_length=int(column.max_sequence_length),
                    weight_key=column.weight_feature_key)
            return tables, features
        for name, t in self.table_to_config_dict.items():
            tables[name] = _Table(
                name=name,
                vocabulary_size=t.vocabulary_size,
                dim=t.dimension,
                initializer=t.initializer,
                # v1 combiner=None means one id per sample (dense input);
                # every combiner gives the same result there and TF 2.x needs
                # a string, so use 'sum'.
                combiner='sum' if t.combiner is None else t.combiner,
                optimization_parameters=(t.optimization_parameters or
                                         self.optimization_parameters),
                learning_rate=t.learning_rate,
                learning_rate_fn=t.learning_rate_fn)
        for name, f in self.feature_to_config_dict.items():
            features[name] = _Feature(name=name, table=f.table_id,
                                      max_sequence_length=f.max_sequence_length,
                                      weight_key=f.weight_key)
        return tables, features

    # -- conversions ------------------------------------------------------------

    def to_feature_config(self, per_chip_batch_size, num_chips=1, global_step=None):
        """`{feature_name: tf.tpu.experimental.embedding.FeatureConfig}` for SparseCore.

        Tensor-core columns are left out (see `to_tensor_core_config`).
        Features of one shared table get the same `TableConfig` object.
        Output shapes are per chip, as SparseCore preprocessing is:
        `[per_chip_batch_size]`, or `[per_chip_batch_size, max_sequence_length]`
        for sequence features (which also get `max_sequence_length`).
        `num_chips` is only validated: nothing here depends on it.

        Optimizers: the spec's `optimization_parameters.to_tf_optimizer()`
        (for table dicts, a table's own `optimization_parameters` first). A
        table with a `learning_rate_fn` gets its own optimizer whose
        `learning_rate` is a zero-argument `StepLearningRate` calling
        `learning_rate_fn(global_step)` (TF 2.x calls `learning_rate()` with
        no argument); `global_step` is a `tf.Variable`, a zero-argument
        callable, or None for `tf.compat.v1.train.get_or_create_global_step()`.
        Tables with equal settings share one optimizer object.
        """
        emb = tf.tpu.experimental.embedding
        batch = _positive_int(per_chip_batch_size, 'per_chip_batch_size')
        _positive_int(num_chips, 'num_chips')

        tables, features = self._sparse_core_tables()
        optimizers: Dict[Any, Any] = {}

        def optimizer_for(t: _Table):
            if t.optimization_parameters is None:
                if t.learning_rate is not None or t.learning_rate_fn is not None:
                    raise ValueError(
                        f'Table {t.name!r} sets a learning rate but neither it nor the '
                        'spec has optimization_parameters.')
                return None  # TPUEmbeddingV2 applies its own optimizer argument.
            key = (t.optimization_parameters, t.learning_rate, t.learning_rate_fn)
            if key not in optimizers:
                lr = t.learning_rate
                if t.learning_rate_fn is not None:
                    lr = _opt.StepLearningRate(t.learning_rate_fn, global_step)
                optimizers[key] = t.optimization_parameters.to_tf_optimizer(learning_rate=lr)
            return optimizers[key]

        tf_tables = {
            t.name: emb.TableConfig(
                vocabulary_size=int(t.vocabulary_size), dim=int(t.dim),
                initializer=t.initializer, optimizer=optimizer_for(t),
                combiner=t.combiner, name=t.name)
            for t in tables.values()
        }
        result = {}
        for f in features.values():
            if f.max_sequence_length > 0:
                shape = [batch, f.max_sequence_length]
            else:
                shape = [batch]
            result[f.name] = emb.FeatureConfig(
                table=tf_tables[f.table], max_sequence_length=f.max_sequence_length,
                output_shape=shape, name=f.name)
        return result

    def feature_weight_keys(self) -> Dict[str, Optional[str]]:
        """`{feature_name: weight feature key or None}` for the SparseCore features.

        TF 2.x's FeatureConfig has no weight key (weights are passed to
        `enqueue`), so input pipelines read it from here.
        """
        _, features = self._sparse_core_tables()
        return {f.name: f.weight_key for f in features.values()}

    def tensor_core_features(self) -> Dict[str, Any]:
        """`{feature_name: column}` for `embedding_lookup_device='tpu_tensor_core'` columns.

        These are looked up densely on the TensorCore, not on SparseCore.
        """
        return {c.feature_name: c for c in self.tensor_core_feature_columns or []}

    def to_tensor_core_config(self) -> Dict[str, Dict[str, Any]]:
        """`{feature_name: dict(table_name, vocabulary_size, dim, combiner, tensor_core_shape)}`."""
        return {
            name: dict(table_name=c.table_name, vocabulary_size=c.vocabulary_size,
                       dim=int(c.dimension), combiner=c.combiner,
                       tensor_core_shape=list(c.tensor_core_shape))
            for name, c in self.tensor_core_features().items()
        }

    def to_sparse_core_config(self, max_ids_per_table=None, max_unique_ids_per_table=None,
                              max_ids_per_chip_per_sample=64, allow_id_dropping=False):
        """A `tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig` with these limits.

        The two per-table dicts are keyed by *stacked* table name, as TF's are.
        """
        # Not exported under tf.tpu.experimental.embedding by every TF build.
        config_cls = getattr(tf.tpu.experimental.embedding, 'SparseCoreEmbeddingConfig',
                             tpu_embedding_v3.SparseCoreEmbeddingConfig)
        return config_cls(
            max_ids_per_chip_per_sample=_positive_int(
                max_ids_per_chip_per_sample, 'max_ids_per_chip_per_sample'),
            max_ids_per_table=_check_limits(max_ids_per_table, 'max_ids_per_table'),
            max_unique_ids_per_table=_check_limits(max_unique_ids_per_table,
                                                   'max_unique_ids_per_table'),
            allow_id_dropping=bool(allow_id_dropping))

    # -- manifests ----------------------------------------------------------------

    def describe(self) -> Dict[str, Any]:
        """JSON-ready description of the spec's content (what `fingerprint` hashes).

        Column and dict forms that describe the same tables and features give
        the same description. Initializers are left out: they change the
        trained values, not the data layout.
        """
        tables, features = self._sparse_core_tables()
        return {
            'version': _FINGERPRINT_VERSION,
            'partition_strategy': self.partition_strategy,
            'optimizer': _optimizer_dict(self.optimization_parameters),
            'tables': [
                {'name': t.name, 'vocabulary_size': int(t.vocabulary_size),
                 'dim': int(t.dim), 'combiner': t.combiner,
                 'optimizer': _optimizer_dict(t.optimization_parameters),
                 'learning_rate': t.learning_rate,
                 'learning_rate_fn': _callable_name(t.learning_rate_fn)}
                for t in sorted(tables.values(), key=lambda t: t.name)
            ],
            'features': [
                {'name': f.name, 'table': f.table,
                 'max_sequence_length': f.max_sequence_length,
                 'weight_key': f.weight_key}
                for f in sorted(features.values(), key=lambda f: f.name)
            ],
            'tensor_core_features': [
                {'name': name, **cfg}
                for name, cfg in sorted(self.to_tensor_core_config().items())
            ],
        }

    def fingerprint(self) -> str:
        """sha256 hex of `describe()` (canonical JSON), stable across processes."""
        return canonical.fingerprint(self.describe(), default=_json_default)


def _check_columns(columns: List[Any]) -> None:
    """Checks TF makes when it converts columns (done here, at construction)."""
    seen_features = set()
    tables: Dict[str, Any] = {}
    for column in columns:
        feature_name = column.feature_name
        if feature_name in seen_features:
            raise ValueError(
                'Feature column {} is used with multiple embeddings and this is '
                'not supported.'.format(feature_name))
        seen_features.add(feature_name)
        # One name, one table: shared columns must come from one call.
        owner = (column.shared_embedding_column_creator
                 if isinstance(column, _fc.TPUSharedEmbeddingColumn) else column)
        other = tables.setdefault(column.table_name, owner)
        if other is not owner:
            raise ValueError(
                'Two different embedding tables are both named {!r}; give each '
                'shared_embedding_columns call its own '
                'shared_embedding_collection_name.'.format(column.table_name))


def _columns_by_device(feature_columns, optimization_parameters):
    """(SparseCore columns, TensorCore columns) of `feature_columns`, each checked a TPU embedding column, with
    `optimization_parameters` checked and the columns' tables and features checked consistent."""
    tensor_core_feature_columns = []
    embedding_core_feature_columns = []
    for column in feature_columns:
        if not isinstance(column, _TPU_EMBEDDING_COLUMN_CLASSES):
            raise TypeError(
                'All feature columns must be supported types in {}. Got {}'
                .format(_TPU_EMBEDDING_COLUMN_CLASSES, type(column)))
        if column.embedding_lookup_device == 'tpu_tensor_core':
            tensor_core_feature_columns.append(column)
        else:
            embedding_core_feature_columns.append(column)
    if not isinstance(optimization_parameters, _opt.SUPPORTED_OPTIMIZERS):
        raise ValueError('optimization_parameters must be an instance of type '
                         '{}. Got {}.'.format(_opt.SUPPORTED_OPTIMIZERS,
                                              type(optimization_parameters)))
    _check_columns(list(feature_columns))
    return embedding_core_feature_columns, tensor_core_feature_columns


def _check_config_dicts(feature_to_config_dict, table_to_config_dict, optimization_parameters):
    """The pair of dicts checked as TF checks them (types, every feature's table listed), and
    `optimization_parameters`, when given, one of the supported classes."""
    for feature, config in feature_to_config_dict.items():
        if not isinstance(config, EstimatorFeatureConfig):
            raise TypeError(
                'Config for feature {} must be of type `FeatureConfig`. Got {}'
                .format(feature, type(config)))
        if config.table_id not in table_to_config_dict:
            raise ValueError('Feature {} refers to table {} which is not in the '
                             'table_to_config_dict.'.format(
                                 feature, config.table_id))
    for table, config in table_to_config_dict.items():
        if not isinstance(config, EstimatorTableConfig):
            raise TypeError(
                'Config for table {} must be of type `TableConfig`. Got '
                '{}'.format(table, type(config)))
    # TF does not check this here (tables may bring their own
    # optimizer), but a wrong type can only fail later.
    if (optimization_parameters is not None and
            not isinstance(optimization_parameters, _opt.SUPPORTED_OPTIMIZERS)):
        raise ValueError('optimization_parameters must be an instance of type '
                         '{}. Got {}.'.format(_opt.SUPPORTED_OPTIMIZERS,
                                              type(optimization_parameters)))


def _optimizer_dict(params):
    return None if params is None else params.to_dict()


def _callable_name(fn):
    if fn is None:
        return None
    return '{}.{}'.format(getattr(fn, '__module__', '?'),
                          getattr(fn, '__qualname__', type(fn).__name__))


def _json_default(value):
    # numpy scalars and the like; anything else by a name that does not
    # depend on the process (no ids or addresses).
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if callable(value):
        return _callable_name(value)
    return '{}.{}'.format(type(value).__module__, type(value).__qualname__)
