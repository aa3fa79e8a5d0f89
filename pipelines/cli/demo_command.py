"""`tpu-embed demo`: raw data to a trained model (`pipelines.demo`)."""

from __future__ import annotations

import argparse

from pipelines.cli.help_text import COMMANDS, description

# What a command runs (Beam, TensorFlow, the artifact readers) is imported when it runs, not here: `tpu-embed
# --help` builds only the parsers.


def add_parser(sub) -> None:
    sp = sub.add_parser("demo", help=COMMANDS["demo"], description=description(
        "demo", "Synthetic Criteo-like data, the jobs, the plan, a DLRM trained with HostEmbedding, the SavedModel "
                "and the report. A second demo into the same --output replaces what the first one wrote (other "
                "files there are kept)."))
    sp.add_argument("--output", default="build/demo", help="where everything goes (default build/demo)")
    # Accepted, hidden: a demo replaces its own earlier output anyway, and scripts that pass it keep working.
    sp.add_argument("--overwrite", action="store_true", help=argparse.SUPPRESS)
    sp.add_argument("--examples", type=int, default=None, help="synthetic examples to generate (default 500000)")
    sp.add_argument("--days", type=int, choices=(1, 2), default=1,
                    help="2: the examples as two days of one lineage (vocabularies append under capacities); "
                         "day 2 restores day 1's checkpoint and trains on, against a cold start (default 1)")
    sp.add_argument("--no-serving", dest="serving", action="store_false",
                    help="skip the SavedModel export and its scoring of the held-out raw rows (a minute or more)")
    sp.set_defaults(func=cmd_demo)


def cmd_demo(args, beam_args):
    from pipelines import demo  # Beam: the demo runs the jobs (see the imports)
    return demo.main(args.output, args.examples, beam_args, days=args.days, serving=args.serving)
