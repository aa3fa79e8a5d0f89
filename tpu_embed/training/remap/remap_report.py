"""What a remap did, per table and in all: `RemapReport.summary()` is `tpu-embed remap`'s table."""

from __future__ import annotations

import dataclasses
from typing import Dict, Tuple


@dataclasses.dataclass(frozen=True)
class TableReport:
    """One table of a remap: rows in A and B, tokens kept / new / dropped, the slots moved with it."""

    table: str
    kind: str  # the vocabulary type of its features: "frequency" | "identity" | "hashing"
    rows_a: int
    rows_b: int
    kept_tokens: int  # frequency tables: tokens in both vocabularies
    new: int  # B rows that start from the initializer
    dropped: int  # A rows no B row takes
    oov_buckets: int  # kept as they are
    slots: Tuple[str, ...]
    copied: bool  # every row stayed where it was (identity and hashing tables, equal vocabularies)


@dataclasses.dataclass(frozen=True)
class RemapReport:
    checkpoint: str  # the input's prefix
    output: str
    layout: str  # "host_embedding" | "tpu_embedding"
    prefix: str  # the embedding's path in the checkpoint
    tables: Dict[str, TableReport]
    absent: Tuple[str, ...]  # tensor-core tables the checkpoint does not hold (nothing to move)
    other_variables: int  # copied as they are
    seed: str = ""  # what seeded the default initializer: "artifact:<sha256>" (B's fingerprint) or the seed given

    def summary(self) -> str:
        lines = [f"remapped {self.checkpoint} -> {self.output} ({self.layout} at {self.prefix!r}; "
                 f"{self.other_variables} other variables copied)"]
        # "initialized": B's rows that start from the initializer (tokens not in A, reserved rows), not "new",
        # which `tpu-embed inspect` says of the tokens a lineage's day added.
        rows = [("table", "kind", "rows A", "rows B", "kept", "initialized", "dropped", "oov", "slots")]
        for t in self.tables.values():
            rows.append((t.table, t.kind + (" (copied)" if t.copied else ""), str(t.rows_a), str(t.rows_b),
                         str(t.kept_tokens), str(t.new), str(t.dropped), str(t.oov_buckets),
                         ", ".join(t.slots) or "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines += ["  " + "  ".join(c.ljust(w) if i in (0, 1, 8) else c.rjust(w)
                                   for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
        if self.seed:
            by = f"artifact B's fingerprint {self.seed[9:21]}" if self.seed.startswith("artifact:") else \
                f"seed {self.seed}"
            lines.append(f"new rows of default-initialized tables: seeded by {by} and the table")
        if self.absent:
            lines.append(f"not in the checkpoint (tensor-core tables, nothing to move): {', '.join(self.absent)}")
        return "\n".join(lines)
