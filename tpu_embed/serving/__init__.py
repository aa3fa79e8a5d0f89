"""Serving on raw features: the shards' raw -> id mapping in TensorFlow ops, and one SavedModel to export.

`tpu_embed.serving.mapping` (`RawFeatureMapping`, `MappingPlan`, `map_raw`, `parse_examples`,
`vocabulary_tables`): raw tensors or serialized tf.train.Examples -> the ids, weights and dense values the
shards hold, over the columns stacked per kind (`tpu_embed.serving.columns`); `tpu_embed.serving.examples`
parses serialized Examples as the kinds the training data held, or as any kind. `tpu_embed.serving.export`
(`export_saved_model`, `ServingModel`, `embedding_lookup`): one SavedModel from serialized tf.train.Examples
(or raw CSV-like strings) to predictions.
`tpu_embed.serving.tft_output` (`write_transform_output`): the mapping as tf.Transform output, the
directory `tft.TFTransformOutput` reads. `tpu_embed.serving.number_text`: the offline jobs' number rules as
TensorFlow ops.
"""

from tpu_embed.core.lazy import lazy_exports

_EXPORTS = {name: "tpu_embed.serving.mapping" for name in (
    "Column", "DensePlan", "FeaturePlan", "MappingPlan", "RawFeatureMapping", "map_raw", "parse_examples",
    "vocabulary_tables")}
_EXPORTS.update({name: "tpu_embed.serving.export" for name in ("ServingModel", "embedding_lookup",
                                                               "export_saved_model")})
_EXPORTS.update({name: "tpu_embed.serving.tft_output" for name in ("write_transform_output",)})

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)  # TensorFlow is imported on first use
