"""TPU embedding feature columns: `embedding_column`, `shared_embedding_columns`.

These are TF 2.x's `tf.compat.v1.tpu.experimental.embedding_column` and
`tf.compat.v1.tpu.experimental.shared_embedding_columns` (source:
tensorflow/python/tpu/feature_column_v2.py) with the same signatures,
defaults, argument checks and error messages, rebuilt on TF's core
`EmbeddingColumn` / `SharedEmbeddingColumn` so that:

* on CPU they behave exactly like the core columns: `tf_keras.layers.
  DenseFeatures` (and `tf_keras.experimental.SequenceFeatures` for sequence
  columns) create the table and compute the lookup with the column's combiner;
* they carry what conversion to `TPUEmbeddingV2` needs (table name, feature
  key, vocabulary size, sequence length, lookup device, learning-rate fn).

We do not reuse TF's private `_TPUEmbeddingColumnV2`: it is estimator-era
code whose TPU branches read activations out of the feature dict, which this
project never does (lookups happen in TPUEmbeddingV2 or HostEmbedding).
"""

from __future__ import annotations

import copy
import math
import numbers
from typing import Any, Callable

from tensorflow.python.feature_column import feature_column_v2 as fc_lib
from tensorflow.python.feature_column import serialization
from tensorflow.python.ops import init_ops

__all__ = [
    "embedding_column",
    "shared_embedding_columns",
    "TPUEmbeddingColumn",
    "TPUSharedEmbeddingColumn",
    "ALLOWED_DEVICES",
]

# TF's `_ALLOWED_DEVICES`, same order (it appears in the error message).
ALLOWED_DEVICES = ['cpu', 'tpu_tensor_core', 'tpu_embedding_core']
_COMBINERS = ('mean', 'sqrtn', 'sum')

# The seven documented categorical kinds. TF 2.x itself accepts any
# `CategoricalColumn` here; its own comment says hashed, bucketized and
# crossed columns are not meant for TPU, and our offline pipelines only know
# how to produce ids for identity and vocabulary columns, so we check the
# documented list.
_BASE_CATEGORICAL_COLUMNS = (fc_lib.IdentityCategoricalColumn,
                             fc_lib.VocabularyFileCategoricalColumn,
                             fc_lib.VocabularyListCategoricalColumn)
_WRAPPING_CATEGORICAL_COLUMNS = (fc_lib.WeightedCategoricalColumn,
                                 fc_lib.SequenceCategoricalColumn)
_SUPPORTED_CATEGORICAL_COLUMNS = (_BASE_CATEGORICAL_COLUMNS +
                                  _WRAPPING_CATEGORICAL_COLUMNS)
_SEQUENCE_FEATURE_LENGTH_POSTFIX = '_seq_length_'


def _is_supported_categorical_column(column) -> bool:
    if isinstance(column, _WRAPPING_CATEGORICAL_COLUMNS):
        # weighted(identity), sequence(vocabulary list), ... one level deep.
        return isinstance(column.categorical_column, _BASE_CATEGORICAL_COLUMNS)
    return isinstance(column, _BASE_CATEGORICAL_COLUMNS)


def _type_error(what: str, column) -> TypeError:
    # TF's message, listing the kinds this implementation accepts.
    return TypeError(
        'categorical_column for tpu {} must be type {}, got {}.'.format(
            what, ' or '.join(cc.__name__ for cc in _SUPPORTED_CATEGORICAL_COLUMNS),
            type(column)))


def _check_dimension(dimension):
    # TF: `(dimension is None) or (dimension < 1)`. We also refuse non-integers
    # (TF would accept 2.5 here and fail much later in TableConfig).
    if (dimension is None or isinstance(dimension, bool) or
            not isinstance(dimension, numbers.Integral) or dimension < 1):
        raise ValueError('Invalid dimension {}.'.format(dimension))


def _check_combiner(combiner):
    # Not checked by TF's feature columns; TPUEmbeddingV2's TableConfig would
    # reject it at conversion time, so fail at the call that introduced it.
    if combiner not in _COMBINERS:
        raise ValueError('Invalid combiner {}'.format(combiner))


def _check_learning_rate_fn(learning_rate_fn):
    if learning_rate_fn is not None and not callable(learning_rate_fn):
        raise ValueError('learning_rate_fn must be callable if specified, got {}.'
                         .format(learning_rate_fn))


