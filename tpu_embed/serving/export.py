"""One SavedModel from raw features to predictions: the mapping, the trained tables and the dense model.

    tpu_embed.serving.export_saved_model("build/criteo", host_embedding, model, "export/criteo")

    loaded = tf.saved_model.load("export/criteo")        # plain TensorFlow: tpu_embed is not needed
    out = loaded.signatures["serving_default"](examples=serialized_tf_examples)
    out["probabilities"], out["logits"], out["valid"]    # float32 [batch], float32 [batch], bool [batch]
    loaded.signatures["raw"](C1=tf.constant(["68fd1e64"]), I1=tf.constant(["3"]), ...)   # every column

Signatures:

* `serving_default`: `examples`, serialized `tf.train.Example`s [batch], each key parsed as the kind of values
  the training data held (the manifest's `value_kinds`; `tpu_embed.serving.examples`): another kind fails the
  call in one line naming the key, the Example and both kinds; a key of several kinds is parsed as any kind;
* `examples_any_kind`: the same, any value kind per key, as the offline TFRecord reader takes them;
* `raw`: one string tensor [batch] per column the spec reads (label excluded), a CSV cell's text: multivalent
  values joined by the feature's delimiter, numbers as text, blank for no value. Every column is an input: a
  SavedModel signature has no optional inputs (TensorFlow refuses a call without one: "missing required
  arguments: zip"), so a column without values is given as blanks; rows whose keys vary are for
  `serving_default`, where a missing key is no value.

Both return `predictions` (the model's output as it is, float32 [batch]) and `valid` (bool [batch]: False
where the offline jobs would not have used the record; `tpu_embed.serving.mapping`). As `model_output=` says
what the model returns (`MODEL_OUTPUTS`), a binary classifier's also return `logits` and `probabilities` (the
sigmoid of the logits; of a model that returns probabilities, their logits log(p / (1 - p)), p clipped to
[1e-7, 1 - 1e-7]); a model of other values (a regression) returns `predictions` only. An empty batch gives
empty ones, an Example with no features the prediction of a row without values (alone as beside others),
and `raw` columns of unequal length are refused naming them (docs/how-to/serve.md). The lookup is the
SparseCore math of `HostEmbedding` (each value's gain from its table's combiner and weight, equal ids summed), over
the trained tables: SparseCore and tensor-core features alike, sequence features [batch, sequence_length, dim];
the tables are saved stacked per embedding width, every feature of a width looked up by one gather and one
segment sum. The SavedModel holds the signatures' functions, the tables, the model's variables and the
vocabulary assets (not the model as an object: its signatures need only its variables).
"""

from __future__ import annotations

import collections.abc
from typing import AbstractSet, Any, Callable, Dict, List, Mapping, Optional, Sequence

import tensorflow as tf

from tpu_embed.serving.columns import block_of_rows
from tpu_embed.serving.mapping import Mapped, RawFeatureMapping
from tpu_embed.serving.rules import load_for_serving

__all__ = ["ServingModel", "embedding_lookup", "export_saved_model", "MODEL_OUTPUTS"]

# What a model returns -> the outputs it adds to `predictions` and `valid`.
MODEL_OUTPUTS = {"logits": ("logits", "probabilities"), "probabilities": ("logits", "probabilities"), "values": ()}
_P_CLIP = 1e-7  # probabilities -> logits: p clipped to [_P_CLIP, 1 - _P_CLIP], so 0 and 1 give finite logits


def _gains(weights: tf.RaggedTensor, combiner: str) -> tf.RaggedTensor:
    """Each value's gain: its weight scaled by the combiner over its row (float32, as the CSR's gains)."""
    w = weights.flat_values
    if combiner == "sum":
        return weights
    s = tf.reduce_sum(weights * weights if combiner == "sqrtn" else weights, axis=1)
    scale = tf.where(tf.equal(s, 0.0), tf.zeros_like(s), 1.0 / (tf.sqrt(s) if combiner == "sqrtn" else s))
    return weights.with_flat_values(w * tf.gather(scale, weights.value_rowids()))


