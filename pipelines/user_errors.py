"""What the CLI prints for an error: one line, and the `--debug` hint only for an unexpected one; its exit code.

    describe(e, output) -> Described(line, expected)      exit_code(e) -> USAGE (2) | FAILED (1)

Exit codes, the same in every command (docs/reference/cli.md, "Errors and exit codes"):

* 0 (`OK`): done.
* 1 (`FAILED`): the command was called right but could not do it: bad data (`--strict`, or no valid record),
  a missing, damaged or unfinished artifact or checkpoint, artifacts that do not fit together, an output
  that cannot be used (it holds an artifact, another run writes it, it is not writable), an error of the
  environment, a failed job, an unexpected error.
* 2 (`USAGE`): how the command was called is wrong: an unknown or misspelled flag, a bad flag value, a bad
  spec (an unknown key, a wrong value, invalid YAML, no such spec file), as argparse exits for its own
  errors. `CALL_ERRORS` are these.
* 130 (`INTERRUPTED`): Ctrl-C.

A *user error* is one whose message already says what is wrong and what to do: a bad spec or flag, bad
data, a damaged or missing artifact, an output that cannot be used (`USER_ERRORS`). Its message is the
line. An *OS error* of the environment (no space, a quota, a file size limit, permission denied, a
read-only file system, a file where a directory should be) becomes a line naming the path, the job step
and the fix (`os_error_line`). Anything else is unexpected: its type and first line, and the hint that
`--debug` shows the traceback.

Beam hands a worker's error back in several forms, all handled here:

* the in-process runner raises `RuntimeError("OSError: [Errno 28] No space left on device [while running
  'Shards/Build0/BuildStep']")` with the original exception as its `__context__`;
* worker processes (DirectRunner multi_processing, portable runners) raise a `RuntimeError` whose text is
  the worker's traceback, ending in `RuntimeError: <module.Type>: <message> [while running '<step>']`;
* Dask re-raises the worker's own exception, without the step (`pipelines.runner` notes which job ran).
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
from typing import Iterator, List, Optional, Tuple

from tpu_embed.artifact import io as tio

DEBUG_HINT = "(run with --debug for the traceback)"


OK, FAILED, USAGE, INTERRUPTED = 0, 1, 2, 130


class UserError(ValueError):
    """A mistake in how a command was called: printed as one line (exit code 2)."""


# Errors whose message names what is wrong and the fix. Matched by name: Beam's workers return them as text.
USER_ERRORS = ("OutputError", "DiskFullError", "ArtifactDamagedError", "ArtifactUnfinishedError", "StrictModeError",
               "DataError", "PolicyError", "LimitExceededError", "FileNotFoundError", "SpecError", "ManifestError",
               "ManifestNotFoundError", "UserError", "DemoError", "MissingProfileError",
               "CorruptProfileError", "SchemaVersionError", "ProfileError", "LineageError", "TransformOutputError",
               "RemapError", "BundleError")
CALL_ERRORS = ("SpecError", "UserError")  # how the command was called: exit code USAGE (argparse's)

# errno: (what went wrong, with {} for the path; what to do)
_OS_ERRORS = {
    errno.ENOSPC: ("no space left on device writing {}", "free space there"),
    errno.EDQUOT: ("disk quota exceeded writing {}", "free space or raise the quota"),
    errno.EFBIG: ("file size limit exceeded writing {}", "a smaller --steps-per-file (smaller shard files), or a "
                  "higher limit (`ulimit -f`; the file system's largest file)"),
    errno.EACCES: ("permission denied on {}", "give the user running the job access to it"),
    errno.EPERM: ("operation not permitted on {}", "give the user running the job access to it"),
    errno.EROFS: ("read-only file system: cannot write {}", "remount it read-write"),
    errno.ENOTDIR: ("not a directory: a part of {} is a file", "move that file away"),
}
OS_ERRNOS = tuple(_OS_ERRORS)

_STEP = re.compile(r" ?\[while running '([^']+)'\]")
# `Type: [Errno N] strerror: 'filename'` as Python prints an OSError (a second filename after ' -> ').
_OS_TEXT = re.compile(r"(?:^|[\s.:])(\w*(?:Error|Exception)): \[Errno (\d+)\] ([^\n\[]*?)"
                      r"(?:: '([^'\n]*)'(?: -> '[^'\n]*')?)?(?= \[while running|\n|$)")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)\b")
_JOB_NOTE = "tpu-embed: failed in the "
_DISK_FULL_PATH = re.compile(r"writing (\S+) failed after")  # tpu_embed.artifact.io.DiskFullError's message


@dataclasses.dataclass(frozen=True)
class Described:
    line: str
    expected: bool  # a user or OS error: the line says it all, no --debug hint


def exit_code(e: BaseException) -> int:
    """USAGE for a mistake in how the command was called (`CALL_ERRORS`), FAILED for any other error."""
    return USAGE if type(e).__name__ in CALL_ERRORS else FAILED


def describe(e: BaseException, output: Optional[str] = None) -> Described:
    """The one line for `e`; `output` is the command's --output (named when an OS error has no path)."""
    chain = list(_chain(e))
    text = "\n".join([str(x) for x in chain] + [n for x in chain for n in getattr(x, "__notes__", ())])
    step = _step(text)
    for x in chain:
        if isinstance(x, OSError) and x.errno in OS_ERRNOS:
            return Described(os_error_line(x.errno, _os_path(x), step, output), True)
        if type(x).__name__ in USER_ERRORS:
            return Described(_one_line(_STEP.sub("", str(x))), True)
    # In a worker's traceback text the error raised last is the one that ended the job.
    at, message = _user_error_in_text(text)
    m = _os_error_in_text(text)
    if m is not None and m.start() > at:
        return Described(os_error_line(int(m.group(2)), _text_path(m), step, output), True)
    if message is not None:
        return Described(message, True)
    return Described(_one_line(_unexpected_line(e)), False)