def _check_tensor_core_shape_rank(tensor_core_shape):
    # TF checks this early (before the initializer), the rest in _check_device.
    if tensor_core_shape and len(tensor_core_shape) != 2:
        raise ValueError(
            'tensor_core_shape must be size 2. Got {}.'.format(tensor_core_shape))


def _check_device(embedding_lookup_device, tensor_core_shape, categorical_columns):
    """TF's embedding_lookup_device checks, in TF's order, then our shape checks."""
    if (embedding_lookup_device and
            embedding_lookup_device not in ALLOWED_DEVICES):
        raise ValueError(
            f'If set, embedding_lookup_device must be in {ALLOWED_DEVICES}')
    if embedding_lookup_device == 'tpu_tensor_core':
        if not tensor_core_shape:
            raise ValueError('Using embedding_lookup_device=tpu_tensor_core requires '
                             'tensor_core_shape to be set.')
        for c in categorical_columns:
            if isinstance(c, fc_lib.SequenceCategoricalColumn):
                raise ValueError('embedding_lookup_device=tpu_tensor_core currently does '
                                 'not support sequence columns.')
    if tensor_core_shape:
        # TF's docs: "The batch dimension can be left None or -1 to indicate a
        # dynamic shape." TF never checks it; the batch comes from the input
        # pipeline, so a fixed one here would be silently ignored.
        if tensor_core_shape[0] not in (None, -1):
            raise ValueError(
                'tensor_core_shape batch dimension must be None or -1. Got {}.'
                .format(tensor_core_shape))
        width = tensor_core_shape[1]
        if (isinstance(width, bool) or not isinstance(width, numbers.Integral) or
                width < 1):
            raise ValueError(
                'tensor_core_shape[1] must be a positive integer. Got {}.'
                .format(tensor_core_shape))


def _default_initializer(dimension):
    # TF: tf.compat.v1.truncated_normal_initializer(0.0, 1/sqrt(dimension)).
    return init_ops.truncated_normal_initializer(
        mean=0.0, stddev=1 / math.sqrt(dimension))


class _TPUColumnMixin:
    """What TF's `_TPUBaseEmbeddingColumn` adds to a core embedding column.

    Holds the TPU-only settings and exposes both TF's getter methods (for
    code written against TF's classes) and plain properties (for ours).
    """

    # Provided by the TF embedding column class each concrete column also derives from.
    categorical_column: Any
    combiner: Any
    dimension: Any
    initializer: Any
    get_embedding_var_name: Callable[[], str]

    def _init_tpu(self, categorical_column, max_sequence_length, learning_rate_fn,
                  embedding_lookup_device, tensor_core_shape):
        self._tpu_categorical_column = categorical_column
        self._max_sequence_length = max_sequence_length
        self._learning_rate_fn = learning_rate_fn
        self._embedding_lookup_device = embedding_lookup_device
        self._tensor_core_shape = (None if tensor_core_shape is None
                                   else tuple(tensor_core_shape))
        # TF's checks and messages (_TPUBaseEmbeddingColumn.__init__).
        if self.is_sequence_column() and max_sequence_length < 1:
            raise ValueError('max_sequence_length must be greater than 0 for '
                             'sequence columns. Got max_sequence_length={} for '
                             'sequence column {}.'.format(max_sequence_length,
                                                          categorical_column.name))
        if not self.is_sequence_column() and max_sequence_length != 0:
            raise ValueError('Non zero max_seq_length={} specified for non '
                             'sequence column {}.'.format(max_sequence_length,
                                                          categorical_column.name))

    # -- properties conversion code reads ------------------------------------

    @property
    def max_sequence_length(self) -> int:
        return self._max_sequence_length

    @property
    def learning_rate_fn(self):
        return self._learning_rate_fn

    @property
    def embedding_lookup_device(self):
        """None, 'cpu', 'tpu_tensor_core' or 'tpu_embedding_core' (as passed)."""
        return self._embedding_lookup_device

    @property
    def tensor_core_shape(self):
        return self._tensor_core_shape

    @property
    def is_sequence(self) -> bool:
        return self.is_sequence_column()

    @property
    def is_weighted(self) -> bool:
        return self.is_categorical_column_weighted()

    @property
    def feature_name(self) -> str:
        """Key of the id feature in the features dict (TF's get_feature_key_name)."""
        return self.get_feature_key_name()

    @property
    def weight_feature_key(self):
        """Key of the weight feature for weighted columns, else None."""
        return self.get_weight_key_name()

    @property
    def vocabulary_size(self) -> int:
        """Rows of the table: the categorical column's `num_buckets`."""
        return int(self.categorical_column.num_buckets)

    @property
    def embedding_var_name(self) -> str:
        """TF's get_embedding_var_name(): what TPUEstimator named tables after."""
        return self.get_embedding_var_name()

    # -- TF's _TPUBaseEmbeddingColumn interface ------------------------------

    def get_combiner(self):
        return self.combiner

    def get_embedding_table_size(self):
        """Returns num_ids and width."""
        return (self.categorical_column.num_buckets, self.dimension)

    def get_feature_key_name(self):
        if self.is_categorical_column_weighted():
            return self.categorical_column.categorical_column.name
        return self.categorical_column.name

    def get_weight_key_name(self):
        if self.is_categorical_column_weighted():
            return self.categorical_column.weight_feature_key
        return None

    def get_initializer(self):
        return self.initializer

    def is_categorical_column_weighted(self):
        return isinstance(self.categorical_column, fc_lib.WeightedCategoricalColumn)

    def is_sequence_column(self):
        return isinstance(self._tpu_categorical_column, fc_lib.SequenceCategoricalColumn)

    def get_max_sequence_length(self):
        return self._max_sequence_length

    def get_learning_rate_fn(self):
        return self._learning_rate_fn

    def get_sequence_length_feature_key_name(self):
        return self.get_feature_key_name() + _SEQUENCE_FEATURE_LENGTH_POSTFIX

    def _tpu_repr_extra(self):
        return (f"max_sequence_length={self._max_sequence_length}, "
                f"embedding_lookup_device={self._embedding_lookup_device!r}, "
                f"tensor_core_shape={self._tensor_core_shape!r}")


