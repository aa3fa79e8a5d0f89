"""Every code block of the README, the tutorial, the how-to guides and the explanation pages in `EXPLANATION` runs,
in order, so no page can rot.

A fenced block is one of:

* ` ```python ` — run by this venv's python;
* ` ```bash ` — run by `bash -euo pipefail`;
* ` ```yaml title="NAME" ` (or any language with a file name as title) — a file the reader is asked to
  save: written as NAME;
* ` ```text ` — output or a directory tree, not code (a text block that starts with a command fails);
* any code block whose info string has `title="Not run…"`, saying why in words a reader understands (needs
  a TPU, a bucket, a cluster): shown, not run. Keep these few.

A document's blocks run in one temporary directory that looks like the repository root after `make demo`
(`data/`, `examples/`, `tpu_embed/`, `.venv` and, where it exists, `.venv-jax` linked in), each in its own
process, in the order they appear, with neither venv on `PATH`: a command must be typed as a reader who
ran `make demo` types it (`.venv/bin/tpu-embed`). A block that runs `.venv-jax/bin/python` needs the JAX venv
(`make jax-oracle`; `make test` makes it and sets TPU_EMBED_JAX_PYTHON): without one the rest of the page
still runs, and the test is skipped at its end, naming the blocks it left out.
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOW_TO = sorted(f"docs/how-to/{p.name}" for p in (ROOT / "docs" / "how-to").glob("*.md"))
# Explanation pages whose blocks run too.
EXPLANATION = ["docs/explanation/partitioning.md"]
DOCUMENTS = ["README.md", "docs/tutorial.md", *HOW_TO, *EXPLANATION]
# What the snippets read, relative to the repository root (the JAX venv imports tpu_embed from there).
LINKED = ["data", "examples", "tpu_embed"]
# Pages of which no block can run on one machine, and why (every block says it too, title="Not run…").
NOTHING_RUNS = {"docs/how-to/object-stores.md": "every command reads or writes a bucket"}
# A text block that starts as a command is a command shown as output: make it a bash block, or "Not run…".
COMMAND = re.compile(r"^(?:\$ |\.?venv[\w-]*/bin/|tpu-embed |make |python3? |saved_model_cli |PYTHONPATH=)")
TIMEOUT_S = 180

FENCE = re.compile(r"^(?P<indent>[ ]*)```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)```[ ]*$", re.M | re.S)
TITLE = re.compile(r'title="(?P<title>[^"]*)"')


@dataclasses.dataclass(frozen=True)
class Block:
    document: str
    line: int
    language: str
    title: str
    body: str

    @property
    def kind(self) -> str:
        if self.title.startswith("Not run"):
            return "not run"
        if self.language == "text":
            return "command as text" if COMMAND.match(self.body.lstrip()) else "output"
        if self.title and not re.search(r"\s", self.title):
            return "file"
        if self.language in ("python", "bash"):
            return self.language
        return "unknown"

    def __str__(self) -> str:
        return f"{self.document}:{self.line} (```{self.language} {self.title})"


def blocks_of(document: str) -> List[Block]:
    text = (ROOT / document).read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        info = m.group("info").strip()
        title = TITLE.search(info)
        indent = len(m.group("indent"))
        body = "".join(line[indent:] + "\n" for line in m.group("body").splitlines())
        out.append(Block(document, text.count("\n", 0, m.start()) + 1, info.split(" ")[0] if info else "",
                         title.group("title") if title else "", body))
    return out


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_block_is_runnable_or_says_why_not(document):
    blocks = blocks_of(document)
    assert blocks, f"{document} has no code blocks: is the fence pattern still right?"
    unknown = [str(b) for b in blocks if b.kind in ("unknown", "command as text")]
    assert not unknown, ("blocks this test cannot run; use python, bash, a file with title=\"FILE\", text for output "
                         f"(not commands), or title=\"Not run: why\": {unknown}")
    runs = any(b.kind in ("python", "bash") for b in blocks)
    assert runs != (document in NOTHING_RUNS), (f"{document}: nothing runs" if not runs else
                                                f"{document} runs blocks now: take it out of NOTHING_RUNS")


def anchors_of(markdown: str) -> set:
    """The ids of a Markdown file's headings, as Python-Markdown's `toc` (mkdocs) and GitHub make them."""
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", FENCE.sub("", markdown), re.M):
        text = re.sub(r"\[([^]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
        text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
        out.add(re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower()))
    return out


@pytest.mark.parametrize("document", DOCUMENTS)
def test_relative_links_resolve(document):
    # The README is not part of the mkdocs site, whose strict build checks the docs' links and anchors.
    text = FENCE.sub("", (ROOT / document).read_text(encoding="utf-8"))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        name, _, anchor = target.partition("#")
        path = (ROOT / document).parent / name if name else ROOT / document
        if not path.exists() or (anchor and path.suffix == ".md"
                                 and anchor not in anchors_of(path.read_text(encoding="utf-8"))):
            broken.append(target)
    assert not broken, f"{document} has links to files or headings that do not exist: {broken}"


REPO_PATH = re.compile(r"(?<![\w./-])((?:tpu_embed|pipelines|profiles|tests|benchmarks|examples|data|docs)/[\w./-]*\w"
                       r"\.(?:py|c|h|md|yaml|csv))\b")


def test_files_the_docs_name_exist():
    # A renamed module or test leaves no stale path in the README or the docs.
    documents = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
    missing = sorted({f"{doc}: {m}" for doc in documents
                      for m in REPO_PATH.findall((ROOT / doc).read_text(encoding="utf-8"))
                      if not (ROOT / m).exists()})
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def jax_venv() -> Optional[Path]:
    """The JAX venv (`make jax-oracle`): TPU_EMBED_JAX_PYTHON's, else the repository's .venv-jax; None without."""
    python = os.environ.get("TPU_EMBED_JAX_PYTHON")
    venv = Path(python).parent.parent if python else ROOT / ".venv-jax"
    return venv if (venv / "bin" / "python").exists() else None


def reader_env() -> dict:
    """The environment of a reader's shell after `make demo`: no venv activated, so no venv's bin/ on PATH."""
    venvs = {os.path.realpath(Path(p) / "bin") for p in (sys.prefix, ROOT / ".venv", ROOT / ".venv-jax")}
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and os.path.realpath(p) not in venvs]
    env = dict(os.environ, PATH=os.pathsep.join(path), TF_CPP_MIN_LOG_LEVEL="2")
    for name in ("PYTHONPATH", "VIRTUAL_ENV"):  # the test runner's, not a reader's
        env.pop(name, None)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS)
def test_blocks_run_in_order(document, tmp_path):
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name, target_is_directory=True)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    jax = jax_venv()
    if jax is not None:
        (tmp_path / ".venv-jax").symlink_to(jax, target_is_directory=True)
    env = reader_env()
    left_out = []
    for block in blocks_of(document):
        if block.kind == "file":
            (tmp_path / block.title).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / block.title).write_text(block.body, encoding="utf-8")
            continue
        if jax is None and ".venv-jax/" in block.body:
            left_out.append(str(block))
            continue
        if block.kind == "python":
            command = [sys.executable, "-c", block.body]
        elif block.kind == "bash":
            command = ["bash", "-euo", "pipefail", "-c", block.body]
        else:
            continue
        r = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert r.returncode == 0, (f"{block} failed with exit code {r.returncode}:\n{block.body}\n"
                                   f"--- stdout ---\n{r.stdout[-3000:]}\n--- stderr ---\n{r.stderr[-3000:]}")
    if left_out:
        pytest.skip(f"every other block ran; left out, for want of the JAX venv (`make jax-oracle`): {left_out}")