def embedding_lookup(table: tf.Tensor, ids: tf.RaggedTensor, weights: Optional[tf.RaggedTensor], combiner: str,
                     sequence_length: int = 0) -> tf.Tensor:
    """Activations of one feature: [batch, dim] (`sum_i gain_i * table[id_i]`), or [batch, sequence_length, dim]
    for a sequence feature (position p: its value's gain times its row; zero where a row is shorter)."""
    if weights is None:
        weights = ids.with_flat_values(tf.ones_like(ids.flat_values, tf.float32))
    rows = tf.gather(table, ids.flat_values)
    nrows = ids.nrows()
    if sequence_length:
        # Every position is a sample of its own: the combiner over one value.
        w = weights.flat_values
        gain = w if combiner == "sum" else tf.where(
            tf.equal(w, 0.0), tf.zeros_like(w), w / (tf.abs(w) if combiner == "sqrtn" else w))
        dense = ids.with_flat_values(rows * gain[:, None]).to_tensor(
            shape=tf.stack([nrows, tf.constant(sequence_length, tf.int64), tf.shape(table, out_type=tf.int64)[1]]))
        return dense
    gains = _gains(weights, combiner).flat_values
    return tf.math.unsorted_segment_sum(rows * gains[:, None], ids.value_rowids(), nrows)


def _default_model_inputs(mapped: Mapping[str, Any], activations: Mapping[str, tf.Tensor]) -> Any:
    return {"dense": mapped["dense"], "embeddings": dict(activations)}


_COMBINERS = {"sum": 0, "mean": 1, "sqrtn": 2}


class _MappedView(collections.abc.Mapping):
    """`Mapped` as the dict `map_raw` returns, for `model_inputs`: "dense" and "valid" as they are, "ids" and
    "weights" split per feature only when a `model_inputs` asks for them."""

    def __init__(self, mapped: Mapped):
        self._mapped = mapped
        self._per_feature: Optional[Dict[str, Any]] = None

    def __getitem__(self, key: str) -> Any:
        if key in ("dense", "valid"):
            return getattr(self._mapped, key)
        if key in ("ids", "weights"):
            if self._per_feature is None:
                self._per_feature = self._mapped.feature_ids()
            return self._per_feature[key]
        raise KeyError(key)

    def __iter__(self):
        return iter(("ids", "weights", "dense", "valid"))

    def __len__(self) -> int:
        return 4


class _StackedTables:
    """The trained tables the features look up, one variable per embedding width: the tables of that width one
    after the other (`row_offset` of each), so that every feature of a width is one gather."""

    def __init__(self, spec: Any, tables: Mapping[str, Any], used: Sequence[str]):
        by_dim: Dict[int, List[str]] = {}
        self.values = {}
        for t in used:
            value = tf.convert_to_tensor(tables[t])
            by_dim.setdefault(int(value.shape[1]), []).append(t)
            self.values[t] = value
        self.dims = sorted(by_dim)
        self.tables_of_dim = {d: by_dim[d] for d in self.dims}
        self.row_offset: Dict[str, int] = {}
        self.variables = {}
        for d in self.dims:
            at = 0
            for t in by_dim[d]:
                self.row_offset[t] = at
                at += int(self.values[t].shape[0])
            stacked = tf.concat([self.values[t] for t in by_dim[d]], axis=0) if len(by_dim[d]) > 1 \
                else self.values[by_dim[d][0]]
            # A copy: the SavedModel holds the trained values as they are now, not the training variables.
            self.variables[d] = tf.Variable(stacked, trainable=False, name=f"tables_dim{d}")


def _activations(spec: Any, mapped: Mapped, stacked: _StackedTables) -> Dict[str, tf.Tensor]:
    """{feature: activation} of every feature of `mapped`, as `embedding_lookup` computes each one, for all the
    features of one embedding width at once: one gather from that width's stacked tables and one segment sum,
    whose segments are the bags (feature, row) and the sequence features' (feature, row, position)."""
    feats = mapped.layout.features
    nfeat = len(feats)
    nrows = mapped.nrows
    segment = mapped.rowids  # per value: its feature's position * nrows + its row
    weights = tf.ones_like(mapped.ids.flat_values, tf.float32) if mapped.weights is None else mapped.weights
    dim_of = [int(stacked.values[f.table].shape[1]) for f in feats]
    combiner = [_COMBINERS[spec.table(f.table).combiner] for f in feats]
    seq = [f.sequence_length for f in feats]
    place = None  # per value: its place in its row (sequence features)
    if any(seq):
        place = tf.range(tf.size(segment, out_type=tf.int64)) - tf.gather(mapped.ids.row_splits, segment)
    block = block_of_rows(nfeat, nrows)  # per row of `mapped.ids`: its feature's position

    out: Dict[str, tf.Tensor] = {}
    for d in stacked.dims:
        members = [k for k in range(nfeat) if dim_of[k] == d]
        if not members:
            continue
        ids, w, seg, at = mapped.ids.flat_values, weights, segment, place
        if len(members) < nfeat:  # this width's values only
            inside = _per_feature([dim_of[k] == d for k in range(nfeat)], tf.bool, tf.gather(block, segment))
            ids, w, seg = tf.boolean_mask(ids, inside), tf.boolean_mask(w, inside), tf.boolean_mask(seg, inside)
            at = None if place is None else tf.boolean_mask(place, inside)
        feature = tf.gather(block, seg)
        offsets = [stacked.row_offset[f.table] for f in feats]
        rows_of_tables = ids + _per_feature(offsets, tf.int64, feature)
        if mapped.weights is None and not any(seq) and len(members) == nfeat:
            out.update(_unweighted_bags(mapped, stacked.variables[d], d, rows_of_tables, seg, combiner))
        else:
            out.update(_bags_and_sequences(feats, members, combiner, stacked.variables[d], d, rows_of_tables, w,
                                           seg, feature, at, nrows))
    return out


