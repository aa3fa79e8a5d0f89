"""The lines about a lineage's vocabularies that `tpu-embed inspect` (and `run`'s summary) and the demo print:
per vocabulary of mode append / frozen its capacity used, the tokens kept and added, those sent to OOV, and
those not seen for some days."""

from __future__ import annotations

from typing import Optional


def lineage_lines(m, artifact: Optional[str] = None, unseen_days: int = 1) -> list:
    """The lineage (modes append / frozen): day, base, and per vocabulary its mode, the tokens in use (of the
    capacity), kept from the base and new, the tokens not admitted and their values sent to the OOV buckets,
    and with `artifact` (whose token-count files are read) the tokens in use not seen for `unseen_days` days
    or more: `last_day <= day - unseen_days`, the ones a retiring policy would free (none is retired: a token
    keeps its id and row while its lineage lasts)."""
    lin = m.lineage
    if lin is None:
        return []
    base = f"base {lin.base.path} (day {lin.base.day})" if lin.base else "first day"
    lines = [f"lineage {lin.id[:12]} day {lin.day}, {base}"
             + (f"; table rows changed: {', '.join(lin.table_rows_changed)}" if lin.table_rows_changed else "")]
    for k, v in sorted((m.vocabularies or {}).items()):
        if v.mode is None:
            continue
        cap = f" of capacity {v.capacity}" if v.capacity is not None else ""
        over = f", {v.capacity_overflow_tokens} over capacity" if v.capacity_overflow_tokens else ""
        line = (f"  {k}: {v.mode}, {v.tokens} tokens{cap} ({v.base_tokens} kept, {v.new_tokens} new), "
                f"{v.not_admitted_tokens} not admitted{over}; {v.not_admitted_count} values to OOV")
        if artifact is not None and v.counts_file is not None:
            line += f"; {unseen_tokens(artifact, k, lin.day - unseen_days)} unseen for {unseen_days}+ day(s)"
        lines.append(line)
    return lines


def unseen_tokens(artifact: str, key: str, last_day: int) -> int:
    """Tokens in vocabulary `key` (id >= 0) last seen on day `last_day` or before, from its token-count file."""
    import pyarrow.compute as pc  # a command's imports (see the imports)

    from tpu_embed.artifact.lineage import read_token_counts
    t = read_token_counts(artifact, key)
    return int(pc.sum(pc.and_(pc.greater_equal(t["id"], 0), pc.less_equal(t["last_day"], last_day))).as_py() or 0)
