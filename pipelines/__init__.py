"""pipelines: the offline Beam jobs of tpu_embed (vocabularies, lookup statistics, CSR shards).

Every job is a thin composite `beam.PTransform` over pure numpy / Arrow code:

* `pipelines.io`       — file listing, readers (CSV / TFRecord of tf.Example / Parquet) -> Arrow batches
* `pipelines.parse`    — Arrow batches -> labels, dense floats and per-feature tokens; dead letters
* `pipelines.vocab`    — exact frequency vocabularies (tensorflow-transform, or the same counts as a CombinePerKey)
* `pipelines.mapping`  — tokens -> ids through the vocabularies (OOV buckets, identity, hashing)
* `pipelines.batching` — deterministic global batches, split per host then per chip
* `pipelines.shard`    — per-chip SparseCore CSR (`tpu_embed.sparsecore.preprocess_with_layout`) -> shard files
* `pipelines.profile`  — lookup statistics (`profiles.ProfileCollector`) at the shards' batching
* `pipelines.jobs`     — the pipelines behind `tpu-embed vocab | profile | shard | run`
* `pipelines.cli`      — the `tpu-embed` command line

Dependencies point one way: pipelines -> profiles -> tpu_embed.
"""