@serialization.register_feature_column
class TPUEmbeddingColumn(_TPUColumnMixin, fc_lib.EmbeddingColumn):
    """Returned by `embedding_column`: a core `EmbeddingColumn` plus TPU settings.

    `table_name` is the core column's name, `<categorical_column.name>_embedding`
    (also the variable scope DenseFeatures creates the table under).
    """

    def __new__(cls, categorical_column, dimension, combiner='mean', initializer=None,
                max_sequence_length=0, learning_rate_fn=None, embedding_lookup_device=None,
                tensor_core_shape=None, use_safe_embedding_lookup=True):
        return fc_lib.EmbeddingColumn.__new__(
            cls, categorical_column, dimension, combiner=combiner,
            initializer=initializer, ckpt_to_load_from=None, tensor_name_in_ckpt=None,
            max_norm=None, trainable=True,
            use_safe_embedding_lookup=use_safe_embedding_lookup)

    def __init__(self, categorical_column, dimension, combiner='mean', initializer=None,
                 max_sequence_length=0, learning_rate_fn=None, embedding_lookup_device=None,
                 tensor_core_shape=None, use_safe_embedding_lookup=True):
        self._init_tpu(categorical_column, max_sequence_length, learning_rate_fn,
                       embedding_lookup_device, tensor_core_shape)

    # namedtuple copying/pickling would call __new__ with the core fields.
    def __getnewargs__(self):
        return (self.categorical_column, self.dimension, self.combiner, self.initializer,
                self._max_sequence_length, self._learning_rate_fn,
                self._embedding_lookup_device, self._tensor_core_shape,
                self.use_safe_embedding_lookup)

    def __deepcopy__(self, memo):
        return TPUEmbeddingColumn(*(copy.deepcopy(a, memo) for a in self.__getnewargs__()))

    def __repr__(self):
        return (f"TPUEmbeddingColumn(categorical_column={self.categorical_column!r}, "
                f"dimension={self.dimension}, combiner={self.combiner!r}, "
                f"{self._tpu_repr_extra()})")

    @property
    def table_name(self) -> str:
        return self.name

    def get_embedding_var_name(self):
        return self.categorical_column.name

    def get_config(self):
        """Core config plus the TPU settings (learning_rate_fn is not serializable)."""
        config = {
            'categorical_column': serialization.serialize_feature_column(
                self.categorical_column),
            'dimension': self.dimension,
            'combiner': self.combiner,
            'initializer': serialization._serialize_keras_object(self.initializer),  # pylint: disable=protected-access
            'max_sequence_length': self._max_sequence_length,
            'embedding_lookup_device': self._embedding_lookup_device,
            'tensor_core_shape': (None if self._tensor_core_shape is None
                                  else list(self._tensor_core_shape)),
            'use_safe_embedding_lookup': self.use_safe_embedding_lookup,
        }
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None, columns_by_name=None):
        kwargs = dict(config)
        kwargs['categorical_column'] = serialization.deserialize_feature_column(
            config['categorical_column'], custom_objects, columns_by_name)
        # As the core EmbeddingColumn.from_config: initializers from init_ops.
        all_initializers = {k: v for k, v in vars(init_ops).items() if isinstance(v, type)}
        kwargs['initializer'] = serialization._deserialize_keras_object(  # pylint: disable=protected-access
            config['initializer'], module_objects=all_initializers,
            custom_objects=custom_objects)
        return embedding_column(**kwargs)


