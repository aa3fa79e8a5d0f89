"""Warm start across vocabularies: a checkpoint trained on artifact A's ids, remapped onto artifact B's ids.

    report = tpu_embed.remap("build/day1", "build/day2", "ckpt/day1/ckpt-6", "ckpt/day2-warm/ckpt-0")
    print(report.summary())
    tf.train.Checkpoint(embedding=HostEmbedding.from_artifact("build/day2")).restore("ckpt/day2-warm/ckpt-0")

Every table's rows *and* its optimizer slots (Adagrad's accumulators, Adam's momenta and velocities,
FTRL's accumulators and linears) move to B's ids: a token in both vocabularies keeps its trained row,
a new token starts from the table's initializer and the slots' initial values (B's optimizer), a
dropped token goes away, the OOV buckets keep their rows, identity and hashing tables are copied as
they are, and a table shared by several features is moved once.  Every other variable of the
checkpoint (the dense model, its optimizer, counters) is copied byte for byte, so the output restores
into the same objects built on artifact B (`tf.train.Checkpoint(...).restore(output)`).

New rows' initial values.  Without `initializers`, a new row takes TF's `TableConfig` default (a
truncated normal, stddev 1/sqrt(dim)) drawn from a generator seeded by *artifact B's fingerprint and
the table's name* (`artifact_seed`: a sha256 over B's spec fingerprint, vocabulary sizes and the path
and sha256 of every vocabulary and token-count file its manifest lists).  So a re-run of the same
remap writes the same bytes, while two days' remaps (other vocabularies) draw other values: one
fixed seed would give the first new rows of every day's remap the same values in the same order.  The
fingerprint covers what B's row ids mean and nothing else: re-sharding B, or rewriting its manifest
for another reason (a transform output added), does not change it.  An explicit `seed=`
(`tpu-embed remap --seed N`) replaces the fingerprint: the values then follow that seed and the
table alone, the same for every target artifact.

The checkpoint may be a `HostEmbedding`'s or a per-table `TPUEmbeddingForServing` /
`TPUEmbeddingV2` one (the form TF reshards onto SparseCores on restore); tables move in row chunks
through spill files, so memory follows `chunk_rows`, not the table.  The parts:
`tpu_embed.training.remap.warm_start` (`remap` itself, the checkpoint's path, the default seed),
`tpu_embed.training.remap.row_mapping` (which A row every B row takes; numpy, no checkpoint),
`tpu_embed.training.remap.checkpoint` (finding the variables, moving them),
`tpu_embed.training.remap.bundle` (TF's checkpoint files, read and written without TensorFlow),
`tpu_embed.training.remap.remap_report` (what a remap did).
"""

from tpu_embed.training.remap.remap_report import RemapReport, TableReport
from tpu_embed.training.remap.row_mapping import RemapError, RowMapping, row_mappings
from tpu_embed.training.remap.warm_start import artifact_seed, remap, resolve_checkpoint

__all__ = ["remap", "RemapReport", "TableReport", "RemapError", "RowMapping", "row_mappings", "resolve_checkpoint",
           "artifact_seed"]
