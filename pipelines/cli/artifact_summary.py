"""The few lines about an artifact that the job commands print when they end and `tpu-embed inspect` starts with."""

from __future__ import annotations

from pipelines.lineage_report import lineage_lines

# The profiles' display and balance helpers, and the plan reader, are imported by the tables that use them:
# `tpu-embed --help` does not load them.


def summary(m, output: str, unseen_days: int = 1) -> str:
    """A few lines about an artifact directory, from its typed manifest (`tpu_embed.artifact.manifest.Manifest`)
    and, for a lineage, its token-count files (`lineage_lines`)."""
    if m is None:
        return f"{output}: no manifest written"
    lines = [f"artifact: {output}  (spec {m.spec_name}, fingerprint {m.spec_fingerprint[:16]})"]
    t, b = m.topology, m.batch_sizes
    lines.append(f"topology: {t.num_chips} chips x {t.num_sc_per_chip} SparseCores, "
                 f"{t.num_hosts} host(s); global batch {b.global_} "
                 f"(per host {b.per_host}, per chip {b.per_chip})")
    vocabs = m.vocabularies or {}
    if vocabs:
        sizes = ", ".join(f"{k}={v.size}" for k, v in sorted(vocabs.items())[:8])
        more = f" (+{len(vocabs) - 8} more)" if len(vocabs) > 8 else ""
        lines.append(f"vocabularies ({len(vocabs)}): {sizes}{more}")
    lines.extend(lineage_lines(m, output, unseen_days))
    c = m.counts
    if c is not None:
        lines.append(f"records read {c.records_read}, invalid {c.records_invalid} "
                     f"(dead letters: {c.dead_letters or 'none'}), examples written {c.examples_written} "
                     f"in {c.steps} steps, tail dropped {c.examples_dropped['tail']}, "
                     f"padding {c.examples_padding}")
        oov = {k: v.get("oov", 0) for k, v in c.ids.items() if v.get("oov")}
        if oov:
            lines.append(f"out-of-vocabulary values: {sum(oov.values())} over {len(oov)} features")
        if c.ids_dropped_by_limits:
            lines.append(f"ids dropped by SparseCore limits: {c.ids_dropped_by_limits}")
        policy = {f"{k}.{w}": n for k, v in sorted(c.ids.items()) for w, n in sorted(v.items())
                  if n and w in ("invalid_ids_dropped", "invalid_ids_defaulted", "oov_dropped", "nan_weights_dropped",
                                 "nan_weights_zeroed", "truncated_sequence", "truncated_tensor_core")}
        if policy:  # values changed or left out by a policy (records kept): never only in the manifest
            lines.append("values dropped/changed by policies: " + ", ".join(f"{k} {n}" for k, n in policy.items()))
    lines.extend(limits_table(m))
    lines.extend(balance_table(m, output))
    if m.profile is not None:
        lines.append(f"profile: {m.profile.files_written} files in {m.profile.directory}")
    kinds: dict = {}
    for f in m.files:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    lines.append("files: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    return "\n".join(lines)


def limits_table(m) -> list:
    """Per stacked table: its tables and the limits the shards were packed with, and where they came from."""
    lim, stacks = m.limits, m.stacks or {}
    if lim is None or not stacks:
        return []
    source = lim.source
    if source.startswith("planned"):
        source = "planned from this run's profile (exact maxima; plan.json)"
    elif source == "tf-defaults":
        source = "TF's defaults (256 / 256 / 64)"
    from profiles.display import short_stack_name  # a command's import (see the imports)
    rows = [("stack", "tables", "max_ids_per_table", "max_unique_ids_per_table")]
    for name, st in stacks.items():
        tables = list(st.tables)
        shown = ", ".join(tables) if len(tables) <= 3 else f"{tables[0]} … {tables[-1]} ({len(tables)})"
        rows.append((short_stack_name(name, tables), shown, str(lim.max_ids_per_table.get(name, "")),
                     str(lim.max_unique_ids_per_table.get(name, ""))))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"limits: {source}; max_ids_per_chip_per_sample={lim.max_ids_per_chip_per_sample}, "
             f"allow_id_dropping={lim.allow_id_dropping}"]
    lines += ["  " + "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
              for r in rows]
    return lines


def balance_table(m, output: str) -> list:
    """The balance per stacked table that the artifact's plan.json records (`profiles.balance_figures`): frequency order
    and balanced ids side by side, with the floor; nothing without a plan that has it."""
    plan_files = [f.path for f in m.files if f.kind == "plan"]
    if not plan_files:
        return []
    from profiles import load_plan  # a command's imports (see the imports)
    from profiles.balance_figures import balance_lines
    from tpu_embed.artifact import io as tio
    try:
        plan = load_plan(tio.join(output, plan_files[0]))
    except (OSError, ValueError):
        return []  # `inspect` says what is missing or damaged
    return balance_lines(plan.balance, {k: list(v.tables) for k, v in (m.stacks or {}).items()})
