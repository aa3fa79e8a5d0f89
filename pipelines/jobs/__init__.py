"""The Beam pipelines behind `tpu-embed vocab | profile | shard | run`, one module per stage.

Composite transforms (each testable alone with TestPipeline + assert_that):

    read_examples.ReadExamples            files -> ParsedChunk, + dead letters, + counters
    compute_vocabulary.ComputeVocabulary  ParsedChunk -> vocabulary files (combine or tft engine)
    map_to_ids.MapToIds                   ParsedChunk -> ((file, chunk), ExampleBlock) through the vocabularies
    global_batches.FormGlobalBatches      keyed blocks -> (step, global batch), ordered by (file, record)
    build_shards.BuildShards              (step, batch) -> shard files (+ the partial profiles)
    collect_profile.CollectProfile        partial profiles' files (one per BuildShards bundle) -> profile files
    dead_letters.WriteDeadLetters         dead letters -> dead_letter/<input file>.jsonl
    manifest_writer.write_manifest        manifest.json, after every other output

`vocab_job.build_vocab_pipeline` / `shard_job.build_shard_pipeline` wire them for a `job_config.JobConfig`
(the user's options) and what the runner decided for that pass (`pass_plan.VocabPass`, `pass_plan.ShardPass`);
`shard_job.build_read_pipeline`: the shard job's first pass where no vocabulary job recorded its read.
Shared by the stages: `counters` (Beam counters), `tagged` (one output per step), `coders` (large elements).
The work itself is Beam-free, in `pipelines.read`, `pipelines.mapping` and `pipelines.sharding`.
"""

from pipelines.jobs.job_config import JobConfig
from pipelines.jobs.pass_plan import ShardPass, VocabPass
from pipelines.jobs.shard_job import build_read_pipeline, build_shard_pipeline
from pipelines.jobs.vocab_job import build_vocab_pipeline

__all__ = ["JobConfig", "ShardPass", "VocabPass", "build_read_pipeline", "build_shard_pipeline",
           "build_vocab_pipeline"]
