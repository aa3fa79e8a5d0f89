"""The jobs' manifest writer (`pipelines.jobs.manifest_writer`): what an output directory already holds."""

import json
import os

import pytest

from tpu_embed.artifact.manifest import SCHEMA_VERSION, ManifestError


def test_jobs_check_for_an_existing_manifest_explicitly(tmp_path):
    """No manifest yet: None.  A damaged one is an error, not silently replaced."""
    from pipelines.jobs.manifest_writer import existing_manifest
    out = str(tmp_path)
    assert existing_manifest(out) is None
    manifest = {"schema_version": SCHEMA_VERSION, "kind": "tpu_embed.artifact", "spec_fingerprint": "f" * 64}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        f.write(json.dumps(manifest)[:50])
    with pytest.raises(ManifestError, match="truncated"):
        existing_manifest(out)