class TPUSharedEmbeddingColumn(_TPUColumnMixin, fc_lib.SharedEmbeddingColumn):
    """Returned by `shared_embedding_columns`: a core `SharedEmbeddingColumn` plus TPU settings.

    All columns of one call share a `SharedEmbeddingColumnCreator` (one
    variable) and a `table_name`: the shared embedding collection name.
    """

    def __new__(cls, categorical_column, shared_embedding_column_creator, combiner='mean',
                initializer=None, shared_embedding_collection_name=None,
                max_sequence_length=0, learning_rate_fn=None, embedding_lookup_device=None,
                tensor_core_shape=None, use_safe_embedding_lookup=True):
        return fc_lib.SharedEmbeddingColumn.__new__(
            cls, categorical_column, combiner=combiner,
            shared_embedding_column_creator=shared_embedding_column_creator,
            max_norm=None, use_safe_embedding_lookup=use_safe_embedding_lookup)

    def __init__(self, categorical_column, shared_embedding_column_creator, combiner='mean',
                 initializer=None, shared_embedding_collection_name=None,
                 max_sequence_length=0, learning_rate_fn=None, embedding_lookup_device=None,
                 tensor_core_shape=None, use_safe_embedding_lookup=True):
        self._init_tpu(categorical_column, max_sequence_length, learning_rate_fn,
                       embedding_lookup_device, tensor_core_shape)
        self._initializer = initializer
        self._shared_embedding_collection_name = shared_embedding_collection_name

    def __getnewargs__(self):
        return (self.categorical_column, self.shared_embedding_column_creator,
                self.combiner, self._initializer, self._shared_embedding_collection_name,
                self._max_sequence_length, self._learning_rate_fn,
                self._embedding_lookup_device, self._tensor_core_shape,
                self.use_safe_embedding_lookup)

    def __deepcopy__(self, memo):
        # As TF: the creator is deep-copied too, so columns copied together
        # (one deepcopy call, one memo) still share one copy of it.
        return TPUSharedEmbeddingColumn(
            *(copy.deepcopy(a, memo) for a in self.__getnewargs__()))

    def __repr__(self):
        return (f"TPUSharedEmbeddingColumn(categorical_column={self.categorical_column!r}, "
                f"dimension={self.dimension}, combiner={self.combiner!r}, "
                f"shared_embedding_collection_name="
                f"{self._shared_embedding_collection_name!r}, {self._tpu_repr_extra()})")

    @property
    def dimension(self) -> int:
        return self.shared_embedding_column_creator.dimension

    @property
    def initializer(self):
        return self._initializer

    @property
    def shared_embedding_collection_name(self) -> str:
        return self._shared_embedding_collection_name

    @property
    def table_name(self) -> str:
        return self._shared_embedding_collection_name

    def get_embedding_table_size(self):
        return (self.categorical_column.num_buckets,
                self.shared_embedding_column_creator.dimension)

    def get_embedding_var_name(self):
        return self._shared_embedding_collection_name


