"""Blocks of examples -> training steps -> per-chip SparseCore CSR records -> shard files (Beam-free).

* `batches`        — `ExampleBlock`s, deterministic global batches (in order or shuffled), per host / chip
* `step_records`   — one step -> per-host records of per-chip CSR (`build_step`), in the shard format
                     `tpu_embed.artifact.shard_format_choice` decides
* `limits`         — the SparseCore limits the shards are packed with (plan, spec, TF's defaults, unbounded)
* `planned_limits` — limits planned from the same pass's profile when the spec pins none
* `runs`           — records streamed to runs where they are built, merged or moved into shard files
"""
