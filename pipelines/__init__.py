"""pipelines: the offline Beam jobs of tpu_embed (vocabularies, lookup statistics, CSR shards).

Every job is a thin composite `beam.PTransform` over Beam-free numpy / Arrow code:

* `pipelines.read`     — input files -> parsed chunks: splits, the CSV / Parquet / TFRecord readers, the parse,
                         the read kept for `run`'s second job
* `pipelines.mapping`  — exact frequency vocabularies, and tokens -> ids through them
* `pipelines.sharding` — global batches, per-chip SparseCore CSR records, their limits, shard files from runs
* `pipelines.jobs`     — the Beam transforms, one module per stage, and the pipelines behind
                         `tpu-embed vocab | profile | shard | run`
* `pipelines.runner`   — Beam options (local runner pinned, Dask), running the jobs, the outcome checked
* `pipelines.cli`      — the `tpu-embed` command line, a module per subcommand with its parser and its output
                         (`pipelines.flags`: mistyped flags refused before Beam)
* `pipelines.output`   — the output directory: checked before a job, written atomically, swept after
* `pipelines.tft_output_writer` — the artifact's tf.Transform output, written beside the jobs by `run`
* `pipelines.paths`, `pipelines.user_errors` — local paths made absolute for workers; one-line errors
* `pipelines.token_index` — the token hash tables (native): dictionary encoding, counting, lookups
* `pipelines.background`, `pipelines.child_process`, `pipelines.profile_worker` — a worker's threads and its
  child process (`pipelines.child_pipe`)
* `pipelines.process_memory` — glibc's malloc tuned while a job runs in this process, then set back
* `pipelines.dask_compat` — work-arounds for Beam 2.77's DaskRunner
* `pipelines.demo`, `pipelines.demo_data` — `tpu-embed demo`: synthetic data to a trained model
* `pipelines.progress` — progress bars (TensorFlow start-up noise is kept off the terminal by `tpu_embed.core.quiet`)

Dependencies point one way: pipelines -> profiles -> tpu_embed.

Nothing is imported here: the conformance oracles and the benchmarks' helpers import `pipelines.child_pipe`
(standard library alone) in virtual environments without Beam.
"""