# One unit: TF's signature and its documented arguments; each check below is one call.
def embedding_column(categorical_column,
                     dimension,
                     combiner='mean',
                     initializer=None,
                     max_sequence_length=0,
                     learning_rate_fn=None,
                     embedding_lookup_device=None,
                     tensor_core_shape=None,
                     use_safe_embedding_lookup=True):
    """TPU version of `tf.compat.v1.feature_column.embedding_column`.

    Same signature, defaults and errors as TF 2.x's
    `tf.compat.v1.tpu.experimental.embedding_column`:

    Args:
      categorical_column: from `categorical_column_with_identity`,
        `weighted_categorical_column`, `categorical_column_with_vocabulary_file`,
        `categorical_column_with_vocabulary_list`,
        `sequence_categorical_column_with_identity`,
        `sequence_categorical_column_with_vocabulary_file` or
        `sequence_categorical_column_with_vocabulary_list`.
      dimension: embedding width, > 0.
      combiner: 'mean', 'sqrtn' or 'sum' (reduces a multivalent row of a
        non-sequence column).
      initializer: callable; default `tf.compat.v1.truncated_normal_initializer`
        with mean 0 and stddev `1/sqrt(dimension)`.
      max_sequence_length: `> 0` for sequence columns, 0 otherwise.
      learning_rate_fn: `fn(global_step) -> learning rate` for this table.
      embedding_lookup_device: None, 'cpu', 'tpu_tensor_core' or
        'tpu_embedding_core'. 'tpu_tensor_core' needs `tensor_core_shape` and
        a non-sequence column; such columns are looked up densely on the
        TensorCore and do not go to SparseCore.
      tensor_core_shape: `[batch, max ids per row]`, batch None or -1.
      use_safe_embedding_lookup: use `safe_embedding_lookup_sparse` on CPU.

    Returns:
      A `TPUEmbeddingColumn`.

    Raises:
      TypeError: if `categorical_column` is not one of the supported kinds.
      ValueError: if `dimension` not > 0, `initializer` not callable,
        `max_sequence_length` wrong for the column, or an invalid
        `embedding_lookup_device` / `tensor_core_shape`.
    """
    if not _is_supported_categorical_column(categorical_column):
        raise _type_error('embedding_column', categorical_column)
    _check_dimension(dimension)
    _check_tensor_core_shape_rank(tensor_core_shape)
    if (initializer is not None) and (not callable(initializer)):
        raise ValueError('initializer must be callable if specified. '
                         'Embedding of column_name: {}'.format(categorical_column.name))
    if initializer is None:
        initializer = _default_initializer(dimension)
    _check_device(embedding_lookup_device, tensor_core_shape, [categorical_column])
    _check_combiner(combiner)
    _check_learning_rate_fn(learning_rate_fn)
    return TPUEmbeddingColumn(
        categorical_column=categorical_column,
        dimension=int(dimension),
        combiner=combiner,
        initializer=initializer,
        max_sequence_length=max_sequence_length,
        learning_rate_fn=learning_rate_fn,
        embedding_lookup_device=embedding_lookup_device,
        tensor_core_shape=tensor_core_shape,
        use_safe_embedding_lookup=use_safe_embedding_lookup)


