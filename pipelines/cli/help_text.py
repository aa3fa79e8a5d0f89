"""The command list of `tpu-embed --help`, shared by every subcommand's parser."""

from __future__ import annotations

# Each command's line in `tpu-embed --help` (one line at 80 columns, the style of argparse's own "show this
# help message and exit"), and the first line of its own `--help`. plan and report: pipelines.cli.plan_report.
COMMANDS = {
    "vocab": "compute the vocabularies -> DIR/vocab/",
    "shard": "write the SparseCore CSR shards (and the profile)",
    "profile": "compute the lookup statistics only",
    "run": "vocab, then shards + profile: the main command",
    "inspect": "summarise an artifact, decode its first records",
    "demo": "raw data to a trained model in a few minutes",
    "remap": "move a checkpoint's rows to another artifact's ids",
    "transform-output": "write the raw -> id mapping as tf.Transform output",
}


def description(command: str, more: str = "") -> str:
    """A command's own `--help` text: its line from the command list as a sentence, then `more`."""
    line = COMMANDS[command]
    return line[0].upper() + line[1:] + "." + (f"\n\n{more}" if more else "")
