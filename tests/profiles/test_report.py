"""The HTML report: real PNG images, referenced by the page."""

import re

import pytest

import profiles
from profiles import ProfileStore, synthetic
from profiles.report import write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def profile_dir(write_synthetic_profile):
    fc = synthetic.feature_config(4, per_chip_batch=16, vocab_sizes=[50, 3000, 800, 20000], shared=1,
                                  sequence={1: 2})
    return write_synthetic_profile(fc, steps=40, seed=2, candidate_chip_counts=(1, 4))


def _check_report(html_path):
    import matplotlib.image
    out = html_path.parent
    html = html_path.read_text()
    refs = re.findall(r"<img src='([^']+)'", html)
    assert len(refs) >= 5
    assert {"ids_per_example.png", "sc_load_heatmap.png", "limits_over_steps.png", "top_ids.png",
            "memory.png"} <= set(refs)
    for ref in refs:
        data = (out / ref).read_bytes()
        assert data[:8] == PNG_MAGIC, ref
        img = matplotlib.image.imread(out / ref)
        h, w = img.shape[:2]
        assert 200 <= h <= 4000 and 400 <= w <= 4000, (ref, img.shape)
        assert img.std() > 0.01, ref  # not a blank image
    return html


def test_report_with_plan(tmp_path, profile_dir):
    with pytest.warns(profiles.InsufficientDataWarning):
        plan = profiles.plan(profile_dir)
    plan_path = plan.write(tmp_path / "plan.json")
    html_path = write_report(profile_dir, plan_path, tmp_path / "report")
    html = _check_report(tmp_path / "report" / "index.html")
    assert str(html_path).endswith("index.html")
    covered = ", ".join(map(str, ProfileStore(profile_dir).read().covered_chip_counts))
    assert f"Chip counts this profile has figures for (same global batch): {covered}." in html
    assert "max_ids_per_chip_per_sample" in html and "InsufficientDataWarning" in html
    for name in plan.stacks:
        assert name in html


def test_report_without_plan_from_profile_object(tmp_path, profile_dir):
    profile = ProfileStore(profile_dir).read()
    write_report(profile, None, tmp_path / "r2")
    _check_report(tmp_path / "r2" / "index.html")
