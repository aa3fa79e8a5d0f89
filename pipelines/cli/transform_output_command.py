"""`tpu-embed transform-output DIR`: an artifact's raw -> id mapping as tf.Transform output."""

from __future__ import annotations

from pipelines.cli.help_text import COMMANDS, description

# What a command runs (Beam, TensorFlow, the artifact readers) is imported when it runs, not here: `tpu-embed
# --help` builds only the parsers.


def add_parser(sub) -> None:
    sp = sub.add_parser("transform-output", help=COMMANDS["transform-output"], description=description(
        "transform-output", "tft.TFTransformOutput reads it (docs/how-to/serve.md)."))
    sp.add_argument("artifact", help="artifact directory (made by `tpu-embed run`)")
    sp.add_argument("--output", default=None, metavar="DIR",
                    help="where to write it, replacing what is there (default: ARTIFACT/transform_output)")
    sp.set_defaults(func=cmd_transform_output)


def cmd_transform_output(args):
    # A command's imports (see the imports); TensorFlow only in the child that builds a graph not cached.
    from tpu_embed.serving.tft_output import DIRECTORY, write_transform_output
    if args.output is None:  # the artifact's own: listed in its manifest, as `run` writes it
        from pipelines import tft_output_writer
        from tpu_embed.artifact import io as tio
        from tpu_embed.artifact.load import load_artifact
        tft_output_writer.write(args.artifact, load_artifact(args.artifact, verify="none").spec)
        path = tio.join(args.artifact, DIRECTORY)
    else:
        path = write_transform_output(args.artifact, args.output)
    print(f"transform output: {path} (tft.TFTransformOutput reads it)")
    return 0
