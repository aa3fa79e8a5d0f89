"""Local paths mean the same file on every worker: made absolute in the driver before a pipeline is built.

A worker resolves a relative path against its own working directory, which need not be the driver's (a Dask
cluster started elsewhere, an SDK worker pool): `--output out` would be written there, and the driver would
look for it here. `for_workers(cfg, runner)` returns the job's config with the output, the vocabulary
artifact, the plan, the profile directory and the spec's base directory (relative input patterns) absolute,
and refuses, in one line, a runner whose workers never run on this machine (`REMOTE_RUNNERS`) given a path
they would read or write on this machine's disk.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, List, Optional, Tuple, overload

from pipelines.user_errors import UserError
from tpu_embed.artifact import io as tio

if TYPE_CHECKING:
    from pipelines.jobs.job_config import JobConfig

# Runners whose workers run on other machines (Dataflow's VMs): local paths cannot reach them. Other runners
# (Dask, Flink, Spark, portable) may have workers here, so their local paths are allowed, made absolute.
REMOTE_RUNNERS = ("dataflowrunner", "testdataflowrunner", "dataflow")


@overload
def absolute(path: str) -> str: ...
@overload
def absolute(path: Optional[str]) -> Optional[str]: ...


def absolute(path: Optional[str]) -> Optional[str]:
    """A local path made absolute against this process's working directory; URLs and None as they are."""
    if path is None or tio.is_url(path):
        return path
    path = os.fspath(path)
    return os.path.abspath(path[len("file://"):] if path.startswith("file://") else path)


def for_workers(cfg: JobConfig, runner: str = "") -> JobConfig:
    """`cfg` with every local path absolute; `UserError` where `runner` (the --runner option) is a remote one and
    a path is local."""
    spec = cfg.spec
    if absolute(spec.base_dir) != spec.base_dir:
        spec = spec.with_inputs(spec.inputs.patterns, base_dir=absolute(spec.base_dir))
    output = absolute(cfg.output)
    cfg = dataclasses.replace(cfg, spec=spec, output=output, vocab_dir=absolute(cfg.vocab_dir),
                              plan=absolute(cfg.plan), base=absolute(cfg.base))
    cfg = dataclasses.replace(cfg, profile_dir=absolute(cfg.resolved_profile_dir()))
    _refuse_local_paths_on_remote_workers(cfg, runner)
    return cfg


def _local_paths(cfg: JobConfig) -> List[Tuple[str, str]]:
    """(what, path) of each location the workers read or write that is on this machine's disk."""
    named = [("--output", cfg.output), ("--vocab", cfg.vocab_dir), ("--profile-dir", cfg.profile_dir),
             ("--base", cfg.base or cfg.spec.base_artifact())]
    named += [("the input pattern", p) for p in cfg.spec.input_patterns()]
    return [(what, p) for what, p in named if p is not None and not tio.is_url(p)]


def _refuse_local_paths_on_remote_workers(cfg: JobConfig, runner: str) -> None:
    if runner.rsplit(".", 1)[-1].lower() not in REMOTE_RUNNERS:
        return
    local = _local_paths(cfg)
    if local:
        what, path = local[0]
        raise UserError(f"{what} {path} is a local path, but --runner={runner} runs the jobs on workers that "
                        "cannot see this machine's files. Fix: give object-store paths (gs://...) for --output, "
                        "the inputs (--input / inputs.patterns), --vocab and --profile-dir, or run with a local "
                        "runner.")
