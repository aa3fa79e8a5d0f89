"""`tpu-embed inspect DIR`: an artifact's manifest summary, then its first shard records decoded."""

from __future__ import annotations

from typing import List

from pipelines.cli.artifact_summary import summary
from pipelines.cli.help_text import COMMANDS, description
from pipelines.user_errors import UserError

# The artifact readers (the pydantic manifest, the record codec) are imported by the command, not here:
# `tpu-embed --help` builds only the parser.


def add_parser(sub) -> None:
    sp = sub.add_parser("inspect", help=COMMANDS["inspect"], description=description(
        "inspect", "The manifest's summary (topology, vocabularies, counts, limits, files), then the host's first "
                   "shard records: per chip and stacked table, the ids it holds, the slots they take with each "
                   "partition padded to 8, the id buffer TPUEmbeddingV2.dequeue receives, and the ids the "
                   "limits dropped."))
    sp.add_argument("artifact", help="artifact directory")
    sp.add_argument("--host", type=int, default=0, metavar="H",
                    help="the host whose shard records are decoded (default 0; 0..num_hosts-1)")
    sp.add_argument("--steps", type=int, default=None, metavar="N",
                    help="decode and summarise this many records (default 1; with --json, none unless given)")
    sp.add_argument("--json", action="store_true",
                    help="print the manifest as JSON; with --steps N, {\"manifest\": ..., \"records\": [the N "
                         "decoded records]}")
    sp.add_argument("--unseen-days", type=int, default=1, metavar="N",
                    help="a lineage's vocabularies: count the tokens in use not seen for N days or more "
                         "(last_day <= day - N), those a retiring policy would free (default 1: not seen this day)")
    sp.set_defaults(func=cmd_inspect)


def cmd_inspect(args, beam_args):
    import json  # a command's imports (see the imports)

    from tpu_embed.artifact import verify
    m = _read_manifest(args.artifact)
    if args.steps is not None and args.steps < 0:
        raise UserError(f"--steps {args.steps}: give a number of records, 0 or more.")
    if args.unseen_days < 1:
        raise UserError(f"--unseen-days {args.unseen_days}: give a number of days, 1 or more.")
    problem = None
    try:  # unfinished, or a listed file missing or of another size: said after what the manifest says
        verify.check_listed(args.artifact, m)
        for h in range(m.shard_format.num_hosts if m.shards is not None else 0):
            verify.check_shard_steps(m, h)
    except verify.ArtifactDamagedError as e:
        problem = e
    steps = args.steps if args.steps is not None else (0 if args.json else 1)
    records = _first_records(args.artifact, args.host, m, steps) if problem is None else []
    if args.json:
        if args.steps is None:  # the manifest as written
            print(m.to_bytes().decode("utf-8"), end="")
        else:
            print(json.dumps({"manifest": m.to_json(), "records": [_record_json(r) for r in records]}, indent=1))
        if problem is not None:
            raise problem
        return 0
    print(summary(m, args.artifact, args.unseen_days))
    if problem is not None:
        raise problem
    for r in records:
        print("\n".join(record_lines(m, r)))
    return 0


def _read_manifest(artifact: str):
    """The artifact's manifest; an unfinished artifact with none yet is said as such."""
    from tpu_embed.artifact import verify  # a command's imports (see the imports)
    from tpu_embed.artifact.manifest import ManifestNotFoundError, read_manifest
    try:
        return read_manifest(artifact)
    except ManifestNotFoundError:
        run = verify.read_run_marker(artifact)
        if run is None:
            raise
        raise verify.unfinished_error(artifact, run, "an unfinished artifact with no manifest yet") from None


def _first_records(artifact: str, host: int, m, steps: int) -> List[dict]:
    """The first `steps` shard records of `host`, decoded (none where the artifact has no shards)."""
    from tpu_embed.artifact import shard_records, tfrecord  # a command's imports (see the imports)
    records: List[dict] = []
    if not steps or m.shards is None:
        return records
    fmt = m.shard_format
    if not 0 <= host < fmt.num_hosts:
        raise UserError(f"--host {host}: {artifact} has {fmt.num_hosts} host(s), "
                        f"so --host must be in 0..{fmt.num_hosts - 1}.")
    for path in shard_records.shard_files(artifact, host, m):
        for rec in tfrecord.read_records(path):
            if len(records) >= steps:
                break
            records.append(shard_records.decode_record(rec, fmt))
    return records


def record_lines(m, r) -> List[str]:
    """A decoded shard record (`shard_records.decode_record`) in a few lines: per chip and stacked table, the
    ids it holds, the slots they take in the CSR arrays (each partition padded to a multiple of 8, as TF lays
    them out), the id buffer `TPUEmbeddingV2.dequeue` receives (max_ids_per_chip_per_sample x samples, the
    static size `input_fn` pads to), the row pointers and the ids the limits dropped."""
    from profiles.display import short_stack_name  # a command's imports (see the imports)
    from tpu_embed.sparsecore.padding import PAD_VALUE
    per_sample = m.limits.max_ids_per_chip_per_sample if m.limits is not None else None
    lines = [f"host {r['host']} step {r['step']}: {int(r['mask'].sum())} examples, "
             f"label mean {float(r['label'].mean()) if r['label'].size else 0:.3f}"]
    for c, chip in enumerate(r["sparse_core"]):
        for stack, d in chip.items():
            ids = int((d["sorted_token_ids"] != PAD_VALUE).sum())
            buffer = f" of a {per_sample * d['sample_count']}-id buffer" if per_sample else ""
            lines.append(f"  chip {c} {short_stack_name(stack, m.stacks[stack].tables)}: {ids} ids in "
                         f"{d['ids_unpadded_size']} slots{buffer}, {d['row_pointers_unpadded_size']} row pointers, "
                         f"{d['dropped_ids']} dropped")
    return lines


def _record_json(r) -> dict:
    """A decoded shard record as JSON: its arrays as lists."""
    def plain(x):
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x.tolist() if hasattr(x, "tolist") else x
    return plain(r)