def _per_feature(vals: Sequence[Any], dtype: tf.DType, feature: tf.Tensor) -> tf.Tensor:
    """Each value's entry of `vals` (one per feature), by its feature's position."""
    return tf.gather(tf.constant(list(vals), dtype), feature)


def _unweighted_bags(mapped: Mapped, table: tf.Variable, d: int, rows_of_tables: tf.Tensor, seg: tf.Tensor,
                     combiner: Sequence[int]) -> Dict[str, tf.Tensor]:
    """{feature: activation} where every feature is a bag of width `d` and every value a gain of 1 before its
    combiner: one fused gather and sum per bag, then each bag scaled (mean: 1 / its values, sqrtn: 1 / their
    square root; 0 for an empty bag)."""
    feats, nrows = mapped.layout.features, mapped.nrows
    nfeat = len(feats)
    summed = tf.sparse.segment_sum(table, rows_of_tables, seg, num_segments=nfeat * nrows)
    count = tf.cast(mapped.ids.row_lengths(), tf.float32)
    code = tf.repeat(tf.constant(combiner, tf.int32), nrows)
    scale = tf.where(tf.equal(code, 0), tf.ones_like(count), tf.where(
        tf.equal(count, 0.0), tf.zeros_like(count),
        1.0 / tf.where(tf.equal(code, 1), count, tf.sqrt(count))))
    per_feature_rows = tf.reshape(summed * scale[:, None], [nfeat, nrows, d])
    return {f.name: a for f, a in zip(feats, tf.unstack(per_feature_rows, num=nfeat), strict=True)}


def _bags_and_sequences(feats: Sequence[Any], members: Sequence[int], combiner: Sequence[int], table: tf.Variable,
                        d: int, rows_of_tables: tf.Tensor, w: tf.Tensor, seg: tf.Tensor, feature: tf.Tensor,
                        at: Optional[tf.Tensor], nrows: tf.Tensor) -> Dict[str, tf.Tensor]:
    """{feature: activation} of the features of width `d` (`members`): each value's table row times its gain,
    summed per slot: a bag's (feature, row), then a sequence feature's (feature, row, position `at`)."""
    nfeat = len(feats)
    seq = [f.sequence_length for f in feats]
    row = seg - feature * nrows
    table_rows = tf.gather(table, rows_of_tables)
    code = _per_feature(combiner, tf.int32, feature)
    gain = _bag_gains(w, seg, code, {combiner[k] for k in members}, nfeat, nrows)
    bags = [k for k in members if not seq[k]]
    seqs = [k for k in members if seq[k]]
    bag_index = {k: i for i, k in enumerate(bags)}
    if not seqs and len(bags) == nfeat:
        slot, total = seg, nfeat * nrows
    else:
        slot = _per_feature([bag_index.get(k, 0) for k in range(nfeat)], tf.int64, feature) * nrows + row
        total = len(bags) * nrows
    seq_base = {}
    if seqs:
        is_seq = _per_feature([bool(seq[k]) for k in range(nfeat)], tf.bool, feature)
        one = tf.where(tf.equal(w, 0.0), tf.zeros_like(w), w / tf.where(tf.equal(code, 2), tf.abs(w), w))
        gain = tf.where(is_seq & tf.not_equal(code, 0), one, gain)
        base = 0
        for k in seqs:
            seq_base[k] = base
            base += seq[k]
        where_seq = (len(bags) * nrows + _per_feature([seq_base.get(k, 0) for k in range(nfeat)], tf.int64, feature)
                     * nrows + row * _per_feature(seq, tf.int64, feature) + at)
        slot = tf.where(is_seq, where_seq, slot)
        total = total + base * nrows
    summed = tf.math.unsorted_segment_sum(table_rows * gain[:, None], slot, total)
    out: Dict[str, tf.Tensor] = {}
    if bags:
        bag_part = summed if not seqs else summed[:len(bags) * nrows]
        for k, a in zip(bags, tf.unstack(tf.reshape(bag_part, [len(bags), nrows, d]), num=len(bags)), strict=True):
            out[feats[k].name] = a
    for k in seqs:
        lo = (len(bags) + seq_base[k]) * nrows
        out[feats[k].name] = tf.reshape(summed[lo:lo + seq[k] * nrows], [nrows, seq[k], d])
    return out


