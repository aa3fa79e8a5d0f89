"""Importing tpu_embed and running the README's Python prints nothing on stderr, unless the user asks for logs.

Each case runs in a fresh interpreter (TensorFlow reads its log level once, when imported), with none of the
variables `tpu_embed.core.quiet` sets inherited from this test process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.docs.test_snippets import blocks_of

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "movielens_v1_artifact"
QUIET_VARIABLES = ("TF_CPP_MIN_LOG_LEVEL", "TPU_EMBED_QUIET", "GRPC_VERBOSITY", "GLOG_minloglevel")
TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} ", re.M)  # absl's format: I0000 00:00:... file.cc:N] message
TF_PYTHON_WARNING = "a warning of TensorFlow's Python logger"


def readme_input_fn_snippet() -> str:
    """The README's `input_fn` block, reading the fixture artifact instead of the quick start's."""
    blocks = [b for b in blocks_of("README.md") if b.kind == "python" and "input_fn" in b.body]
    assert len(blocks) == 1, "the README has no (or several) Python blocks calling input_fn"
    assert '"build/quickstart"' in blocks[0].body
    return blocks[0].body.replace('"build/quickstart"', repr(str(FIXTURE)))


def run_python(code: str, **env_overrides: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in QUIET_VARIABLES}
    env.update(env_overrides)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


# The README's snippet, then TensorFlow's Python logger, then a child process that imports tpu_embed and TF.
SNIPPET_AND_MORE = f"""
{readme_input_fn_snippet()}
import subprocess, sys
import tensorflow as tf
tf.get_logger().warning({TF_PYTHON_WARNING!r})
subprocess.run([sys.executable, "-c", "import tpu_embed, tensorflow as tf; tf.config.list_physical_devices()"],
               check=True)
print("done")
"""


def test_import_and_readme_snippet_print_nothing_on_stderr():
    run = run_python(SNIPPET_AND_MORE)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[-1] == "done", run.stdout
    assert "(8,) (8, 1)" in run.stdout  # the snippet ran: the fixture's host batch
    assert run.stderr == "", f"stderr is not empty:\n{run.stderr}"


def test_the_users_log_level_wins():
    code = f"{readme_input_fn_snippet()}\nimport tensorflow as tf\ntf.get_logger().warning({TF_PYTHON_WARNING!r})\n"
    run = run_python(code, TF_CPP_MIN_LOG_LEVEL="0")
    assert run.returncode == 0, run.stderr[-3000:]
    assert TF_LOG_LINE.search(run.stderr), f"TensorFlow's C++ logs were suppressed:\n{run.stderr}"
    assert TF_PYTHON_WARNING in run.stderr, "TensorFlow's Python logger was silenced"


def test_cli_debug_shows_the_tensorflow_logs_that_import_tpu_embed_hides():
    # `pipelines.cli` imports tpu_embed (which installs the quiet hook); `--debug` takes it out again.
    code = ("import contextlib, io\nfrom pipelines import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    cli.main(['--debug'])\n"
            "import tensorflow as tf\ntf.config.list_physical_devices()\n")
    run = run_python(code)
    assert run.returncode == 0, run.stderr[-3000:]
    assert TF_LOG_LINE.search(run.stderr), f"--debug did not show TensorFlow's start-up logs:\n{run.stderr}"
