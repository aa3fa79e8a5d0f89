"""Length-prefixed pickles over pipes: the one protocol between a process and a helper process it starts.

A message is its pickle's length (8 bytes, little-endian), then the pickle. Users: the jobs' child processes
(`pipelines.child_process`), the conformance oracle (tests/conformance/oracle.py and oracle_server.py) and
the feeding benchmark's oracle (benchmarks/feed.py and feed_oracle.py).

    send(fh, msg) / receive(fh)    # one message each way; receive gives None once the other end closed
    message_stdout()               # a helper's stdout for messages alone (fd 1 then goes to stderr)
    serve(handle)                  # a helper's loop: READY, then each request answered by handle(request)
    Helper(argv, env, name)        # the other side: start the helper, then helper(request) -> its answer

Standard library only, and nothing else of this repository: the oracles run in their own virtual environments
(tensorflow-tpu, jax) without this project's dependencies and import this module with the repository root on
sys.path. `pipelines/__init__.py` imports nothing, so importing it here loads no Beam.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
from typing import IO, Any, BinaryIO, Callable, Mapping, Optional, Sequence

_LENGTH = struct.Struct("<Q")
READY = b"READY\n"  # a helper's first line: it has started and reads requests


def send(fh: IO[bytes], msg: Any) -> None:
    """Write one message and flush it."""
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    fh.write(_LENGTH.pack(len(data)))
    fh.write(data)
    fh.flush()


def receive(fh: IO[bytes]) -> Any:
    """The next message, or None when the other end closed (so a message is never None itself)."""
    head = fh.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    n, = _LENGTH.unpack(head)
    data = fh.read(n)
    if len(data) < n:
        return None
    return pickle.loads(data)


def message_stdout() -> BinaryIO:
    """This process's standard output as a binary stream for messages alone.

    File descriptor 1 and `sys.stdout` then go to stderr, so that a print, or a line a library writes from
    native code (TensorFlow's start-up logs), cannot corrupt a message."""
    real = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(real, "wb")


def serve(handle: Callable[[Any], Any], stdin: Optional[BinaryIO] = None,
          stdout: Optional[BinaryIO] = None) -> None:
    """A helper's main loop: READY, then for every request the answer of `handle(request)` (an exception as
    {"error": "<type>: <message>"}), until the other end closes stdin. `stdout`: `message_stdout()` unless given
    (take it first where the helper's set-up may print)."""
    stdin = sys.stdin.buffer if stdin is None else stdin
    stdout = message_stdout() if stdout is None else stdout
    stdout.write(READY)
    stdout.flush()
    while True:
        request = receive(stdin)
        if request is None:
            return
        try:
            answer = handle(request)
        except Exception as e:  # noqa: BLE001 - the error is the answer (the caller decides what it means)
            answer = {"error": f"{type(e).__name__}: {e}"}
        send(stdout, answer)


class Helper:
    """A helper process that runs `serve`: started by the constructor, then `helper(request)` -> its answer."""

    def __init__(self, argv: Sequence[str], env: Optional[Mapping[str, str]] = None, name: str = "helper"):
        self.name = name
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=None if env is None else dict(env))
        assert self.proc.stdin is not None and self.proc.stdout is not None  # both are pipes (PIPE above)
        self._requests: IO[bytes] = self.proc.stdin
        self._answers: IO[bytes] = self.proc.stdout
        line = self._answers.readline()
        if line != READY:
            raise RuntimeError(f"{name} failed to start: {line!r}")

    def __call__(self, request: Any) -> Any:
        send(self._requests, request)
        answer = receive(self._answers)
        if answer is None:
            raise RuntimeError(f"{self.name} died")
        return answer

    def close(self, timeout: float = 30) -> None:
        """End the helper: it returns at the end of its input."""
        if self.proc.poll() is None:
            self._requests.close()
            self.proc.wait(timeout=timeout)