def _bag_gains(w: tf.Tensor, seg: tf.Tensor, code: tf.Tensor, used: AbstractSet[int], nfeat: int, nrows: tf.Tensor
               ) -> tf.Tensor:
    """Each value's gain in its bag (`seg`): its weight scaled by its combiner over the bag (`code`; sum: 1,
    mean: 1 / sum of the weights, sqrtn: 1 / sqrt of the sum of their squares; 0 where that sum is 0).
    `used`: the combiner codes of the features; `nfeat * nrows` bags."""
    gain = w
    if 1 in used:
        s1 = tf.math.unsorted_segment_sum(w, seg, nfeat * nrows)
        gain = tf.where(tf.equal(code, 1), w * tf.gather(tf.where(tf.equal(s1, 0.0), tf.zeros_like(s1),
                                                                   1.0 / s1), seg), gain)
    if 2 in used:
        s2 = tf.math.unsorted_segment_sum(w * w, seg, nfeat * nrows)
        gain = tf.where(tf.equal(code, 2), w * tf.gather(tf.where(tf.equal(s2, 0.0), tf.zeros_like(s2),
                                                                   1.0 / tf.sqrt(s2)), seg), gain)
    return gain


class _Untracked:
    """A value a `tf.Module` holds without saving it as an object of the SavedModel."""

    def __init__(self, value: Any):
        self.value = value


