"""`tpu-embed transform-output DIR`: an artifact's raw -> id mapping as tf.Transform output."""

from __future__ import annotations

from pipelines.cli.help_text import COMMANDS, description

# What a command runs (Beam, TensorFlow, the artifact readers) is imported when it runs, not here: `tpu-embed
# --help` builds only the parsers.


COMMAND = "transform-output"


def add_parser(sub) -> None:
    sp = sub.add_parser(COMMAND, help=COMMANDS[COMMAND], description=description(
        COMMAND, "tft.TFTransformOutput reads it (docs/how-to/serve.md)."))
    sp.add_argument("artifact", help="artifact directory (made by `tpu-embed run`)")
    sp.add_argument("--output", default=None, metavar="DIR",
                    help="where to write it, replacing what is there (default: ARTIFACT/transform_output)")
    sp.set_defaults(func=cmd_transform_output)


def cmd_transform_output(args):
    # A command's imports (see the imports); TensorFlow only in the child that builds a graph not cached.
    from tpu_embed.serving.tft_output import write_transform_output
    if args.output is None:  # the artifact's own: listed in its manifest, as `run` writes it
        path = _write_into_artifact(args.artifact)
    else:
        path = write_transform_output(args.artifact, args.output)
    print(f"transform output: {path} (tft.TFTransformOutput reads it)")
    return 0


def _write_into_artifact(artifact: str) -> str:
    """The artifact's own transform output, written holding the artifact's output claim (`pipelines.output`), as
    a job command writes it: a `tpu-embed run` into the same directory is refused meanwhile (and this command
    while one runs), and a killed write leaves an unfinished artifact that readers refuse until this command
    runs again. The files are made from the artifact first; the claim is held while they replace the old ones."""
    from pipelines import output, tft_output_writer
    from pipelines.user_errors import UserError
    from tpu_embed.artifact import io as tio
    from tpu_embed.artifact import verify
    from tpu_embed.artifact.load import load_spec_of
    from tpu_embed.artifact.manifest import read_manifest
    from tpu_embed.serving.tft_output import DIRECTORY

    m = read_manifest(artifact)
    left = (m.model_extra or {}).get(verify.UNFINISHED_KEY)
    if not (isinstance(left, dict) and left.get("command") == output.marker_command(COMMAND)):
        verify.check_finished(m, artifact)  # unfinished by another command: refused, naming it
    files = tft_output_writer.transform_files(artifact, load_spec_of(artifact, m))
    with output.claim(artifact, COMMAND, False) as claimed:
        if read_manifest(artifact).files_of("vocabulary") != m.files_of("vocabulary"):
            raise UserError(f"{artifact}: its vocabularies changed while its transform output was made (another "
                            f"command wrote the artifact): run `tpu-embed {COMMAND}` again.")
        tft_output_writer.write_files(artifact, files)
        claimed.finish()
    return tio.join(artifact, DIRECTORY)
