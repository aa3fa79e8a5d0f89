"""`tpu-embed`: the command line, a module per subcommand (or group) holding its parser and what it prints.

* `entry`       — `main`: parse, run, one line and an exit code per error
* `parser`      — `build_parser`: the top-level flags and help; `help_text`: the command list
* `job_commands` — vocab, shard, profile, run; `artifact_summary`: what they and `inspect` print
* `inspect_command`, `demo_command`, `remap_command`, `transform_output_command`
* `plan_report` — plan and report (the work: `profiles.commands`)
"""

from pipelines.cli.artifact_summary import summary
from pipelines.cli.entry import main
from pipelines.cli.parser import build_parser

__all__ = ["build_parser", "main", "summary"]
