"""pipelines.child_pipe: the length-prefixed pickle protocol of the child processes and the oracles."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pipelines import child_pipe
from tests.helpers import ROOT


def test_messages_round_trip_in_order_and_none_at_the_end():
    buf = io.BytesIO()
    msgs = [("step", np.arange(5), 3), {"op": "check"}, b"x" * 100_000, 0, ""]
    for m in msgs:
        child_pipe.send(buf, m)
    buf.seek(0)
    got = [child_pipe.receive(buf) for _ in msgs]
    assert got[0][0] == "step" and np.array_equal(got[0][1], np.arange(5)) and got[1:] == msgs[1:]
    assert child_pipe.receive(buf) is None  # the other end closed


def test_a_truncated_message_reads_as_the_end():
    buf = io.BytesIO()
    child_pipe.send(buf, list(range(100)))
    data = buf.getvalue()
    for cut in (3, 8, len(data) - 1):
        assert child_pipe.receive(io.BytesIO(data[:cut])) is None


def test_serve_answers_each_request_and_an_error_as_a_dict():
    requests = io.BytesIO()
    for r in ({"x": 2}, {"x": "a"}, {"x": 5}):
        child_pipe.send(requests, r)
    requests.seek(0)
    out = io.BytesIO()
    child_pipe.serve(lambda r: {"y": r["x"] * 2 + 1}, stdin=requests, stdout=out)
    out.seek(0)
    assert out.readline() == child_pipe.READY
    assert [child_pipe.receive(out) for _ in range(3)] == [
        {"y": 5}, {"error": 'TypeError: can only concatenate str (not "int") to str'}, {"y": 11}]
    assert child_pipe.receive(out) is None


HELPER = textwrap.dedent("""
    import os
    import sys
    sys.path.insert(0, sys.argv[1])
    from pipelines import child_pipe

    def handle(request):
        print("a print while answering")
        if request == "exit":
            sys.exit(3)
        ours = ("tpu_embed", "pipelines", "profiles")
        return {"echo": request, "modules": sorted(m for m in sys.modules if m.split(".")[0] in ours)}

    stdout = child_pipe.message_stdout()
    print("set-up chatter")  # to stderr: the helper took its stdout for messages
    os.write(1, b"native chatter\\n")  # file descriptor 1 too
    child_pipe.serve(handle, stdout=stdout)
""")


def test_a_helper_process_answers_and_imports_nothing_else_of_this_repository():
    """The oracles run it in a venv without this project's dependencies: the protocol imports the standard library
    alone (`pipelines/__init__.py` imports nothing), and prints in the helper never reach the messages."""
    helper = child_pipe.Helper([sys.executable, "-c", HELPER, ROOT], name="test helper")
    try:
        got = helper([1, "two"])
        assert got == {"echo": [1, "two"], "modules": ["pipelines", "pipelines.child_pipe"]}
        assert helper("again")["echo"] == "again"
        with pytest.raises(RuntimeError, match="test helper died"):
            helper("exit")
    finally:
        helper.close()


def test_a_helper_that_does_not_start_is_named():
    with pytest.raises(RuntimeError, match="broken helper failed to start"):
        child_pipe.Helper([sys.executable, "-c", "print('not ready')"], name="broken helper")


def test_the_pipe_module_needs_no_third_party_package():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from pipelines import child_pipe; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('numpy', 'pyarrow', 'yaml', 'apache_beam', 'tensorflow', 'tpu_embed', 'pipelines', 'profiles')))")
    out = subprocess.run([sys.executable, "-S", "-c", code, ROOT], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['pipelines', 'pipelines.child_pipe']"
