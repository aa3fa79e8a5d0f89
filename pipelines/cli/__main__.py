"""`python -m pipelines.cli`: the `tpu-embed` command."""

import sys

from pipelines.cli.entry import main

sys.exit(main())
