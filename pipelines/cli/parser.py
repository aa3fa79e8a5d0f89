"""The `tpu-embed` parser: the top-level flags and help, and each subcommand's parser from its module."""

from __future__ import annotations

import argparse

from pipelines.cli import (
    demo_command,
    inspect_command,
    job_commands,
    plan_report,
    remap_command,
    transform_output_command,
)
from pipelines.cli.help_text import COMMANDS
from pipelines.flags import NoAbbrevParser

# The top of `tpu-embed --help`.
DESCRIPTION = """`tpu-embed`: vocabularies, lookup statistics and SparseCore CSR shards from one spec.

    tpu-embed run --spec SPEC --output DIR [--input PATTERN] [Beam options...]

Unknown flags are Beam pipeline options (--runner, --direct_num_workers,
--project, --region, --temp_location, --setup_file, --flink_master, ...).
Without --runner the jobs run in this process (DirectRunner, in_memory; with
--direct_num_workers=N > 1, multi_processing).
"""

EPILOG = """\
examples:
  tpu-embed run --spec examples/criteo/spec.yaml --output build/criteo
  tpu-embed run --spec examples/criteo/spec.yaml --output build/criteo \\
      --direct_num_workers=2 --direct_running_mode=multi_processing
  tpu-embed vocab --spec SPEC --output DIR            # vocabularies only
  tpu-embed run --spec SPEC --output day2 --base day1  # vocabulary modes append / frozen: day1's ids kept
  tpu-embed shard --spec SPEC --output DIR --plan plan.json --tail pad
  tpu-embed profile --spec SPEC --output DIR          # lookup statistics only
  tpu-embed plan --profiles DIR/profiles --output plan.json
  tpu-embed inspect DIR
  tpu-embed remap --from day1 --to day2 --checkpoint ckpt/day1 --output ckpt/day2/ckpt-0
  tpu-embed run --spec SPEC --output gs://bucket/out --input 'gs://bucket/data/*.csv' \\
      --runner=DataflowRunner --project=P --region=R --temp_location=gs://bucket/tmp \\
      --setup_file=./setup.py
  tpu-embed run --spec SPEC --output DIR --runner dask --dask-workers 2   # a local Dask cluster
  tpu-embed run --spec SPEC --output DIR --runner dask --dask_client_address tcp://host:8786
Any flag not listed above is passed to Beam's PipelineOptions. See docs/reference/cli.md.
"""


def _wide_names(prog: str) -> argparse.HelpFormatter:
    """The top-level help, with room for the longest command name (`transform-output`, indented by 4) and its
    line on one line: argparse sizes the name column by the options, at indent 2."""
    formatter = argparse.RawDescriptionHelpFormatter(prog)
    formatter._action_max_length = 4 + len(max(COMMANDS, key=len)) + 2  # noqa: SLF001 - argparse's column width
    return formatter


def build_parser() -> argparse.ArgumentParser:
    parser = NoAbbrevParser(  # `--str` is not `--strict`; unknown flags: check_pass_through
        prog="tpu-embed", description=DESCRIPTION,
        formatter_class=_wide_names, epilog=EPILOG)
    import tpu_embed  # already imported (pipelines.user_errors); its version, written once
    parser.add_argument("--version", action="version", version=f"%(prog)s {tpu_embed.__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="Beam's INFO logs")
    parser.add_argument("--debug", action="store_true",
                        help="show Python tracebacks and TensorFlow's start-up logs (errors are one line otherwise)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    job_commands.add_parsers(sub)
    inspect_command.add_parser(sub)
    demo_command.add_parser(sub)
    remap_command.add_parser(sub)
    transform_output_command.add_parser(sub)
    plan_report.add_commands(sub, spec_loader=plan_report.spec_model)
    return parser
