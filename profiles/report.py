"""HTML report with PNG plots of a profile and its plan.

    write_report(profile_or_dir, plan, out_dir) -> path of out_dir/index.html

Plots (matplotlib, Agg, no pyplot global state): ids per example per table,
per-SC load heat map per stack, planned limit against per-step maxima, hot
ids, mod vs div balance, and the plan's memory against TF's defaults.
"""

from __future__ import annotations

import html
import io
import math
import os
import textwrap
import warnings
from typing import Dict, List, Optional, Tuple, Union

import numpy as np

from profiles.balance_figures import balance_comparison
from profiles.display import natural_sorted, short_stack_name
from profiles.plan_file import Plan, load_plan
from profiles.planner import plan as make_plan
from profiles.profile import Profile
from profiles.store import ProfileStore
from tpu_embed.artifact import io as tio
from tpu_embed.artifact.manifest import read_manifest

DPI = 100
_COLORS = {"ids": "#1f77b4", "unique": "#ff7f0e", "limit": "#d62728", "default": "#7f7f7f", "planned": "#2ca02c",
           "mod": "#1f77b4", "div": "#9467bd"}


def _matplotlib():
    """matplotlib with its `figure` and `ticker` modules loaded."""
    # Imported here: matplotlib is an optional dependency (the `report` extra); only the report draws.
    try:
        import matplotlib.figure
        import matplotlib.ticker
    except ImportError:
        raise ImportError("the profile report draws with matplotlib, which is not installed. Fix: "
                          "pip install 'tpu-embed[report]'") from None
    return matplotlib


def _figure(n_panels: int, *, cols: int = 3, panel=(4.2, 3.0)):
    cols = max(1, min(cols, n_panels))
    rows = max(1, math.ceil(n_panels / cols))
    fig = _matplotlib().figure.Figure(figsize=(panel[0] * cols, panel[1] * rows), dpi=DPI, layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).reshape(-1)
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels]


def _save(fig, out_dir: str, name: str) -> str:
    # Titles are wrapped to the figure's width (narrow one-stack figures clipped them).
    width_in = fig.get_figwidth()
    if fig._suptitle is not None:
        size = fig._suptitle.get_fontsize()
        chars = max(30, int(width_in * 72 / (0.55 * size)))
        fig._suptitle.set_text(textwrap.fill(fig._suptitle.get_text().replace("\n", " "), chars))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    tio.write_atomic(tio.join(out_dir, name), buf.getvalue())
    return name


def _short(name: str, n: int = 34) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


# ---------------------------------------------------------------- plots

