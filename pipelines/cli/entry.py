"""`tpu-embed`'s entry point: parse, run the command, and turn any error into one line and an exit code."""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional, Sequence

from pipelines import paths, user_errors
from pipelines.cli.parser import build_parser
from pipelines.flags import check_pass_through, subcommand_flags
from tpu_embed.core import quiet

# Beam is imported by the commands that run a job (pipelines.jobs, pipelines.runner, pipelines.demo), not here:
# it takes about a second, which `tpu-embed --help`, `plan`, `report` and `inspect` do not pay. The artifact
# readers (the pydantic manifest, ~0.1 s) and the output helpers are imported by the commands that use them,
# for the same reason: `--help` builds only the parser.


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]  # accepted anywhere on the line
    if not debug:
        quiet.install()  # before anything imports TensorFlow: no oneDNN / CUDA / cuInit lines
    else:
        quiet.uninstall()  # what `import tpu_embed` installed: --debug shows TensorFlow's own logs
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return user_errors.USAGE
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not (args.verbose or debug):
        # Beam logs a failing worker's traceback at ERROR before raising it; the error is shown once, below.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    takes_beam = args.command in ("vocab", "shard", "profile", "run", "demo")
    if beam_args and not takes_beam:
        parser.error(f"unrecognized arguments: {' '.join(beam_args)}")
    if beam_args:
        problem = check_pass_through(beam_args, subcommand_flags(parser, args.command))
        if problem:
            parser.error(problem)
    try:
        if _one_arg(args.func):
            return int(args.func(args) or 0)
        return int(args.func(args, beam_args) or 0)
    except BrokenPipeError:  # `tpu-embed inspect DIR | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("tpu-embed: interrupted", file=sys.stderr)
        return user_errors.INTERRUPTED
    except Exception as e:  # noqa: BLE001 - one clear line, never a traceback (unless --debug)
        if debug:
            raise
        output = getattr(args, "output", None)
        said = user_errors.describe(e, output=paths.absolute(output) if output else None)
        print(f"tpu-embed {args.command}: {said.line}", file=sys.stderr)
        if not said.expected:
            print(user_errors.DEBUG_HINT, file=sys.stderr)
        return user_errors.exit_code(e)


def _one_arg(func) -> bool:
    import inspect
    try:
        return len(inspect.signature(func).parameters) == 1
    except (TypeError, ValueError):
        return False
