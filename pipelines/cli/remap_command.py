"""`tpu-embed remap`: a checkpoint's rows moved from one artifact's ids to another's (`tpu_embed.training.remap`)."""

from __future__ import annotations

from pipelines.cli.help_text import COMMANDS, description
from pipelines.user_errors import UserError

# What a command runs (Beam, TensorFlow, the artifact readers) is imported when it runs, not here: `tpu-embed
# --help` builds only the parsers.


def add_parser(sub) -> None:
    sp = sub.add_parser("remap", help=COMMANDS["remap"], description=description(
        "remap", "Warm start across vocabularies: a checkpoint's tables and optimizer slots moved from artifact A's "
                 "ids to artifact B's."))
    sp.add_argument("--from", dest="from_artifact", required=True, metavar="A",
                    help="the artifact directory the checkpoint was trained on")
    sp.add_argument("--to", dest="to_artifact", required=True, metavar="B",
                    help="the artifact directory to train on next (same spec's features and tables)")
    sp.add_argument("--checkpoint", required=True, metavar="CKPT",
                    help="a checkpoint prefix (DIR/ckpt-3) or the directory whose `checkpoint` file names the latest")
    sp.add_argument("--output", required=True, metavar="CKPT2",
                    help="the new checkpoint's prefix (writes CKPT2.index and CKPT2.data-00000-of-00001)")
    sp.add_argument("--prefix", default=None, metavar="P",
                    help="the embedding's path in the checkpoint, e.g. `embedding` (default: found)")
    sp.add_argument("--seed", type=int, default=None,
                    help="seeds the initializer of new tokens' rows (TF's TableConfig default, a truncated normal) "
                         "with the table's name (default: artifact B's fingerprint does, so a re-run gives the same "
                         "bytes and another day other values)")
    sp.add_argument("--chunk-rows", type=int, default=None, metavar="N",
                    help="rows moved at a time (default 131072): memory follows it, not the table")
    sp.add_argument("--overwrite", action="store_true", help="replace an existing checkpoint at --output")
    sp.set_defaults(func=cmd_remap)


def cmd_remap(args):
    from pipelines import progress  # a command's imports (see the imports)
    from tpu_embed.training.remap import remap
    kw = {}
    if args.chunk_rows is not None:
        if args.chunk_rows < 1:
            raise UserError(f"--chunk-rows must be a positive number of rows, got {args.chunk_rows}")
        kw["chunk_rows"] = args.chunk_rows
    with progress.bar(None, "remap", unit="rows") as bar:
        def moved(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)
        # A RemapError / BundleError names what is wrong and the fix: one line, exit code 1 (pipelines.user_errors).
        report = remap(args.from_artifact, args.to_artifact, args.checkpoint, args.output, prefix=args.prefix,
                       seed=args.seed, overwrite=args.overwrite, progress=moved, **kw)
    print(report.summary())
    return 0