def plot_ids_per_example(profile: Profile, out_dir: str) -> str:
    """Histograms of ids per example for the tables where it varies (multivalent, sequence); the
    univalent ones (0 or 1 id per example) share one panel: the share of examples with an id."""
    tables = {n: profile.tables[n] for n in natural_sorted(profile.tables)}
    hists = {n: tp.stats.ids_per_example() for n, tp in tables.items()}
    varying = [n for n, h in hists.items() if h.max > 1]
    univalent = [n for n in tables if n not in varying]
    fig, axes = _figure(len(varying) + (1 if univalent else 0), cols=4, panel=(3.4, 2.5))
    axes = list(axes)
    if univalent:
        ax = axes.pop(0)
        shares = [1.0 - (dict(hists[n].sorted_items()).get(0, 0) / hists[n].total if hists[n].total else 0)
                  for n in univalent]
        ax.barh(range(len(univalent)), shares[::-1], color=_COLORS["ids"])
        ax.set_yticks(range(len(univalent)))
        ax.set_yticklabels([_short(n, 16) for n in univalent][::-1], fontsize=6 if len(univalent) > 12 else 7)
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of examples with an id", fontsize=8)
        ax.set_title(f"{len(univalent)} univalent tables (0 or 1 id)", fontsize=9)
        ax.tick_params(labelsize=7)
    for ax, name in zip(axes, varying):
        h = hists[name]
        items = h.sorted_items()
        if items:
            xs, ys = zip(*items)
            ax.bar(xs, [y / h.total for y in ys], width=0.8, color=_COLORS["ids"])
            ax.axvline(h.mean, color=_COLORS["limit"], lw=1, ls="--")
        ax.set_title(f"{_short(name, 26)}  (mean {h.mean:.2f}, max {h.max})", fontsize=9)
        ax.set_xlabel("ids per example", fontsize=8)
        ax.xaxis.set_major_locator(_matplotlib().ticker.MaxNLocator(integer=True))  # counts: no 0.6, 0.8 ... ticks
        ax.set_ylabel("share of examples", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle("Ids per example, where it varies (per table, all of its features; dashed: mean)", fontsize=11)
    return _save(fig, out_dir, "ids_per_example.png")


def plot_sc_heatmap(profile: Profile, out_dir: str, detail_limit: int = 6) -> str:
    """Per stack, ids per (local SC, destination SC) relative to the mean.  Beyond `detail_limit`
    stacks one compact map (a row per stack, local SCs summed) stays readable instead."""
    stacks = profile.stacks
    if len(stacks) > detail_limit:
        names = list(stacks)
        S = profile.global_config.num_sparse_cores
        rows = []
        for sp in stacks.values():
            m = sp.stats.sc_dest_ids
            d = m.sum(axis=0) if m is not None else np.zeros(S)
            rows.append(d / (d.sum() / d.size) if d.sum() else d)
        fig = _matplotlib().figure.Figure(figsize=(min(14, 4 + 0.25 * S), 1.2 + 0.28 * len(names)), dpi=DPI,
                                          layout="constrained")
        ax = fig.subplots()
        im = ax.imshow(np.array(rows), aspect="auto", cmap="viridis", interpolation="nearest", vmin=0)
        cb = fig.colorbar(im, ax=ax, shrink=0.9)
        cb.set_label("load / mean", fontsize=8)
        ax.set_yticks(range(len(names)))
        ax.set_yticklabels([f"{_short(n, 28)} ({stacks[n].stats.destination_balance():.2f})" for n in names],
                           fontsize=7)
        ax.set_xlabel("destination SparseCore", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.set_title("Ids per destination SparseCore, per stack (summed over chips, local SCs and steps); "
                     "balance = busiest / mean", fontsize=10)
        return _save(fig, out_dir, "sc_load_heatmap.png")
    fig, axes = _figure(len(stacks), cols=2, panel=(5.5, 2.6))
    for ax, (name, sp) in zip(axes, stacks.items()):
        m = sp.stats.sc_dest_ids
        if m is None or not m.sum():
            ax.text(0.5, 0.5, "no ids", ha="center", va="center", transform=ax.transAxes)
        else:
            rel = m / (m.sum() / m.size)
            im = ax.imshow(rel, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0)
            cb = fig.colorbar(im, ax=ax, shrink=0.9)
            cb.set_label("load / mean", fontsize=7)
            cb.ax.tick_params(labelsize=7)
        ax.set_title(f"{_short(name, 48)}  (balance {sp.stats.destination_balance():.2f})", fontsize=9)
        ax.set_xlabel("destination SparseCore", fontsize=8)
        ax.set_ylabel("local SC", fontsize=8)
        ax.set_yticks(range(profile.global_config.num_sc_per_chip))
        ax.tick_params(labelsize=7)
    fig.suptitle("Ids per (local SparseCore, destination SparseCore), summed over chips and steps", fontsize=11)
    return _save(fig, out_dir, "sc_load_heatmap.png")


def plot_balance_heatmaps(profile: Profile, out_dir: str, max_stacks: int = 6) -> Optional[str]:
    """Per stack counted both ways (balanced ids, `partition: {ids: balanced}`), its (local SC, destination SC)
    load relative to the mean with frequency-order ids and with the balanced ids, side by side on one colour
    scale; None for a profile counted one way only."""
    both = [(n, sp) for n, sp in profile.stacks.items() if sp.stats.frequency_order is not None][:max_stacks]
    if not both:
        return None
    fig, axes = _figure(2 * len(both), cols=2, panel=(5.2, 2.4))
    for i, (name, sp) in enumerate(both):
        pair = (("frequency order", sp.stats.frequency_order), ("balanced ids", sp.stats))
        maps = [st.sc_dest_ids for _, st in pair]  # type: ignore[union-attr]
        rel = [m / (m.sum() / m.size) if m is not None and m.sum() else None for m in maps]
        top = max((float(r.max()) for r in rel if r is not None), default=1.0)
        for ax, (label, st), r in zip(axes[2 * i:2 * i + 2], pair, rel):
            if r is None:
                ax.text(0.5, 0.5, "no ids", ha="center", va="center", transform=ax.transAxes)
            else:
                im = ax.imshow(r, aspect="auto", cmap="viridis", interpolation="nearest", vmin=0, vmax=top)
                cb = fig.colorbar(im, ax=ax, shrink=0.9)
                cb.set_label("load / mean", fontsize=7)
                cb.ax.tick_params(labelsize=7)
            ax.set_title(f"{_short(name, 30)}: {label}\nper step {st.step_destination_balance():.2f}, "  # type: ignore
                         f"floor {sp.stats.step_balance_floor() or 1.0:.2f}", fontsize=8)
            ax.set_xlabel("destination SparseCore", fontsize=8)
            ax.set_ylabel("local SC", fontsize=8)
            ax.set_yticks(range(profile.global_config.num_sc_per_chip))
            ax.tick_params(labelsize=7)
    fig.suptitle("The same steps with frequency-order ids (left) and the artifact's balanced ids (right): ids per "
                 "(local SparseCore, destination SparseCore), summed over chips and steps", fontsize=10)
    return _save(fig, out_dir, "balance_heatmap.png")


def plot_limits_over_steps(profile: Profile, plan: Plan, out_dir: str) -> str:
    stacks = profile.stacks
    many = len(stacks) > 6
    fig, axes = _figure(len(stacks), cols=4 if many else 2, panel=(3.6, 2.1) if many else (5.5, 2.8))
    handles = None
    for ax, (name, sp) in zip(axes, stacks.items()):
        series = sp.stats.series
        if series is not None and series.values:
            steps, ids, uniq, _ = series.arrays()
            style = dict(lw=0.8) if steps.size > 60 else dict(lw=0.8, marker=".", ms=3)
            ax.plot(steps, ids, color=_COLORS["ids"], label="busiest partition: ids", **style)
            ax.plot(steps, uniq, color=_COLORS["unique"], label="busiest partition: unique ids", **style)
        sp_plan = plan.stacks.get(name)
        title = _short(name, 40 if many else 56)
        if sp_plan is not None:
            ax.axhline(sp_plan.max_ids_per_table, color=_COLORS["ids"], ls="--", lw=1.2, label="max_ids_per_table")
            ax.axhline(sp_plan.max_unique_ids_per_table, color=_COLORS["unique"], ls=":", lw=1.4,
                       label="max_unique_ids_per_table")
            title += f"\nlimits {sp_plan.max_ids_per_table} ids / {sp_plan.max_unique_ids_per_table} unique ids"
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=8 if many else 9)
        ax.set_xlabel("step", fontsize=7)
        ax.set_ylabel("ids", fontsize=7)
        ax.tick_params(labelsize=7)
        handles = ax.get_legend_handles_labels()
    if handles and handles[0]:
        fig.legend(*handles, loc="outside lower center", ncol=4 if fig.get_figwidth() >= 8 else 2, fontsize=8,
                   frameon=False)
    fig.suptitle("Planned limits against each step's busiest (local SC, destination SC) partition; partition "
                 f"limits at {plan.policy.get('partition_quantile', 'max')} x{plan.policy.get('headroom', 1.0):g}",
                 fontsize=10)
    return _save(fig, out_dir, "limits_over_steps.png")


def plot_top_ids(profile: Profile, out_dir: str, k: int = 10, max_tables: int = 12,
                 tokens: Optional[Dict[str, "TokenLookup"]] = None) -> str:
    tables = list(profile.tables.items())
    top = {name: tp.stats.id_counts.top_k(k) for name, tp in tables}
    totals = {name: tp.stats.id_counts.total for name, tp in tables}
    # The most concentrated tables first: that is where hot ids hurt.
    order = sorted(tables, key=lambda kv: -(sum(c for _, c in top[kv[0]]) / max(totals[kv[0]], 1)))[:max_tables]
    fig, axes = _figure(len(order), cols=4, panel=(3.4, 2.6))
    for ax, (name, _) in zip(axes, order):
        pairs = top[name]
        if pairs:
            look = (tokens or {}).get(name)
            labels = [look.label(i) if look is not None else str(i) for i, _ in pairs][::-1]
            shares = [c / totals[name] for _, c in pairs][::-1]
            ax.barh(range(len(pairs)), shares, color=_COLORS["ids"])
            ax.set_yticks(range(len(pairs)))
            ax.set_yticklabels(labels, fontsize=7)
        ax.set_title(_short(name), fontsize=9)
        ax.set_xlabel("share of lookups", fontsize=8)
        ax.tick_params(labelsize=7)
    what = "tokens" if tokens else "ids"
    fig.suptitle(f"Top {k} {what} (exact counts) of the {len(order)} most concentrated tables", fontsize=11)
    return _save(fig, out_dir, "top_ids.png")


def plot_balance(plan: Plan, out_dir: str) -> Optional[str]:
    rows = [(n, plan.tables[n]) for n in natural_sorted(plan.tables) if "mod_balance" in plan.tables[n]]
    if not rows:
        return None
    fig, axes = _figure(1, cols=1, panel=(max(6.0, 0.45 * len(rows) + 2), 3.4))
    ax = axes[0]
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [t["mod_balance"] for _, t in rows], width=0.4, color=_COLORS["mod"], label="mod (SparseCore)")
    ax.bar(x + 0.2, [t["div_balance"] for _, t in rows], width=0.4, color=_COLORS["div"], label="div")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels([_short(n, 16) for n, _ in rows], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("busiest shard / mean shard", fontsize=8)
    top = max(max(t["mod_balance"], t["div_balance"]) for _, t in rows)
    ax.set_ylim(0, top * 1.25)  # room for the legend above the bars
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    ax.set_title(f"Load balance over {plan.global_config['num_chips'] * plan.global_config['num_sc_per_chip']} "
                 "shards: mod vs div partitioning (raw lookups)", fontsize=10)
    return _save(fig, out_dir, "balance.png")


def plot_memory(plan: Plan, out_dir: str) -> str:
    names = list(plan.stacks)
    fig, axes = _figure(1, cols=1, panel=(max(7.0, 0.6 * len(names) + 2), 3.6))
    ax = axes[0]
    x = np.arange(len(names))
    default = [plan.stacks[n].memory["tf_default_bytes_per_sc"] / 1024 for n in names]
    planned = [plan.stacks[n].memory["planned_bytes_per_sc"] / 1024 for n in names]
    ax.bar(x - 0.2, default, width=0.4, color=_COLORS["default"], label="TF defaults (256 / 256 / 64)")
    ax.bar(x + 0.2, planned, width=0.4, color=_COLORS["planned"], label="planned")
    ax.set_xticks(x)
    ax.set_xticklabels([_short(n, 20) for n in names], rotation=45 if len(names) > 4 else 0,
                       ha="right" if len(names) > 4 else "center", fontsize=7)
    ax.set_ylabel("KiB per SparseCore (model)", fontsize=8)
    ax.legend(fontsize=8)
    m = plan.memory
    ax.set_title("Memory per SparseCore (model), all stacks:\n"
                 f"planned {m['planned_bytes_per_sc'] / 1024:.1f} KiB vs {m['tf_default_bytes_per_sc'] / 1024:.1f} KiB "
                 f"with TF defaults, saving {m['saving_bytes_per_sc'] / 1024:.1f} KiB", fontsize=10)
    return _save(fig, out_dir, "memory.png")


# ---------------------------------------------------------------- HTML

def _table(headers: List[str], rows: List[list]) -> str:
    h = "".join(f"<th>{html.escape(str(c))}</th>" for c in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


_CSS = """body{font-family:sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.85em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f0f0f0}td:first-child{text-align:left}img{max-width:100%;border:1px solid #eee;margin:0.5em 0}
.warn{background:#fff4e0;border-left:4px solid #f0a000;padding:0.4em 1em;margin:0.3em 0;font-size:0.9em}"""


class TokenLookup:
    """Table row -> the token of the vocabulary file (rows past it are OOV buckets)."""

    def __init__(self, tokens: List[str]):
        self.tokens = tokens

    def label(self, row: int) -> str:
        row = int(row)
        if row < len(self.tokens):
            t = self.tokens[row]
            return t if len(t) <= 18 else t[:17] + "…"
        return f"OOV bucket {row - len(self.tokens)}"


def find_artifact(profile_dir: str) -> Optional[str]:
    """The artifact directory whose manifest names `profile_dir` as its profile directory, if any."""
    parent = tio.dirname(profile_dir.rstrip("/"))
    for candidate in (parent, profile_dir):
        if not candidate or not tio.exists(tio.join(candidate, "manifest.json")):
            continue
        try:
            m = read_manifest(candidate)
        except Exception:  # noqa: BLE001 - not an artifact we can read: the report works without it
            continue
        if m.profile is not None and os.path.normpath(tio.join(candidate, m.profile.directory)) == \
                os.path.normpath(profile_dir.rstrip("/")):
            return candidate
    return None


def token_lookups(artifact: str) -> Dict[str, TokenLookup]:
    """{table: TokenLookup} from the artifact's frequency vocabulary files."""
    m = read_manifest(artifact)
    out: Dict[str, TokenLookup] = {}
    for feat in (m.features or {}).values():
        if feat.vocabulary_file is None or feat.table in out:
            continue
        try:
            text = tio.read_bytes(tio.join(artifact, feat.vocabulary_file)).decode("utf-8", "replace")
        except Exception:  # noqa: BLE001
            continue
        out[feat.table] = TokenLookup(text.splitlines())
    return out


def _what_if_sections(plan: Plan) -> List[str]:
    """The plan's what-if (other configurations from the recorded steps) and, with --propose, its comparison of
    placements, as HTML tables; each figure with its sampling."""
    parts: List[str] = []
    what = plan.what_if or {}
    rows = [r for r in what.get("configurations", []) if r["status"] == "evaluated"]
    if rows:
        parts.append("<h2>What-if: other chips, SparseCores per chip and batches</h2>")
        parts.append(f"<p>From the steps the profile job recorded ({html.escape(what['recorded'])}), TensorFlow's "
                     "stacking of each configuration; sampled figures are a sample's maxima, not limits "
                     "(<code>--candidate-chip-counts</code> profiles a chip count exactly).</p>")
        parts.append(_table(
            ["configuration", "chips x SCs", "global batch", "stacks", "max_ids_per_table (largest)",
             "max_unique_ids_per_table (largest)", "max_ids_per_chip_per_sample", "KiB/SC", "balance", "floor",
             "sampling"],
            [[r["label"], f"{r['num_chips']} x {r['num_sc_per_chip']}", r["global_batch"], len(r["stacks"]),
              max(s["max_ids_per_table"] for s in r["stacks"].values()),
              max(s["max_unique_ids_per_table"] for s in r["stacks"].values()), r["max_ids_per_chip_per_sample"],
              r["bytes_per_sc"] / 1024, r["balance"], r["floor"], r["sampling"]["text"]] for r in rows]))
    prop = plan.proposal
    if prop:
        chosen = set(prop["chosen"].values())
        parts.append("<h2>Placements compared (tpu-embed plan --propose)</h2>")
        parts.append(f"<p>Per step, from the recorded steps ({html.escape(prop['sampling']['text'])}), under the "
                     "cost model of docs/explanation/partitioning.md: the busiest destination SparseCore's ids, rows "
                     "gathered and traffic summed over the stacks (one kernel each), and buffer memory; no TPU "
                     "step time is measured.</p>")
        parts.append(_table(
            ["placement", "API", "kernels", "ids/step", "rows/step", "traffic KiB/step", "balance", "floor",
             "buffer KiB/SC", "TensorCore KiB/step", "chosen"],
            [[c["label"], c["api"], c["kernels"], c["busiest_ids_per_step"], c["busiest_unique_ids_per_step"],
              c["traffic_bytes_per_step"] / 1024, c["balance"], c["floor"], c["buffer_bytes_per_sc"] / 1024,
              c["tensor_core_bytes_per_step"] / 1024, "yes" if c["label"] in chosen else ""]
             for c in prop["candidates"]]))
    return parts


def write_report(profile_or_dir: Union[Profile, str, os.PathLike], plan: Union[Plan, str, os.PathLike, None],
                 out_dir: Union[str, os.PathLike], artifact: Optional[str] = None) -> str:
    """Write out_dir/index.html and its PNGs; returns the HTML path.  `plan` may be None (planned
    here with quantile 'max').  `artifact`: the artifact directory the profile belongs to (found from
    a profile directory's parent when not given): its spec fingerprint identifies the model and its
    vocabulary files name the top ids."""
    out_dir = os.fspath(out_dir)
    tio.makedirs(out_dir)
    profile, plan, fingerprint, tokens = _inputs(profile_or_dir, plan, artifact)
    images = _images(profile, plan, out_dir, tokens)
    balance = plan.balance if plan.balance is not None else balance_comparison(profile, **{
        k: plan.policy[k] for k in ("quantile", "partition_quantile", "headroom") if k in plan.policy})
    parts = _summary_section(profile, plan, fingerprint) + _limits_sections(plan) + _balance_section(balance)
    for title, name in images:
        parts.append(f"<h2>{html.escape(title)}</h2><img src='{html.escape(name)}' alt='{html.escape(title)}'>")
    parts += _topologies_section(plan) + _what_if_sections(plan) + _stacking_section(plan)
    parts.append("</body></html>")
    path = tio.join(out_dir, "index.html")
    tio.write_text_atomic(path, "\n".join(parts))
    return path


def _inputs(profile_or_dir: Union[Profile, str, os.PathLike], plan: Union[Plan, str, os.PathLike, None],
            artifact: Optional[str]) -> Tuple[Profile, Plan, Optional[str], Dict[str, TokenLookup]]:
    """The profile, its plan (made here when not given), the artifact's spec fingerprint and vocabularies."""
    if isinstance(plan, (str, os.PathLike)):
        plan = load_plan(plan)
    if isinstance(profile_or_dir, Profile):
        profile = profile_or_dir
    else:
        profile = ProfileStore(os.fspath(profile_or_dir)).read(model=plan.model_key if plan is not None else None)
        if artifact is None:
            artifact = find_artifact(os.fspath(profile_or_dir))
    fingerprint = None
    tokens: Dict[str, TokenLookup] = {}
    if artifact is not None:
        fingerprint = read_manifest(artifact).spec_fingerprint
        tokens = token_lookups(artifact)
    if plan is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # recorded in plan.warnings, shown in the page
            plan = make_plan(profile)
    return profile, plan, fingerprint, tokens


def _images(profile: Profile, plan: Plan, out_dir: str, tokens: Dict[str, TokenLookup]) -> List[Tuple[str, str]]:
    """(title, PNG file name) of every plot, drawn into `out_dir`, in page order."""
    images = [("Planned limits against per-step maxima", plot_limits_over_steps(profile, plan, out_dir)),
              ("Memory per SparseCore: plan vs TF defaults", plot_memory(plan, out_dir)),
              ("Per-SparseCore load", plot_sc_heatmap(profile, out_dir)),
              ("Ids per example", plot_ids_per_example(profile, out_dir)),
              ("Hot ids", plot_top_ids(profile, out_dir, tokens=tokens))]
    bal = plot_balance(plan, out_dir)
    if bal:
        images.insert(3, ("mod vs div partitioning", bal))
    both = plot_balance_heatmaps(profile, out_dir)
    if both:
        images.insert(3, ("Frequency order and balanced ids", both))
    return images


def _summary_section(profile: Profile, plan: Plan, fingerprint: Optional[str]) -> List[str]:
    """The page's head: what was profiled and planned, the chip counts covered, the plan's warnings."""
    g = profile.global_config
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>tpu_embed profile report</title>"
             f"<style>{_CSS}</style></head><body>",
             "<h1>SparseCore lookup profile and plan</h1>",
             (f"<p>Spec fingerprint {html.escape(fingerprint[:16])} (the artifact's manifest.json): "
              if fingerprint else f"<p>Model {html.escape(profile.model.key)}: ")
             + f"{len(profile.model.tables)} tables, "
             f"{len(profile.model.features)} features, {len(profile.stacks)} stacked tables; {g.num_chips} chips x "
             f"{g.num_sc_per_chip} SparseCores ({g.num_hosts} host{'s' if g.num_hosts != 1 else ''}), "
             f"{g.per_chip_batch} examples per chip; "
             f"{profile.steps} steps profiled. Plan policy: id buffer at {html.escape(str(plan.policy['quantile']))}, "
             f"partition limits at {html.escape(str(plan.policy.get('partition_quantile', 'max')))}, headroom "
             f"x{plan.policy['headroom']:g}.</p>",
             f"<p>Chip counts this profile has figures for (same global batch): "
             f"{', '.join(map(str, profile.covered_chip_counts))}. Another chip count is planned from a profile "
             "that covered it: <code>--candidate-chip-counts</code> on the job, or "
             "<code>profile_candidate_chip_counts</code> in the spec.</p>"]
    for w in plan.warnings:
        parts.append(f"<div class='warn'>{html.escape(w)}</div>")
    return parts


def _limits_sections(plan: Plan) -> List[str]:
    """The SparseCoreEmbeddingConfig settings, then each stack's limits beside what was observed."""
    return [
        "<h2>SparseCoreEmbeddingConfig</h2>",
        _table(["setting", "value"], [
            ["max_ids_per_chip_per_sample", plan.max_ids_per_chip_per_sample],
            ["allow_id_dropping", plan.allow_id_dropping],
            ["disable_table_stacking", plan.disable_table_stacking],
            ["ids dropped (at most, profiled data)", plan.memory.get("drop_rate_at_most", 0.0)],
            ["steps that would fail (partition limits)", plan.memory.get("steps_failing", 0.0)]]),
        _table(
            ["stack", "tables", "max_ids_per_table", "observed max", "p99.9", "max_unique_ids_per_table",
             "observed max", "buffer slots (cap / max)", "drop rate at most", "KiB/SC planned", "KiB/SC TF default",
             "origin"],
            [[short_stack_name(n, s.tables), len(s.tables), s.max_ids_per_table, s.observed["max_ids"]["max"],
              s.observed["max_ids"]["p99.9"],
              s.max_unique_ids_per_table, s.observed["max_unique_ids"]["max"],
              f"{s.drops['buffer_capacity_slots']} / {s.observed['chip_buffer_slots']['max']}",
              s.drops["drop_rate_at_most"], s.memory["planned_bytes_per_sc"] / 1024,
              s.memory["tf_default_bytes_per_sc"] / 1024, s.origin] for n, s in plan.stacks.items()])]


def _balance_section(balance: Optional[dict]) -> List[str]:
    """Per stacked table its balance and floor in each order of ids, and the limits a plan makes of them."""
    if not balance:
        return []
    return [
        "<h2>Balance per stacked table</h2>",
        "<p>The busiest destination SparseCore against the mean, per step and summed over steps (1.00 "
        "is perfect), its worst step, and the floor no assignment of ids can beat (per step the larger "
        "of the hottest id's lookups and the mean); the limits and bytes per SparseCore a plan makes of "
        "them. " + ("Both orders are the same steps, counted in one pass." if balance["ids"] ==
                    "balanced" else "<code>partition: {ids: balanced}</code> in the spec assigns ids "
                    "that even the load out.") + "</p>",
        _table(
            ["stack", "ids", "per step", "worst step", "over data", "floor", "floor (worst step)",
             "max_ids_per_table", "max_unique_ids_per_table", "KiB/SC"],
            [[short_stack_name(n, s["tables"]), order, o["step_balance"], o["worst_step_balance"], o["data_balance"],
              s["floor"]["step_balance"], s["floor"]["worst_step"], o["max_ids_per_table"],
              o["max_unique_ids_per_table"], o["bytes_per_sc"] / 1024]
             for n, s in balance["stacks"].items() for order, o in s["orders"].items()])]


def _topologies_section(plan: Plan) -> List[str]:
    if not plan.topologies:
        return []
    return [
        "<h2>Other chip counts (same global batch, exact maxima)</h2>",
        _table(
            ["chips", "status", "per-chip batch", "SparseCores", "max_ids_per_chip_per_sample", "KiB/SC",
             "worst destination balance", "note"],
            [[t["num_chips"], t["status"], t.get("per_chip_batch", ""), t.get("num_sparse_cores", ""),
              t.get("max_ids_per_chip_per_sample", ""),
              (t["bytes_per_sc"] / 1024) if "bytes_per_sc" in t else "",
              t.get("worst_destination_balance", ""), t.get("reason", "")] for t in plan.topologies])]


def _stacking_section(plan: Plan) -> List[str]:
    st = plan.stacking
    un = st.get("unstacked")
    return ["<h2>Stacking</h2>",
            f"<p>{html.escape(st['mode'])}: {len(st['stacks'])} stacks, "
            f"{st['stacked_bytes_per_sc'] / 1024:.1f} KiB/SC"
            + (f"; with disable_table_stacking: {un['stacks']} stacks, {un['bytes_per_sc'] / 1024:.1f} KiB/SC "
               f"({html.escape(st.get('recommendation', ''))})" if un else "") + ".</p>",
            "<p>Memory figures follow the model documented in profiles/SCHEMA.md, not a TPU measurement.</p>"]
