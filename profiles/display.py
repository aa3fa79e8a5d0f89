"""How names are shown to people: natural order (C1, C2, ..., C10) and short stacked-table names.

A stacked table is named by its members joined with `_` (TF's rule), which for
Criteo is 200 characters.  Cutting it at a width gives `C1_C10_C11_…_C19_C2_C2`,
which reads like a list of real tables; `short_stack_name` keeps the first two
members and says how many more there are: `C1_C10…(+24 tables)`.
"""

from __future__ import annotations

import re
from typing import Iterable, List, Optional, Sequence

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str):
    """Sort key: digit runs compare as numbers ('C2' < 'C10'), the rest as text."""
    return [(0, int(p), "") if p.isdigit() else (1, 0, p.lower()) for p in _DIGITS.split(str(name)) if p != ""]


def natural_sorted(names: Iterable[str]) -> List[str]:
    return sorted(names, key=natural_key)


def short_stack_name(name: str, tables: Optional[Sequence[str]] = None, width: int = 24) -> str:
    """`name` if it is short (or has at most two members); else `first_second…(+N tables)`.

    `tables`: the stack's members in stacking order (TF's sorted order); default: `name` split at `_`
    (ambiguous when table names contain `_`, so pass them when known)."""
    members = list(tables) if tables else name.split("_")
    if len(name) <= width or len(members) <= 2:
        return name
    return f"{members[0]}_{members[1]}…(+{len(members) - 2} tables)"
