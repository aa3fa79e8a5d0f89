"""mkdocs hooks of the documentation site (mkdocs.yml `hooks:`).

The API pages import `tpu_embed`'s public names, and with them TensorFlow, whose C++ start-up lines
would fill the build's output: the same import hook as the `tpu-embed` command keeps them off it.

Code blocks the snippet test (tests/docs/test_snippets.py) does not run are marked in the Markdown by a
title that starts with "Not run" and says why (`title="Not run here: needs a TPU"`). The site shows the
reason alone, as the block's title ("Needs a TPU"), not the test's marker.
"""

import re

from tpu_embed.core import quiet

# A fence's opening line whose title is the snippet test's marker: "Not run[ by the snippet test| here]: why".
_NOT_RUN = re.compile(r'^(?P<fence>[ ]*(?:`{3,}|~{3,})[^\n]*?)\s*title="Not run[^":]*(?::\s*(?P<why>[^"]*))?"',
                      re.M)


def on_startup(command, dirty):
    quiet.install()


def reader_title(why: str) -> str:
    """The reason as a title: a first plain word capitalised ("needs a TPU" -> "Needs a TPU", `model_fn` kept)."""
    why = why.strip()
    return re.sub(r"^[a-z](?=[a-z]*(?:[\s,.;:]|$))", lambda m: m.group().upper(), why)


def strip_not_run_titles(markdown: str) -> str:
    def retitle(m: re.Match) -> str:
        why = reader_title(m.group("why") or "")
        return f'{m.group("fence")} title="{why}"' if why else m.group("fence")
    return _NOT_RUN.sub(retitle, markdown)


def on_page_markdown(markdown, page, config, files):
    return strip_not_run_titles(markdown)
