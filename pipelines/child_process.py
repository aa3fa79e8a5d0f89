"""Work of a worker run in a child process, beside the worker's own threads.

A Beam worker process runs one bundle at a time, and per-step work made of numpy calls holds the GIL between
them: in threads, the shard job's step builds, its mapping and numpy profile statistics take turns, and the
job used ~1.3 of 2 cores. A child process has a GIL of its own (`pipelines.profile_worker`, where the profile's
counting is the numpy fallback).

`Child` starts `python -m pipelines.child_process` (not multiprocessing: nothing of the parent's `__main__`
is imported again, and no fork of a process with threads), and runs functions there that talk to the
parent through the child's stdin and stdout (`pipelines.child_pipe`: length-prefixed pickles):

    child = Child()
    child.start("pipelines.profile_worker:serve", collector)   # the function runs in the child
    child.send(...); child.receive()                            # its messages, in order
    child.close()

A function `fn(receive, send, *args)` receives the parent's messages with `receive()` (None: the parent
closed) and answers with `send(msg)`; its return value is sent as ("return", value). Its exception is raised
in the parent by `receive()` (the same type where it pickles, with the child's traceback as its cause), and
the child then exits. If the child dies, `receive` and `send` raise `ChildProcessError` with its exit status.
If the parent dies, the child reads the end of its input and exits.

`wanted()` says whether a child may be used: TPU_EMBED_CHILD_PROCESS=1/0, else when this worker may use two or
more CPUs (TPU_EMBED_THREADS unset or >= 2: not under multi-process runners, which use the cores already).
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import traceback
from typing import Any

from pipelines import child_pipe

PIPE_BYTES = 1 << 20  # Linux's default /proc/sys/fs/pipe-max-size
ENV = "TPU_EMBED_CHILD_PROCESS"


def wanted() -> bool:
    env = os.environ.get(ENV)
    if env:
        return env != "0"
    # Imported here: the child runs this module as its main (`python -m`) and does not need numpy and the
    # CSR kernel at start (~0.1 s per child); only the parent asks.
    from tpu_embed.sparsecore.csr import native_threads
    return native_threads() >= 2


class RemoteTraceback(Exception):
    """The child's traceback, as the cause of the exception `Child.receive` raises."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self):
        return self.text


def _widen(fh) -> None:
    """Give a pipe PIPE_BYTES of buffer (Linux; else as it is): a step's ids (~2 MB) then cross in a few
    writes instead of ~30 of 64 KiB, each waking the other process."""
    try:
        import fcntl
        fcntl.fcntl(fh.fileno(), getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (ImportError, OSError):
        pass


class Child:
    """One child process; runs one function at a time (`start`), for as many functions as asked."""

    def __init__(self):
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `pipelines` is imported from
        path = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        # The child's numpy/native calls are per chunk or step; one thread each (as under multi-process runners).
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), TPU_EMBED_THREADS="1")
        self._proc = subprocess.Popen([sys.executable, "-m", "pipelines.child_process"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, env=env)
        for fh in (self._proc.stdin, self._proc.stdout):
            _widen(fh)

    def start(self, target: str, *args) -> None:
        """Run `target` ("module:function") with `args` in the child; its messages follow."""
        self.send(("run", target, args))

    def send(self, msg) -> None:
        try:
            child_pipe.send(self._proc.stdin, msg)  # type: ignore[arg-type]  # started with stdin=PIPE
        except (BrokenPipeError, OSError, ValueError):
            self.receive()  # raises the child's error, or that it exited
            raise ChildProcessError("the child process stopped reading its input") from None

    def receive(self) -> Any:
        """The child's next message; its function's exception raised here, or ChildProcessError if it died."""
        try:
            msg = child_pipe.receive(self._proc.stdout)  # type: ignore[arg-type]  # started with stdout=PIPE
        except (OSError, ValueError):
            msg = None
        if msg is None:
            raise ChildProcessError(f"the child process {self._proc.args[-1]} exited (status "  # type: ignore[index,str-bytes-safe]
                                    f"{self._proc.wait()})")
        if msg[0] == "error":
            _, exc, text = msg
            raise exc from RemoteTraceback(text)
        return msg

    def close(self) -> None:
        """End the child: it exits at the end of its input (or is killed if it does not)."""
        for fh in (self._proc.stdin, self._proc.stdout):
            try:
                fh.close()  # type: ignore[union-attr]  # both pipes
            except OSError:
                pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def kill(self) -> None:
        """End the child now (a failed bundle: what it was doing is not wanted)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self.close()


def _picklable(e: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - an exception whose class cannot travel: its type and message do
        return RuntimeError(f"{type(e).__name__}: {e}")


def main() -> int:
    stdin, stdout = sys.stdin.buffer, child_pipe.message_stdout()  # a print in the child cannot corrupt the messages

    closed = False  # the parent closed our input

    def receive():
        nonlocal closed
        msg = child_pipe.receive(stdin)
        closed = closed or msg is None
        return msg

    def send(msg) -> None:
        try:
            child_pipe.send(stdout, msg)
        except (BrokenPipeError, OSError):
            os._exit(0)  # the parent is gone (its job failed or ended): nobody to answer, nothing to print

    while True:
        msg = receive()
        if msg is None:
            return 0  # the parent closed its end
        _, target, args = msg
        try:
            module, _, name = target.partition(":")
            result = getattr(importlib.import_module(module), name)(receive, send, *args)
            if closed:
                return 0  # the parent closed its end while the function ran: no one to answer
            send(("return", result))
        except BaseException as e:  # noqa: BLE001 - every error goes back to the parent
            # ... and the child ends: the parent may still be sending to the function that failed.
            send(("error", _picklable(e), "".join(traceback.format_exception(e))))
            return 1


if __name__ == "__main__":
    sys.exit(main())
