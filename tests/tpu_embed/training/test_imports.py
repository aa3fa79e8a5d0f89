"""The training package's numpy-only modules import without TensorFlow; its TPU names load on first use."""

import subprocess
import sys

from tests.helpers import ROOT


def test_numpy_modules_of_training_do_not_import_tensorflow():
    code = ("import sys, tpu_embed.training.host_index, tpu_embed.training.shard_parse, tpu_embed.training.input; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'; "
            "from tpu_embed import training; assert callable(training.build_tpu_embedding); "
            "assert 'tensorflow' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)
