"""The jobs run end to end for the tests of the lower layers (tpu_embed, profiles): real artifacts built by
`tpu-embed run`'s jobs, and the command line, without those tests importing `pipelines`' modules themselves.

Only this module (and the other helpers here) reaches into `pipelines` on their behalf, so a change of the jobs'
configuration or entry points is made here once. `pipelines` is imported when a job runs: Beam is not loaded by
a test module that only imports this one.
"""

from __future__ import annotations

from typing import Sequence

from pipelines.read.records import DataError

__all__ = ["DataError", "cli", "run", "run_vocabulary"]


def run(spec, output: str, beam_args: Sequence[str] = (), **options) -> str:
    """Both jobs (vocabularies, then shards and profile: `tpu-embed run`) on `spec` into `output`; `options` are the
    job configuration's other fields. Returns `output`."""
    from pipelines import runner
    from pipelines.jobs import JobConfig
    runner.run_all(JobConfig(spec=spec, output=output, **options), list(beam_args))
    return output


def run_vocabulary(spec, output: str, **options) -> str:
    """The vocabulary job alone (an artifact without shards). Returns `output`."""
    from pipelines import runner
    from pipelines.jobs import JobConfig
    runner.run_vocab(JobConfig(spec=spec, output=output, **options))
    return output


def cli(argv: Sequence[str]) -> int:
    """`tpu-embed ARGV` in this process; its exit code."""
    from pipelines.cli import main
    return main(list(argv))