def os_error_line(code: int, path: Optional[str], step: Optional[str], output: Optional[str]) -> str:
    """'<what went wrong> <path> (in <step>). Fix: <what to do>.' for an OS error of `OS_ERRNOS`; a path
    under `output` (or none known: the jobs write under --output) adds "or choose another --output"."""
    inside = path is None or output is None or _inside(path, output)
    where = path if path is not None else (f"under --output {output}" if output else "the output")
    what, fix = _OS_ERRORS.get(code, (os.strerror(code).lower() + ": {}", "check that path"))
    at = f" (in {step})" if step else ""
    other = ", or choose another --output; then run again with --overwrite" if inside else ""
    return f"{what.format(where)}{at}. Fix: {fix}{other}."


def _chain(e: Optional[BaseException]) -> Iterator[BaseException]:
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def job_note(job: str) -> str:
    """The note `pipelines.runner` adds to a job's failure: where Dask re-raises it, the only hint of where."""
    return f"{_JOB_NOTE}{job} job"


def _step(text: str) -> Optional[str]:
    """'job step <Beam's label>' of the step that failed, else 'the <name> job' from `job_note`, else None."""
    m = _STEP.search(text)
    if m:
        return f"job step {m.group(1)}"
    m = re.search("^" + re.escape(_JOB_NOTE) + r"(\w+) job$", text, re.MULTILINE)
    return f"the {m.group(1)} job" if m else None


def _os_path(e: OSError) -> Optional[str]:
    if e.filename is not None:
        return os.fsdecode(e.filename)
    m = _DISK_FULL_PATH.search(str(e.strerror or ""))
    return m.group(1) if m else None


def _text_path(m: re.Match) -> Optional[str]:
    if m.group(4) is not None:
        return m.group(4)
    found = _DISK_FULL_PATH.search(m.group(3))
    return found.group(1) if found else None


def _user_error_in_text(text: str) -> Tuple[int, Optional[str]]:
    """(where, message) of the last user error named in a worker's traceback text (the type name left out);
    (-1, None) if none is (a DiskFullError is an OS error: `os_error_line`)."""
    best: Tuple[int, str] = (-1, "")
    for name in USER_ERRORS:
        i = text.rfind(name + ":")
        if i > best[0] and (i == 0 or not text[i - 1].isalnum()):
            best = (i, name)
    i, name = best
    if i < 0 or name == "DiskFullError":
        return -1, None
    return i, _one_line(_STEP.sub("", text[i + len(name) + 1:].split("\n")[0]))


def _os_error_in_text(text: str) -> Optional[re.Match]:
    found: List[re.Match] = [m for m in _OS_TEXT.finditer(text) if int(m.group(2)) in OS_ERRNOS]
    return found[-1] if found else None


def _inside(path: str, output: str) -> bool:
    return tio.relpath(path, output) is not None


def _unexpected_line(e: BaseException) -> str:
    """`Type: first line of the message`; for a worker's traceback text, its last `Type: message` line."""
    lines = str(e).strip().splitlines() or [""]
    if lines[0].startswith("Traceback (most recent call last)"):
        errors = [x for x in lines if _EXCEPTION_LINE.match(x)]
        if errors:
            return errors[-1]
    return f"{type(e).__name__}: {lines[0]}".rstrip(": ")


def _one_line(msg: str) -> str:
    return " ".join(msg.split())