# One unit: TF's signature and its documented arguments; each check below is one call.
def shared_embedding_columns(categorical_columns,
                             dimension,
                             combiner='mean',
                             initializer=None,
                             shared_embedding_collection_name=None,
                             max_sequence_lengths=None,
                             learning_rate_fn=None,
                             embedding_lookup_device=None,
                             tensor_core_shape=None,
                             use_safe_embedding_lookup=True):
    """TPU version of `tf.compat.v1.feature_column.shared_embedding_columns`.

    Same signature, defaults and errors as TF 2.x's
    `tf.compat.v1.tpu.experimental.shared_embedding_columns`. All columns
    share one table. All columns must have the same number of buckets.

    Args:
      categorical_columns: the columns sharing the table, of the kinds `embedding_column` takes.
      dimension: embedding width, `> 0`.
      combiner: 'mean', 'sqrtn' or 'sum' (reduces a multivalent row of a
        non-sequence column).
      initializer: callable; default `tf.compat.v1.truncated_normal_initializer`
        with mean 0 and stddev `1/sqrt(dimension)`.
      shared_embedding_collection_name: the table's name; default: the sorted categorical
        column names joined by '_' plus '_shared_embedding'.
      max_sequence_lengths: None/empty, or one entry per column (0 for non-sequence
        columns, `> 0` for sequence ones).
      learning_rate_fn: `fn(global_step) -> learning rate` for the table.
      embedding_lookup_device: as for `embedding_column`.
      tensor_core_shape: as for `embedding_column`.
      use_safe_embedding_lookup: use `safe_embedding_lookup_sparse` on CPU.

    Returns:
      A list of `TPUSharedEmbeddingColumn`, in the order of `categorical_columns`.

    Raises:
      TypeError: a column is not one of the supported kinds.
      ValueError: no columns, `max_sequence_lengths` not one per column, `dimension` not `> 0`,
        `initializer` not callable, columns with different numbers of buckets, or an invalid
        `combiner`, `embedding_lookup_device` or `tensor_core_shape`.
    """
    categorical_columns = _shared_categorical_columns(categorical_columns)
    max_sequence_lengths = _max_sequence_lengths(max_sequence_lengths, len(categorical_columns))

    _check_dimension(dimension)
    _check_tensor_core_shape_rank(tensor_core_shape)
    if (initializer is not None) and (not callable(initializer)):
        raise ValueError('initializer must be callable if specified. ')
    if initializer is None:
        initializer = _default_initializer(dimension)

    # Sorted so the default collection name is deterministic even if the
    # caller passes columns from an unordered collection (TF's reasoning).
    sorted_columns = sorted(categorical_columns, key=lambda x: x.name)
    num_buckets = _common_num_buckets(sorted_columns)

    if not shared_embedding_collection_name:
        shared_embedding_collection_name = '_'.join(c.name for c in sorted_columns)
        shared_embedding_collection_name += '_shared_embedding'

    _check_device(embedding_lookup_device, tensor_core_shape, sorted_columns)
    _check_combiner(combiner)
    _check_learning_rate_fn(learning_rate_fn)

    # trainable=None as in TF (get_variable then defaults to trainable).
    column_creator = fc_lib.SharedEmbeddingColumnCreator(
        dimension=int(dimension), initializer=initializer, ckpt_to_load_from=None,
        tensor_name_in_ckpt=None, num_buckets=num_buckets, trainable=None,
        name=shared_embedding_collection_name)

    return [
        TPUSharedEmbeddingColumn(
            categorical_column=categorical_column,
            shared_embedding_column_creator=column_creator,
            combiner=combiner,
            initializer=initializer,
            shared_embedding_collection_name=shared_embedding_collection_name,
            max_sequence_length=max_sequence_length,
            learning_rate_fn=learning_rate_fn,
            embedding_lookup_device=embedding_lookup_device,
            tensor_core_shape=tensor_core_shape,
            use_safe_embedding_lookup=use_safe_embedding_lookup)
        for categorical_column, max_sequence_length in zip(
            categorical_columns, max_sequence_lengths)
    ]


def _shared_categorical_columns(categorical_columns):
    """The columns as a list, each of a kind `embedding_column` takes, at least one."""
    categorical_columns = list(categorical_columns)
    for categorical_column in categorical_columns:
        if not _is_supported_categorical_column(categorical_column):
            # TF's message has the double space too.
            raise _type_error(' shared_embedding_columns', categorical_column)
    if not categorical_columns:
        # TF fails here with an IndexError; say what is wrong instead.
        raise ValueError('categorical_columns must not be empty.')
    return categorical_columns


def _max_sequence_lengths(max_sequence_lengths, num_columns):
    """One max sequence length per column: the ones given, or 0 for every column when none are."""
    if not max_sequence_lengths:
        max_sequence_lengths = [0] * num_columns
    if len(max_sequence_lengths) != num_columns:
        raise ValueError('max_sequence_lengths and categorical_columns must be of '
                         'the same length. len(max_sequence_lengths)={} '
                         'len(categorical_columns)={}.'.format(
                             len(max_sequence_lengths), num_columns))
    return max_sequence_lengths


def _common_num_buckets(sorted_columns):
    """The number of buckets every column has (a table shared by columns of other sizes is refused)."""
    num_buckets = sorted_columns[0].num_buckets
    for c in sorted_columns[1:]:
        if num_buckets != c.num_buckets:
            raise ValueError(
                'To use shared_embedding_column, all categorical_columns must have '
                'the same number of buckets. Given column: {} with buckets: {} does  '
                'not match column: {} with buckets: {}'.format(
                    sorted_columns[0], num_buckets, c, c.num_buckets))
    return num_buckets
