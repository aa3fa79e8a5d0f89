"""pipelines: the offline Beam jobs of tpu_embed (vocabularies, lookup statistics, CSR shards).

Every job is a thin composite `beam.PTransform` over pure numpy / Arrow code:

* `pipelines.io`       — file listing, readers (CSV / TFRecord of tf.Example / Parquet) -> Arrow batches
* `pipelines.parse`    — Arrow batches -> labels, dense floats and per-feature tokens; dead letters
* `pipelines.vocab`    — exact frequency vocabularies (tensorflow-transform, or the same counts as a CombinePerKey)
* `pipelines.mapping`  — tokens -> ids through the vocabularies (OOV buckets, identity, hashing)
* `pipelines.batching` — deterministic global batches, split per host then per chip
* `pipelines.shard`    — per-chip SparseCore CSR (`tpu_embed.sparsecore.preprocess_with_layout`) -> shard files
* `pipelines.planned_limits` — limits planned from the same pass's profile when the spec pins none
* `pipelines.jobs`     — the composite transforms and pipelines behind `tpu-embed vocab | profile | shard | run`
                         (the profile: `profiles.ProfileCollector` wrapped as a CombineFn, at the shards' batching)
* `pipelines.runner`   — Beam options (local runner pinned, Dask), running the jobs, manifest last
* `pipelines.flags`    — refusing mistyped flags before they reach Beam
* `pipelines.dask_compat` — work-arounds for Beam 2.77's DaskRunner (docs/pipelines.md)
* `pipelines.demo`, `pipelines.demo_data` — `tpu-embed demo`: synthetic data to a trained model
* `pipelines.progress`, `pipelines.quiet` — progress bars; TensorFlow start-up noise off the terminal
* `pipelines.cli`      — the `tpu-embed` command line

Dependencies point one way: pipelines -> profiles -> tpu_embed.
"""
