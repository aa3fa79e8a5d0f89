"""Progress bars for long work (tqdm, on stderr, silent when stderr is not a terminal).

The readers call `advance(rows)` after every batch of records they read.  In a
process that opened a bar with `records(...)` (the CLI running the jobs on the
in-process DirectRunner) that moves the bar; anywhere else (Beam workers in
other processes, tests) it does nothing.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator, Optional

_lock = threading.Lock()
_bar = None


def enabled() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def bar(total: Optional[int] = None, desc: str = "", unit: str = "it", **kw):
    """A tqdm bar on stderr; disabled (no output at all) when stderr is not a terminal."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not enabled(), leave=False,
                dynamic_ncols=True, unit_scale=unit == "records", **kw)


@contextlib.contextmanager
def records(desc: str, total: Optional[int] = None) -> Iterator[object]:
    """Count the records the readers of this process read, under `desc`."""
    global _bar
    b = bar(total, desc, unit="records")
    with _lock:
        _bar = b
    try:
        yield b
    finally:
        with _lock:
            _bar = None
        b.close()


def advance(n: int) -> None:
    with _lock:
        if _bar is not None:
            _bar.update(int(n))
