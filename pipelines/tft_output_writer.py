"""`tpu-embed run` writes the artifact's tf.Transform output (`transform_output/`, listed in the manifest).

The graph of a spec comes from the cache, or is built by a child process started with the run, at the lowest
CPU priority, while the jobs read and shard (`tpu_embed.serving.tft_output.TransformGraph`); when the
shards are written the artifact's vocabulary files go into it, with its schemas: this process imports no
TensorFlow.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict, Mapping, Optional

from pipelines.jobs import manifest_writer
from pipelines.output import write_atomic
from tpu_embed.artifact import io as tio
from tpu_embed.artifact.manifest import Manifest, read_manifest
from tpu_embed.serving.tft_output import (
    DIRECTORY,
    TransformGraph,
    TransformOutputError,
    transform_output_files,
)

if TYPE_CHECKING:
    from tpu_embed.artifact.spec import Spec

log = logging.getLogger("tpu_embed.pipelines")


def start(spec: Spec, base: Optional[str] = None) -> TransformGraph:
    """The spec's transform graph: cached, taken from the base artifact's transform output, or being built
    beside the jobs."""
    graph = TransformGraph(spec, base)
    log.info("transform graph: %s", {"cache": "cached", "base": f"from {base}",
                                      "built": "being built in a child process"}[graph.source])
    return graph


def write(output: str, spec: Spec, graph: Optional[TransformGraph] = None) -> Manifest:
    """Write output/transform_output/ of the artifact of `spec` in `output` (replacing what is there) and list its
    files in the manifest: `write_files` of `transform_files`."""
    return write_files(output, transform_files(output, spec, graph))


def transform_files(output: str, spec: Spec, graph: Optional[TransformGraph] = None) -> Dict[str, bytes]:
    """The files of the artifact's transform output, {path under transform_output/: bytes}; nothing is written."""
    m = read_manifest(output)
    try:
        return transform_output_files(output, spec, m.vocabulary_sizes, graph or TransformGraph(spec))
    except TransformOutputError as e:
        raise TransformOutputError(f"{output}: the shards are written but not {DIRECTORY}/: {e} (write it with "
                                   f"`tpu-embed transform-output {output}`, or run with --no-transform-output)"
                                   ) from None


def write_files(output: str, files: Mapping[str, bytes]) -> Manifest:
    """Replace output/transform_output/ by `files` (`transform_files`) and list them in the manifest. The manifest
    stops listing the old files before they are deleted, and lists the new ones once all are written."""
    m = read_manifest(output)
    if m.files_of(manifest_writer.TRANSFORM_OUTPUT_KIND):  # no longer listed before its files are replaced
        manifest_writer.replace_files(output, manifest_writer.TRANSFORM_OUTPUT_KIND, [])
    tio.delete_tree(tio.join(output, DIRECTORY))
    entries = [write_atomic(output, f"{DIRECTORY}/{rel}", data, extra={"kind": manifest_writer.TRANSFORM_OUTPUT_KIND})
               .to_json() for rel, data in sorted(files.items())]
    return manifest_writer.replace_files(output, manifest_writer.TRANSFORM_OUTPUT_KIND, entries)


def cancel(graph: Optional[TransformGraph]) -> None:
    if graph is not None:
        graph.cancel()
