"""`tpu-embed demo`: raw data to a trained model in one command (a few minutes on 2 cores).

    1. data      a synthetic Criteo-like data set (pipelines/demo_data.py), TFRecord of tf.train.Example
    2. jobs      vocabularies (balanced ids: `partition: {ids: balanced}`), then shards + profile in one pass, then
                 the plan of that profile (local Beam)
    3. plan      per stacked table: limits against TF's defaults, memory, drops, load balance; and the balance of
                 frequency order against the balanced ids, the same steps counted both ways
    4. train     a DLRM (tpu_embed.training.dlrm) with HostEmbedding from the shards; held-out AUC
    5. serving   the model exported as one SavedModel (tpu_embed.serving.export_saved_model), which scores the
                 held-out rows' raw tf.train.Examples: its AUC against the shards' (skipped with serving=False)
    6. report    the profile report (HTML + PNG) and a summary

With `days=2` (`--days 2`) the data is two days of one lineage, every vocabulary `mode: append` under a
capacity: day 1 runs, trains and is checkpointed; day 2 runs with day 1 as its base, restores the checkpoint
as it is and trains on, beside a cold start of the same steps (held-out log loss and AUC of both); the warm
model is the one exported.

`run_demo(output, ...)` is the whole thing (`stages`);
`tpu-embed demo --output DIR [--examples N] [--days 1|2] [--no-serving]`. The model: `dlrm_training`; the
SavedModel's check: `serving_check`; the output directory: `output_dir`.

The output directory: the demo writes into an empty (or new) directory, or one an earlier demo wrote (its
`demo.json`, written first): then it replaces what a demo writes there (`DEMO_ENTRIES`: data/, spec.yaml,
the artifacts, checkpoints/, model/, report/, demo.json) and keeps every other file, so a second `make demo`
runs as the first. A directory with files and no `demo.json` is refused (nothing deleted). One demo at a
time per directory: it holds `LOCK` (flock, released when the process ends, killed or not); a second is
refused naming the first.
"""

from pipelines.demo.dlrm_training import Trained, TrainResult, auc, save_checkpoint, train_and_evaluate
from pipelines.demo.options import DemoConfig, DemoError
from pipelines.demo.output_dir import (
    ARTIFACT_DIR,
    CHECKPOINT_DIR,
    DATA_DIR,
    DEMO_ENTRIES,
    LOCK,
    MARKER,
    MODEL_DIR,
    REPORT_DIR,
    SPEC_FILE,
    holding,
    prepare_output,
)
from pipelines.demo.serving_check import ServingCheck, export_and_score, held_out_examples, held_out_records
from pipelines.demo.stages import command_as_typed, main, plan_lines, run_demo

__all__ = [
    "ARTIFACT_DIR", "CHECKPOINT_DIR", "DATA_DIR", "DEMO_ENTRIES", "LOCK", "MARKER", "MODEL_DIR", "REPORT_DIR",
    "SPEC_FILE", "DemoConfig", "DemoError", "ServingCheck", "TrainResult", "Trained", "auc", "command_as_typed",
    "export_and_score", "held_out_examples", "held_out_records", "holding", "main", "plan_lines", "prepare_output",
    "run_demo", "save_checkpoint", "train_and_evaluate",
]
