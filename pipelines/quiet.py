"""Keep TensorFlow's start-up noise off the user's terminal: the `tpu-embed` command's side.

The one implementation is `tpu_embed.core.quiet` (importing `tpu_embed` already installs it unless the
user set `TF_CPP_MIN_LOG_LEVEL`).  The `tpu-embed` entry point calls `install()` first thing, whatever
`TF_CPP_MIN_LOG_LEVEL` says, so that TensorFlow's import (by this package, Beam, tfx-bsl or anyone) and the
device discovery that follows it print nothing; `--debug` calls `uninstall()` and leaves stderr alone.
`muted_stderr()` mutes one block (fd 2 -> /dev/null).
"""

from __future__ import annotations

from tpu_embed.core.quiet import ENVIRONMENT, install, muted_stderr, uninstall

__all__ = ["ENVIRONMENT", "install", "muted_stderr", "uninstall"]
