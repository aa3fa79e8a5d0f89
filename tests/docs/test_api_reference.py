"""The published API reference: no Python help text, Google-style sections rendered, no test jargon.

One strict build of the site (`mkdocs build --strict`, as `make docs`) into a temporary directory, shared by
the tests that read it; the others read the sources.
"""

from __future__ import annotations

import ast
import builtins
import enum
import html
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pydantic
import pytest

ROOT = Path(__file__).resolve().parents[2]
API_PAGES = ["tpu_embed", "host-embedding", "sparsecore", "training", "model", "spec", "manifest"]
MIN_WORDS, PREFIX_WORDS = 4, 8  # a docstring is recognised by its first words (at most 8, at least 4)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9_]+", text.lower())


def page_text(path: Path) -> str:
    """The rendered page as plain text: tags, scripts and the navigation removed, entities decoded."""
    raw = path.read_text(encoding="utf-8")
    body = raw[raw.find("<article"):raw.find("</article>")] if "<article" in raw else raw
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", body, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def builtin_docstrings() -> dict[str, tuple[str, ...]]:
    """{where: the first words of its docstring} for Python's built-in types, typing/enum bases, pydantic's
    BaseModel and the docstrings Python generates (a namedtuple's fields): what an inspected object inherits."""
    types = [t for t in vars(builtins).values() if isinstance(t, type)]
    types += [typing.NamedTuple, typing.Generic, enum.Enum, enum.IntEnum, pydantic.BaseModel]
    docs: dict[str, str] = {t.__name__: inspect.getdoc(t) or "" for t in types}
    for t in types:
        for name in dir(t):
            try:
                value = getattr(t, name)
            except AttributeError:
                continue
            doc = getattr(value, "__doc__", None)
            if isinstance(doc, str):
                docs[f"{t.__name__}.{name}"] = doc
    docs["namedtuple field"] = "Alias for field number 0"
    out: dict[tuple[str, ...], str] = {}  # one name per docstring: the first owner (types come first)
    for where, doc in docs.items():
        doc = re.sub(r"\]\([^)]*\)", "]", doc)  # Markdown link targets are not in the rendered text
        doc = re.sub(r"!!!\s*\w+", " ", doc)  # nor admonition markers (pydantic's docstrings)
        first = tuple(words(doc)[:PREFIX_WORDS])
        if len(first) >= MIN_WORDS:
            out.setdefault(first, where)
    return {where: first for first, where in out.items()}


def builtin_docstrings_in(text: str, docstrings: dict[str, tuple[str, ...]]) -> list[str]:
    flat = f" {' '.join(words(text))} "
    return sorted(where for where, first in docstrings.items() if f" {' '.join(first)} " in flat)


def test_the_detector_finds_what_inspection_renders():
    # What the reference showed for Topology.num_hosts and pydantic's model_config before: found.
    docstrings = builtin_docstrings()
    assert "int" in builtin_docstrings_in(f"num_hosts = 1 class-attribute {int.__doc__}", docstrings)
    assert "dict" in builtin_docstrings_in(f"model_config {dict.__doc__}", docstrings)
    assert builtin_docstrings_in("The TPU slice a batch is preprocessed for. num_hosts: int = 1", docstrings) == []


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    return out


def test_no_page_shows_python_builtin_docstrings(site):
    docstrings = builtin_docstrings()
    pages = sorted(site.rglob("*.html"))
    api = [site / "reference" / "api" / name / "index.html" for name in API_PAGES]
    assert all(p.exists() for p in api), [str(p) for p in api if not p.exists()]
    found = {str(p.relative_to(site)): hits for p in pages if (hits := builtin_docstrings_in(page_text(p), docstrings))}
    assert not found, f"pages showing the docstrings of Python's built-ins (inherited by an inspected member): {found}"


def test_google_sections_render_as_sections(site):
    page = (site / "reference" / "api" / "host-embedding" / "index.html").read_text(encoding="utf-8")
    start = page.find('id="tpu_embed.HostEmbedding"')
    assert start >= 0, "the HostEmbedding page has no tpu_embed.HostEmbedding heading"
    section = page[start:page.find('class="doc doc-children"', start)]
    assert re.search(r'doc-section-title">\s*Parameters:', section), "HostEmbedding's Args is not a parameters section"
    table = section[section.find('doc-section-title">Parameters:'):]
    table = table[:table.find("</table>")]
    names = re.findall(r'<tr class="doc-section-item">\s*<td>\s*<code>(\w+)</code>', table)
    assert names[:4] == ["feature_config", "topology", "optimizer", "tensor_core_features"], names
    for name in API_PAGES:  # nowhere a section left as a paragraph of text (rendered sections have their titles)
        rendered = (site / "reference" / "api" / name / "index.html").read_text(encoding="utf-8")
        text = html.unescape(re.sub(r"<[^>]+>", " ", re.sub(r'<span class="doc-section-title">[^<]*</span>', "",
                                                             rendered)))
        left = re.findall(r"\b(Args|Returns|Raises|Yields):", text)
        assert not left, f"reference/api/{name}: Google-style section titles rendered as text: {left}"


def test_site_has_no_snippet_test_markers_and_wraps_code(site):
    jargon = sorted(str(p.relative_to(site)) for p in site.rglob("*.html")
                    if re.search(r"Not run|snippet test", page_text(p)))
    assert not jargon, f"pages showing the snippet test's markers: {jargon}"
    css = (site / "stylesheets" / "code.css").read_text(encoding="utf-8")
    assert "pre-wrap" in css
    assert "stylesheets/code.css" in (site / "reference" / "api" / "host-embedding" / "index.html").read_text()


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hook_turns_not_run_markers_into_reasons():
    strip = _hooks().strip_not_run_titles
    assert strip('```python title="Not run here: needs a TPU"\nx\n```') == '```python title="Needs a TPU"\nx\n```'
    assert strip('```python title="Not run by the snippet test: model_fn is yours"\n') == \
        '```python title="model_fn is yours"\n'
    assert strip('```bash title="Not run"\n') == "```bash\n"
    assert strip('```yaml title="daily.yaml"\n') == '```yaml title="daily.yaml"\n'
    for page in sorted((ROOT / "docs").rglob("*.md")):
        assert "Not run" not in strip(page.read_text(encoding="utf-8")), f"{page}: a marker the hook leaves"


def _type_checking_imports(path: Path) -> dict[str, str]:
    """{name: module} imported under `if TYPE_CHECKING:` in a package's __init__."""
    out = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom):
                    out.update({alias.asname or alias.name: imp.module for alias in imp.names})
    return out


@pytest.mark.parametrize("package, extra", [("tpu_embed", ["sparsecore"]), ("tpu_embed.training", [])])
def test_lazy_names_are_visible_to_static_analysis(package, extra):
    # The reference is built by static analysis (inspection renders builtins' docstrings); the lazily loaded
    # names reach it through the TYPE_CHECKING imports and a literal __all__, which must match _EXPORTS.
    module = importlib.import_module(package)
    assert module.__all__ == sorted(module._EXPORTS) + extra
    imports = _type_checking_imports(Path(module.__file__))
    assert imports == module._EXPORTS, f"{package}: TYPE_CHECKING imports and _EXPORTS disagree"
