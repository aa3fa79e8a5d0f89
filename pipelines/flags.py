"""Command-line flags: ours are never abbreviated, and an unknown `--flag` is refused with "did you mean".

`tpu-embed` passes the flags it does not know to Beam's `PipelineOptions`, which
warns "Discarding unparseable args" and goes on: left to it, a mistyped `--stirct`
would run without `--strict` and exit 0. `check_pass_through` accepts exactly the
flags some Beam `PipelineOptions` class (of the runners installed) defines, plus
ours that the runner layer consumes (`--dask_workers`), and refuses the rest.
"""

from __future__ import annotations

import argparse
import difflib
import functools
from typing import Iterable, List, Optional, Sequence

OUR_PASS_THROUGH = ("--dask_workers", "--dask-workers")


class NoAbbrevParser(argparse.ArgumentParser):
    """argparse without prefix matching (`--str` is not `--strict`), also for sub-commands."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


@functools.lru_cache(maxsize=1)
def beam_flags() -> frozenset:
    """Every option string of Beam's PipelineOptions classes (those of optional runners when importable)."""
    from apache_beam.options import pipeline_options as po
    for module in ("apache_beam.runners.dask.dask_runner", "apache_beam.options.value_provider"):
        try:
            __import__(module)
        except Exception:  # noqa: BLE001 - a runner that is not installed has no flags here
            pass
    parser = po._BeamArgumentParser(allow_abbrev=False)  # noqa: SLF001 - what get_all_options does
    seen: dict = {}

    def subclasses(cls):
        for c in cls.__subclasses__():
            yield c
            yield from subclasses(c)

    for cls in subclasses(po.PipelineOptions):
        seen.setdefault(str(cls), cls)
    for cls in seen.values():
        try:
            cls._add_argparse_args(parser)  # noqa: SLF001
        except argparse.ArgumentError:
            pass  # the same option defined by two classes
    return frozenset(s for s in parser._option_string_actions if s.startswith("--"))  # noqa: SLF001


def unknown_flags(args: Sequence[str]) -> List[str]:
    known = beam_flags()
    out = []
    for a in args:
        if not a.startswith("--") or a == "--":
            continue
        name = a.split("=", 1)[0]
        if name not in known and name not in OUR_PASS_THROUGH:
            out.append(name)
    return out


def check_pass_through(args: Sequence[str], ours: Iterable[str]) -> Optional[str]:
    """None, or the error message for the first flag neither ours nor Beam's."""
    bad = unknown_flags(args)
    if not bad:
        return None
    name = bad[0]
    ours = sorted(s for s in ours if s.startswith("--"))
    close = difflib.get_close_matches(name, ours, n=1, cutoff=0.6) or difflib.get_close_matches(
        name, sorted(beam_flags()) + list(OUR_PASS_THROUGH), n=1, cutoff=0.75)
    hint = f" Did you mean {close[0]}?" if close else ""
    return (f"unknown flag {name}: it is neither a tpu-embed flag nor a Beam pipeline option.{hint} "
            "(see --help; Beam's options: https://beam.apache.org/releases/pydoc/current/"
            "apache_beam.options.pipeline_options.html)")


def subcommand_flags(parser: argparse.ArgumentParser, command: str) -> List[str]:
    flags = list(parser._option_string_actions)  # noqa: SLF001
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:  # noqa: SLF001
            flags += list(action.choices[command]._option_string_actions)  # noqa: SLF001
    return flags