class ServingModel(tf.Module):
    """The mapping, the tables and the model in one `tf.Module`, with the signatures' functions.

    Args:
      artifact_dir: the artifact the model was trained from (its spec, manifest and vocabulary files).
      tables: {table name: [rows, dim] tensor or variable} (`HostEmbedding.embedding_tables`).
      model: a callable taking `model_inputs(mapped, activations)` and returning [batch] predictions.
      model_inputs: builds the model's input from the mapping's output and {feature: activation}; default
        `{"dense": mapped["dense"], "embeddings": activations}` (`tpu_embed.training.dlrm`'s input).
      model_output: what the model returns: "logits" (a binary classifier's, as `tpu_embed.training.dlrm`
        trained with a sigmoid cross-entropy; the default), "probabilities", or "values" (anything else, e.g.
        a regression's ratings). It decides the outputs (module docstring).
    """

    def __init__(self, artifact_dir: str, tables: Mapping[str, Any], model: Any,
                 model_inputs: Optional[Callable[[Mapping[str, Any], Mapping[str, tf.Tensor]], Any]] = None,
                 name: str = "tpu_embed_serving", model_output: str = "logits"):
        if model_output not in MODEL_OUTPUTS:
            raise ValueError(f"model_output={model_output!r}: say what the model returns, one of "
                             f"{list(MODEL_OUTPUTS)} (a binary classifier's logits or probabilities, or other values).")
        super().__init__(name=name)
        self._model_output = model_output
        artifact, plan = load_for_serving(artifact_dir)  # its vocabulary files checked against the manifest
        self._spec = artifact.spec
        self.mapping = RawFeatureMapping(plan, value_kinds=artifact.manifest.value_kinds)
        used = sorted({f.table for f in artifact.spec.categorical})
        missing = sorted(set(used) - set(tables))
        if missing:
            raise ValueError(f"tables {missing} of the artifact's spec are not among the embedding's tables "
                             f"{sorted(tables)}.")
        self._stacked = _StackedTables(artifact.spec, tables, used)
        self.tables = {f"dim{d}": v for d, v in self._stacked.variables.items()}  # tracked: saved with the model
        self._model = _Untracked(model)
        self._model_inputs = model_inputs or _default_model_inputs
        # Without autograph: the functions have no Python control flow over tensors (conversion costs seconds).
        # Untracked: the SavedModel holds their signatures' concrete functions only (saving a tf.function traces
        # it again).
        examples = [tf.TensorSpec([None], tf.string, "examples")]
        self._functions = _Untracked({
            "examples": tf.function(self._examples, input_signature=examples, autograph=False),
            "examples_any_kind": tf.function(self._examples_any_kind, input_signature=examples, autograph=False),
            "raw": tf.function(self._raw, input_signature=[
                {c: tf.TensorSpec([None], tf.string, c) for c in self.mapping.columns}], autograph=False)})

    @property
    def model(self) -> Any:
        return self._model.value

    def examples(self, examples: Any) -> Dict[str, tf.Tensor]:
        """`serving_default`: serialized tf.train.Examples, each column parsed as the kind the training data held
        (`tpu_embed.serving.examples`)."""
        return self._functions.value["examples"](examples)

    def examples_any_kind(self, examples: Any) -> Dict[str, tf.Tensor]:
        """`examples_any_kind`: serialized tf.train.Examples, any value kind per key."""
        return self._functions.value["examples_any_kind"](examples)

    def raw(self, raw: Mapping[str, Any]) -> Dict[str, tf.Tensor]:
        """`raw`: one [batch] string tensor per column."""
        return self._functions.value["raw"](raw)

    def signatures(self) -> Dict[str, Any]:
        """{name: concrete function} of the SavedModel's signatures, traced. The model's variables (made by its
        first call) are then held as `model_variables` and saved, not the model: a Keras model saved as an object
        traces every layer's call again for its own restore (seconds), which the signatures do not need. A model
        without `variables` is held as it is."""
        functions = self._functions.value
        out = {"serving_default": functions["examples"].get_concrete_function(),
               "examples_any_kind": functions["examples_any_kind"].get_concrete_function(),
               "raw": functions["raw"].get_concrete_function()}
        variables = getattr(self.model, "variables", None)
        if variables is not None:
            self.model_variables = list(variables)
        else:
            self.model_object = self.model
        return out

    def activations(self, mapped: Mapped) -> Dict[str, tf.Tensor]:
        """{feature: [batch, dim] (a sequence feature's [batch, sequence_length, dim])} of a `Mapped` batch."""
        return _activations(self._spec, mapped, self._stacked)

    def predict(self, mapped: Mapped) -> Dict[str, tf.Tensor]:
        view = _MappedView(mapped)
        predictions = tf.cast(self.model(self._model_inputs(view, self.activations(mapped))), tf.float32)
        out = {"predictions": predictions, "valid": mapped.valid}
        if self._model_output == "logits":
            out.update(logits=tf.identity(predictions), probabilities=tf.math.sigmoid(predictions))
        elif self._model_output == "probabilities":
            p = tf.clip_by_value(predictions, _P_CLIP, 1.0 - _P_CLIP)
            out.update(logits=tf.math.log(p) - tf.math.log1p(-p), probabilities=tf.identity(predictions))
        return out

    def _examples(self, examples):
        return self.predict(self.mapping.map_examples_stacked(examples))

    def _examples_any_kind(self, examples):
        return self.predict(self.mapping.map_examples_stacked(examples, any_kind=True))

    def _raw(self, raw):
        return self.predict(self.mapping.map_raw_stacked(raw))


def export_saved_model(artifact: str, embedding: Any, model: Any, path: str, *,
                       model_inputs: Optional[Callable[[Mapping[str, Any], Mapping[str, tf.Tensor]], Any]] = None,
                       model_output: str = "logits") -> str:
    """Write one SavedModel at `path` mapping raw features as the shards did and predicting with `model`.

    Args:
      artifact: the artifact directory the model was trained from.
      embedding: a `tpu_embed.HostEmbedding` (its `embedding_tables`; pending pipelined updates are applied
        first), or {table name: [rows, dim] table}.
      model: the dense model: `model(model_inputs(mapped, activations))` -> [batch] predictions.
      path: where to write the SavedModel (local or an object store TensorFlow can write).
      model_inputs: see `ServingModel`.
      model_output: what `model` returns: "logits" (default), "probabilities" or "values" (see `ServingModel`):
        both signatures return `predictions` and `valid`, and for the first two `logits` and `probabilities`.

    Returns `path`. The vocabulary files are copied in as assets: the SavedModel needs neither the artifact
    nor tpu_embed to load and run (`tf.saved_model.load`, `saved_model_cli run`, TensorFlow Serving). They are
    checked against the manifest's sizes and sha256 first, as training checks them: a damaged one raises
    `tpu_embed.artifact.verify.ArtifactDamagedError` and nothing is written.
    """
    if hasattr(embedding, "embedding_tables"):
        if hasattr(embedding, "flush"):
            embedding.flush()  # a pending pipelined update belongs to the trained tables
        tables = embedding.embedding_tables
    else:
        tables = dict(embedding)
    module = ServingModel(artifact, tables, model, model_inputs, model_output=model_output)
    tf.saved_model.save(module, path, signatures=module.signatures())
    return path
