import pytest

from tests.helpers import SPECS
from tpu_embed.artifact.spec import load_spec


@pytest.fixture(scope="session")
def example_artifacts(tmp_path_factory):
    """{name: (spec, artifact dir)} of the example specs, made once by `tpu-embed run`'s jobs, transform output
    included (read only)."""
    from tests.helpers import jobs
    out = {}
    for name in sorted(SPECS):
        spec = load_spec(SPECS[name])
        d = str(tmp_path_factory.mktemp(f"artifact_{name}"))
        jobs.run(spec, d, transform_output=True)
        out[name] = (spec, d)
    return out
