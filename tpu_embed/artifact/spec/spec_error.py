"""What a spec error says: the key, the problem, the fix, and where (the file and its line) when known.

`validation` turns pydantic's errors into these; every section's own checks raise them directly.
"""

from __future__ import annotations

import difflib
from typing import Optional, Sequence


class SpecError(ValueError):
    """A spec is invalid. The message names the key and the fix, and `where` (the file, and its line where
    known) when it came from one: `<file>, line 18: spec key 'global_batch_sise': unknown key; ...`.
    `FILE_KEY` stands for the file as a whole (missing, not YAML): no key is named."""

    FILE_KEY = "<file>"

    def __init__(self, key: str, problem: str, fix: str = "", where: Optional[str] = None):
        self.key, self.problem, self.fix, self.where = key, problem, fix, where
        super().__init__((f"{where}: " if where else "") + (f"spec key '{key}': " if key != self.FILE_KEY else "")
                         + problem + (f" Fix: {fix}" if fix else ""))

    def __reduce__(self):  # Beam sends errors between processes: rebuild from the parts, not the message
        return (SpecError, (self.key, self.problem, self.fix, self.where))


def unknown_key(key: str, allowed: Sequence[str], problem: str = "unknown key") -> SpecError:
    """`key` (its last part the unknown name) is not among `allowed`: with the allowed key it is closest to
    ("did you mean 'top_k'?"), else every allowed key."""
    name = key.rsplit(".", 1)[-1]
    by_lower = {a.lower(): a for a in allowed}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    if close:
        right = by_lower[close[0]]
        return SpecError(key, f"{problem}; did you mean '{right}'?",
                         f"rename it to {right} (the allowed keys are in docs/reference/spec.md).")
    return SpecError(key, f"{problem}.", f"allowed keys are {sorted(allowed)}.")
