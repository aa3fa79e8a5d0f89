"""Throughput of `tpu-embed run`, with the defaults a user gets, side by side with the floor of reading the same
data on one core, and with the same work in one process.

    .venv/bin/python benchmarks/run_throughput.py [--workload csv|quoted|quoted-tfrecord|tfrecord] [--examples N]
        [--workers 1]
        [--out build/bench] [--modes floor,single,beam] [--candidates N,N,...] [--repeat N]

Workloads (deterministic seeds):

* `csv` (default, 200 k examples unless --examples): synthetic Criteo-like data: label, 13 dense columns with
  blanks, 26 categorical columns of Zipf-distributed hex ids (up to ~10^6 values; `frequency_threshold: 2`),
  two of them multivalent ('|'-separated, 1-5 values), in 4 CSV files; global batch 4096 on 4 chips x 4
  SparseCores, with large pinned limits (`bench_spec`).
* `quoted` (1 M examples unless --examples): a wide CSV as pyarrow and pandas write it, every field quoted
  (blanks as ""): label, 13 dense columns with blanks, 26 categorical columns of hex tokens, column j drawn
  from a Zipf(1.1) over its own number of distinct values, 50 ... 500,000 (geometric steps), 10 % blanks; 4
  files, about 213 bytes a row. Frequency vocabularies with 1 OOV bucket: 10 columns (C7, C9, ..., C25) keep
  tokens seen twice or more, so their other tokens are OOV; the other 16 keep every token. Same topology,
  batch and pinned limits as `csv` (`bench_spec(..., "quoted")`).
* `quoted-tfrecord` (500 k examples unless --examples): the first rows of `quoted` as tf.train.Examples in 4
  TFRecord files (label and dense values as int64, tokens as bytes, a blank field a missing key); the same
  spec on TFRecord input.
* `tfrecord` (500 k examples unless --examples): `tpu-embed demo`'s data set and spec (pipelines/demo_data.py: 8
  TFRecord files of tf.train.Example, 13 dense and 30 categorical features, multivalent, weighted and sequence
  ones among them; global batch 2048, no pinned limits: `run` plans them from its own profile).

Modes, each in a child process of its own (wall time, CPU time and peak RSS of it and its children):

* `floor` (`pyarrow` for the CSV workloads, `tfxbsl` for the TFRecord ones): reading the files on one core,
  counting every categorical column and mapping every value to its vocabulary index (`pyarrow_baseline`,
  `tfxbsl_baseline`, both counting and mapping with `_count_and_map`).
* `single` (the CSV workloads): the work of the jobs in one process without Beam (`single_process`).
* `beam`: `runner.run_all` as `tpu-embed run` runs it with its defaults (the profile covers the spec's own
  topology, or the chip counts of --candidates; the transform output written, its graph already in the cache,
  as for every run of a spec after its first). Both jobs do the same work as `single`: read + parse, exact
  vocabularies, ids, global batches, per-chip CSR, shard records written, lookup statistics.
* `beam-bare`: the same with `--no-transform-output`; `beam-cold`: the same as `beam` with an empty cache (the
  first run of a spec: the transform graph built in a child process beside the jobs); `beam-noprofile`: the same
  as `beam` with `--no-profile` (no lookup statistics: what they cost; for workloads whose spec pins its limits).

With `--repeat N` the modes run one after the other N times (floor, run, floor, run, ...), each pass's ratio is
printed, and the figures are each mode's median pass: single runs of a few seconds move by 5-25 % on a shared
machine.

Prints a Markdown table row naming the workload and configuration, for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import time
from typing import Dict, List

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

NUM_CAT = 26
MULTIVALENT = ("C3", "C12")


def generate(out_dir: str, examples: int, files: int = 4, seed: int = 1234) -> None:
    rng = np.random.default_rng(seed)
    os.makedirs(out_dir, exist_ok=True)
    per = examples // files
    for fi in range(files):
        n = per if fi < files - 1 else examples - per * (files - 1)
        cols = {"label": pa.array((rng.random(n) < 0.25).astype(np.int64).astype(str))}
        for j in range(13):
            v = rng.zipf(1.5, n).astype(np.int64)
            s = v.astype(str).astype(object)
            s[rng.random(n) < 0.2] = ""
            cols[f"I{j + 1}"] = pa.array(s, pa.string())
        for j in range(NUM_CAT):
            name = f"C{j + 1}"
            card = int(10 ** (2 + j % 5))
            if name in MULTIVALENT:
                k = rng.integers(1, 6, n)
                ids = rng.zipf(1.2, int(k.sum())) % card
                toks = np.char.mod("%08x", ids)
                splits = np.concatenate([[0], np.cumsum(k)])
                vals = ["|".join(toks[splits[i]:splits[i + 1]]) for i in range(n)]
                cols[name] = pa.array(vals, pa.string())
            else:
                ids = rng.zipf(1.2, n) % card
                s = np.char.mod("%08x", ids).astype(object)
                s[rng.random(n) < 0.1] = ""
                cols[name] = pa.array(s, pa.string())
        pacsv.write_csv(pa.table(cols), os.path.join(out_dir, f"part-{fi:03d}.csv"))


QUOTED_CARDINALITIES = np.round(np.geomspace(50, 500_000, NUM_CAT)).astype(np.int64)  # distinct values of C1..C26
QUOTED_OOV = tuple(f"C{j}" for j in range(7, 26, 2))  # the 10 columns whose vocabulary keeps tokens seen >= 2 times


def _zipf_ranks(rng, card: int, n: int, s: float = 1.1) -> np.ndarray:
    """n draws from 1..card with P(r) proportional to r**-s."""
    cdf = np.cumsum(np.arange(1, card + 1, dtype=np.float64) ** -s)
    return np.searchsorted(cdf / cdf[-1], rng.random(n), side="right") + 1


def generate_quoted(out_dir: str, examples: int, files: int = 4, seed: int = 4321) -> None:
    """The `quoted` workload: every field quoted, as pyarrow's writer with quoting_style="all_valid" (and
    pandas with quoting=csv.QUOTE_ALL) write it; each categorical column's hex tokens are a random permutation
    of its ids, so a hot token is not always a short one."""
    rng = np.random.default_rng(seed)
    os.makedirs(out_dir, exist_ok=True)
    per = examples // files
    for fi in range(files):
        n = per if fi < files - 1 else examples - per * (files - 1)
        cols = {"label": pa.array((rng.random(n) < 0.25).astype(np.int64).astype(str))}
        for j in range(13):
            s = rng.zipf(1.5, n).astype(np.int64).astype(str).astype(object)
            s[rng.random(n) < 0.2] = ""
            cols[f"I{j + 1}"] = pa.array(s, pa.string())
        for j, card in enumerate(QUOTED_CARDINALITIES):
            perm = rng.permutation(int(card))
            s = np.char.mod("%x", perm[_zipf_ranks(rng, int(card), n) - 1]).astype(object)
            s[rng.random(n) < 0.1] = ""
            cols[f"C{j + 1}"] = pa.array(s, pa.string())
        pacsv.write_csv(pa.table(cols), os.path.join(out_dir, f"part-{fi:03d}.csv"),
                        pacsv.WriteOptions(quoting_style="all_valid"))


def generate_quoted_tfrecord(csv_dir: str, out_dir: str, examples: int, files: int = 4) -> None:
    """The `quoted-tfrecord` workload: the first `examples` rows of the `quoted` workload's files (in
    csv_dir) as tf.train.Examples in `files` TFRecord files: label and dense columns as one int64 each,
    categorical columns as one bytes token each; a blank field is a missing key, as a writer of such
    Examples leaves it."""
    import pyarrow.compute as pc

    from pipelines.read import splits
    from tpu_embed.artifact import tfrecord
    from tpu_embed.artifact.example_wire import encode_example, varint
    os.makedirs(out_dir, exist_ok=True)
    names = ["label"] + [f"I{j + 1}" for j in range(13)] + [f"C{j + 1}" for j in range(NUM_CAT)]
    kinds = {n: "bytes" if n.startswith("C") else "int64" for n in names}
    tables, have = [], 0
    for f in splits.list_input_files([os.path.join(csv_dir, "*.csv")]):
        if have >= examples:
            break
        t = pacsv.read_csv(f.path, convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names}))
        tables.append(t.slice(0, examples - have))
        have += tables[-1].num_rows
    table = pa.concat_tables(tables)
    cache = {n: {} for n in names}  # (key, value) -> its Example entry: tokens repeat (Zipf)

    def entry(n, v):
        e = cache[n].get(v)
        if e is None:
            value = [v.encode()] if kinds[n] == "bytes" else [int(v)]
            e = cache[n][v] = encode_example({n: (kinds[n], value)})[2:]  # the entry without the Example's head
        return e

    bounds = np.linspace(0, table.num_rows, files + 1).astype(int)
    for k in range(files):
        part = table.slice(int(bounds[k]), int(bounds[k + 1] - bounds[k]))
        cols = [(n, pc.fill_null(part.column(n), "").to_pylist()) for n in sorted(names)]
        with open(os.path.join(out_dir, f"part-{k:05d}.tfrecord"), "wb") as fh:
            out = []
            for i in range(part.num_rows):
                body = b"".join([entry(n, v[i]) for n, v in cols if v[i] != ""])
                out.append(tfrecord.frame(b"\x0a" + varint(len(body)) + body))
                if len(out) == 16384:
                    fh.write(b"".join(out))
                    out = []
            fh.write(b"".join(out))


def bench_spec(data_dir: str, batch: int, workload: str = "csv"):
    """The spec of the `csv` workload, or with workload="quoted" (or "quoted-tfrecord") of that one: the same
    topology, batch and limits; its vocabularies keep the tokens seen twice or more in QUOTED_OOV's columns,
    every token in the others, and it has no multivalent column."""
    from tpu_embed.artifact.spec import parse_spec
    cat = []
    for j in range(NUM_CAT):
        name = f"C{j + 1}"
        threshold = 2 if workload == "csv" or name in QUOTED_OOV else None
        d = {"name": name, "vocabulary": {"type": "frequency", "frequency_threshold": threshold, "num_oov_buckets": 1}}
        if name in MULTIVALENT and workload == "csv":
            d["delimiter"] = "|"
        cat.append(d)
    fmt, ext = ("tfrecord", "tfrecord") if workload.endswith("tfrecord") else ("csv", "csv")
    raw = {
        "name": "bench", "inputs": {"format": fmt, "patterns": [os.path.join(data_dir, "*." + ext)]},
        "label": {"column": "label"}, "dense": [f"I{j + 1}" for j in range(13)], "categorical": cat,
        "defaults": {"table": {"dim": 16}}, "optimizer": {"type": "adagrad", "learning_rate": 0.05},
        "topology": {"num_chips": 4, "num_sc_per_chip": 4, "num_hosts": 1}, "global_batch_size": batch,
        "limits": {"max_ids_per_chip_per_sample": 64, "allow_id_dropping": True},
    }
    # Zipf-hot ids overflow TF's default 256 ids per partition: use large limits (recorded in the manifest).
    stacks = parse_spec(raw, base_dir=data_dir).layout({f"C{j + 1}": 1000 for j in range(NUM_CAT)}).stacks
    raw["limits"].update({"max_ids_per_table": {s: 65536 for s in stacks},
                          "max_unique_ids_per_table": {s: 65536 for s in stacks}})
    return parse_spec(raw, base_dir=data_dir)


def single_process(spec, out: str, candidates) -> int:
    """The same work, plain Python + numpy, no Beam; with the job's threads and processes: the read and the
    parse each one thread ahead, the steps' records built one thread ahead while the next chunks are mapped,
    the profile statistics behind in a child process when the machine has 2 cores or more
    (`pipelines.profile_worker`, as the shard job's workers)."""
    import profiles
    from pipelines import profile_worker
    from pipelines.background import Behind, prefetched
    from pipelines.jobs.build_shards import BUILD_STEPS_AHEAD, PROFILE_STEPS_BEHIND
    from pipelines.mapping import ids as mapping
    from pipelines.mapping import vocabulary as pvocab
    from pipelines.read import parse, records, splits
    from pipelines.sharding import batches as batching
    from pipelines.sharding import packing_limits as shard_limits
    from pipelines.sharding import step_records
    from pipelines.token_index import TokenCounter, TokenIndex
    from tpu_embed.artifact import tfrecord
    files = splits.list_input_files(spec.input_patterns())

    def parsed():  # as the job: the read one thread ahead of the parse, itself one ahead of the counting
        for f in files:
            for i, item in enumerate(prefetched(splits.read_file(spec.inputs.format, f, spec.required_columns(),
                                                              encode=parse.encodable_columns(spec)))):
                if isinstance(item, records.RawBatch):
                    yield parse.parse_batch(item, spec, i)[0]

    chunks, per_key = [], collections.defaultdict(TokenCounter)
    for c in prefetched(parsed()):
        chunks.append(c)
        for k, t in pvocab.chunk_tokens(c, spec):
            per_key[k].add(t)
    vocabs, sizes = {}, {}
    os.makedirs(os.path.join(out, "vocab"), exist_ok=True)
    for k, counter in per_key.items():
        v = spec.vocabulary_groups()[k][0].vocabulary
        toks, _, _ = pvocab.finalize(pvocab.counts_table(counter), v.top_k, v.frequency_threshold)
        with open(os.path.join(out, "vocab", k + ".txt"), "wb") as fh:
            fh.write(pvocab.vocabulary_file_bytes(toks))
        vocabs[k] = TokenIndex(pa.array(toks, pa.large_binary()))  # as the job's workers: built once
        sizes[k] = max(1, len(toks))
    layout = spec.layout(sizes)
    limits = shard_limits.resolve_limits(spec, layout)
    B = spec.global_batch_size
    steps = sum(c.num_rows for c in chunks) // B

    def global_batches():  # chunks mapped to ids in order, each step as soon as its examples are all mapped
        counts, pieces, start = collections.Counter(), collections.defaultdict(list), 0
        done = 0  # the steps yielded
        while chunks:
            block = mapping.map_chunk(chunks.pop(0), spec, vocabs, counts)
            for s, piece in batching.split_into_steps(block, start, B, steps):
                pieces[s].append(piece)
            start += block.num_examples
            while done < min(steps, start // B):
                yield done, batching.assemble_step(pieces.pop(done), B, len(spec.dense))
                done += 1

    collector = profiles.ProfileCollector(spec.model(sizes), spec.topology, candidate_chip_counts=candidates)
    profile = (profile_worker.ProfileProcess(collector, PROFILE_STEPS_BEHIND)
               if profile_worker.use_child(collector.model) else
               profile_worker.ProfileThread(collector, PROFILE_STEPS_BEHIND))
    os.makedirs(os.path.join(out, "shards"), exist_ok=True)
    building = Behind(BUILD_STEPS_AHEAD)  # as the job: steps built one thread ahead of their writes

    def build(s, block):
        return (s,) + step_records.build_step(s, block, spec, layout, limits)

    with open(os.path.join(out, "shards", "host0.tfrecord"), "wb") as fh:
        def write(s, recs, gids, oov, _):
            for _, r in recs:
                fh.write(tfrecord.frame(r))
            profile.add_step(gids, oov, step=s, validate=False)  # as the job: the packed ids

        for s, block in global_batches():
            building.run(build, s, block)
            for built in building.results():
                write(*built)
        for built in building.close():
            write(*built)
    profiles.ProfileStore(os.path.join(out, "profiles")).write(collector.extract_output(profile.close()))
    return steps * spec.global_batch_size


def pyarrow_baseline(spec) -> int:
    """Read the CSV files with pyarrow on one core and map every categorical column to vocabulary ids.

    The floor the jobs are compared with: `pyarrow.csv.read_csv` of every column as strings (explicit
    column types, so nothing is inferred), then per categorical feature its values (a multivalent column's
    split on its delimiter) counted, its vocabulary made (blank left out, tokens with the feature's
    frequency_threshold, by count) and every value mapped to its index in it (`_count_and_map`).
    """
    import pyarrow.compute as pc
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    from pipelines.read import splits
    files = splits.list_input_files(spec.input_patterns())
    with open(files[0].path, "rb") as fh:
        names = pacsv.read_csv(fh, read_options=pacsv.ReadOptions(use_threads=False, block_size=1 << 16),
                               convert_options=pacsv.ConvertOptions(include_columns=[])).column_names
    types = {n: pa.string() for n in names}
    rows = 0
    per_column = collections.defaultdict(list)
    for f in files:
        t = pacsv.read_csv(f.path, read_options=pacsv.ReadOptions(use_threads=False),
                           convert_options=pacsv.ConvertOptions(column_types=types))
        rows += t.num_rows
        for feat in spec.categorical:
            col = t.column(feat.column)
            if feat.delimiter is not None:
                col = pc.list_flatten(pc.split_pattern(col, feat.delimiter))
            per_column[feat.name].append(col)
        del t
    _count_and_map(per_column, {f.name: f.vocabulary.frequency_threshold or 1 for f in spec.categorical})
    return rows


def _count_and_map(per_column, thresholds) -> None:
    """Per column: its values dictionary-encoded (one hash pass over them), the counts of the distinct ones
    from the codes, the vocabulary (blank left out, count >= the column's threshold, by count descending) and
    every value's index in it through the codes (-1: not in it; pyarrow.compute and numpy, one core)."""
    import pyarrow.compute as pc
    for name, cols in per_column.items():
        values = pa.chunked_array([c for cc in cols for c in (cc.chunks if hasattr(cc, "chunks") else [cc])])
        enc = pc.dictionary_encode(values).combine_chunks()
        codes = enc.indices.to_numpy()
        counts = np.bincount(codes, minlength=len(enc.dictionary))
        counts[pc.equal(pc.binary_length(enc.dictionary), 0).to_numpy(zero_copy_only=False)] = 0  # a blank: no token
        kept = np.flatnonzero(counts >= thresholds[name])
        order = kept[np.argsort(-counts[kept], kind="stable")]  # the vocabulary: its tokens enc.dictionary[order]
        index = np.full(len(enc.dictionary), -1, np.int64)
        index[order] = np.arange(order.size)
        ids = index[codes]
        assert ids.size == len(values)


TFXBSL_BATCH = 32768  # records per DecodeBatch (the jobs' default chunk rows)


def tfxbsl_baseline(spec) -> int:
    """Read the TFRecord files and decode them with tfx-bsl's C++ decoder on one core, then count and map every
    categorical column.

    The floor the jobs are compared with on TFRecord input: each file read whole; its frames split and both
    CRC32Cs of every frame checked (`tpu_embed.artifact.tfrecord.iter_records`, what any TFRecord reader does);
    the tf.train.Examples of every 32768 records decoded into an Arrow RecordBatch by tfx-bsl's
    `ExamplesToRecordBatchDecoder.DecodeBatch` (the decoder the jobs use); then, per categorical feature of the
    spec, its list column flattened, `pyarrow.compute.value_counts` of all its values, the vocabulary (count >=
    the feature's frequency_threshold) and `index_in` of every value. Dense features, weights and labels are
    decoded and not looked at further.
    """
    from tfx_bsl.coders import example_coder

    from pipelines.read import splits
    from tpu_embed.artifact import tfrecord
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    import pyarrow.compute as pc
    decoder = example_coder.ExamplesToRecordBatchDecoder()
    features = [f for f in spec.categorical if f.vocabulary.type == "frequency"]
    per_column = collections.defaultdict(list)
    rows = 0
    for f in splits.list_input_files(spec.input_patterns()):
        with open(f.path, "rb") as fh:
            data = fh.read()
        payloads = [payload for _, payload in tfrecord.iter_records(data, f.path)]
        del data
        for i in range(0, len(payloads), TFXBSL_BATCH):
            rb = decoder.DecodeBatch(payloads[i:i + TFXBSL_BATCH])
            rows += rb.num_rows
            for feat in features:
                per_column[feat.name].append(pc.list_flatten(rb.column(rb.schema.get_field_index(feat.column))))
    _count_and_map(per_column, {f.name: f.vocabulary.frequency_threshold or 1 for f in features})
    return rows


def tfrecord_spec(out: str, batch: int):
    """`tpu-embed demo`'s spec over its data set in out/data-tfrecord (written beside it as the demo writes it)."""
    from pipelines import demo_data
    from tpu_embed.artifact.spec import load_spec
    path = os.path.join(out, "spec-tfrecord.yaml")
    with open(path, "w") as fh:
        fh.write(demo_data.spec_text(["data-tfrecord/part-*.tfrecord"], path, batch))
    return load_spec(path)


def workload_spec(args):
    if args.workload == "tfrecord":
        return tfrecord_spec(args.out, args.batch)
    return bench_spec(data_dir(args), args.batch, args.workload)


def data_dir(args) -> str:
    return os.path.join(args.out, DATA_DIRS[args.workload])


FLOORS = {"csv": "pyarrow", "quoted": "pyarrow", "tfrecord": "tfxbsl", "quoted-tfrecord": "tfxbsl"}
DATA_DIRS = {"csv": "data", "quoted": "data-quoted", "tfrecord": "data-tfrecord",
             "quoted-tfrecord": "data-quoted-tfrecord"}
DEFAULT_EXAMPLES = {"csv": 200_000, "quoted": 1_000_000, "tfrecord": 500_000, "quoted-tfrecord": 500_000}


def _run_mode(mode: str, args) -> dict:
    from pipelines import runner
    from pipelines.jobs import JobConfig
    candidates = [int(x) for x in args.candidates.split(",")] if args.candidates else None
    spec = workload_spec(args)
    if mode == "tfxbsl":
        from tfx_bsl.coders import example_coder  # noqa: F401 - imported before the clock starts, as the jobs' modules
    t = time.time()
    if mode == "pyarrow":
        n = pyarrow_baseline(spec)
    elif mode == "tfxbsl":
        n = tfxbsl_baseline(spec)
    elif mode == "single":
        shutil.rmtree(os.path.join(args.out, "single"), ignore_errors=True)
        n = single_process(spec, os.path.join(args.out, "single"), candidates or ())
    else:
        shutil.rmtree(os.path.join(args.out, "beam"), ignore_errors=True)
        beam_args = []
        if args.workers > 1:
            beam_args = [f"--direct_num_workers={args.workers}", "--direct_running_mode=multi_processing"]
        # The defaults a user gets: `tpu-embed run --spec SPEC --output DIR` (candidate chip counts only if given),
        # which writes the transform output (beam-bare: --no-transform-output); its graph cached (beam) or not
        # (beam-cold: the first run of a spec where no cache has it).
        shutil.rmtree(os.path.join(args.out, "cache-cold"), ignore_errors=True)
        os.environ["TPU_EMBED_CACHE_DIR"] = os.path.join(args.out, "cache-cold" if mode == "beam-cold" else "cache")
        m = runner.run_all(JobConfig(spec=spec, output=os.path.join(args.out, "beam"),
                                     candidate_chip_counts=candidates, transform_output=mode != "beam-bare",
                                     write_profile=mode != "beam-noprofile"),
                           beam_args)
        n = m.counts.examples_written
    return {"mode": mode, "examples": n, "seconds": time.time() - t}


def _measure(mode: str, args) -> dict:
    """Run one mode in a child process: its wall time, CPU time and the peak RSS of it and its workers."""
    import json
    import subprocess
    cmd = [sys.executable, os.path.abspath(__file__), "--mode", mode, "--workload", args.workload, "--examples",
           str(args.examples), "--batch", str(args.batch), "--workers", str(args.workers), "--out", args.out,
           "--candidates", args.candidates]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status:
        raise SystemExit(f"{mode} failed (status {status})")
    res = json.loads(out.decode().strip().splitlines()[-1])
    res["peak_rss_mb"] = usage.ru_maxrss / 1024  # KiB on Linux; the largest of the child and its workers
    res["cpu_s"] = usage.ru_utime + usage.ru_stime  # the child's; its own children (workers) are in res
    return res


def _generate(args, data: str) -> None:
    if args.workload == "tfrecord":
        from pipelines import demo_data
        demo_data.write_dataset(data, num_examples=args.examples, seed=1234)
    elif args.workload == "quoted":
        generate_quoted(data, args.examples)
    elif args.workload == "quoted-tfrecord":  # from the quoted workload's 1 M rows (made first if missing)
        csv_dir = os.path.join(args.out, DATA_DIRS["quoted"])
        if not os.path.exists(os.path.join(csv_dir, f".complete-quoted-{DEFAULT_EXAMPLES['quoted']}")):
            shutil.rmtree(csv_dir, ignore_errors=True)
            generate_quoted(csv_dir, DEFAULT_EXAMPLES["quoted"])
            open(os.path.join(csv_dir, f".complete-quoted-{DEFAULT_EXAMPLES['quoted']}"), "w").close()
        generate_quoted_tfrecord(csv_dir, data, args.examples)
    else:
        generate(data, args.examples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=tuple(FLOORS), default="csv")
    ap.add_argument("--examples", type=int, help="default: 200000 (csv), 1000000 (quoted), 500000 (tfrecord: the "
                    "demo's)")
    ap.add_argument("--batch", type=int, help="global batch; default: 4096 (csv), 2048 (tfrecord: the demo's)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench"))
    ap.add_argument("--candidates", default="", help="profile candidate chip counts (comma-separated); default: "
                    "none given (the spec's own topology, as `tpu-embed run`)")
    ap.add_argument("--modes", default="floor,single,beam",
                    help="which measurements, in this order (floor: pyarrow for CSV, tfxbsl for TFRecord; also "
                         "beam-bare, beam-cold, beam-noprofile)")
    ap.add_argument("--repeat", type=int, default=1, help="passes over the modes (alternated); the figures are each "
                    "mode's median pass")
    ap.add_argument("--mode", help=argparse.SUPPRESS)  # internal: run one measurement in this process
    args = ap.parse_args()
    tfr = args.workload == "tfrecord"
    args.examples = args.examples or DEFAULT_EXAMPLES[args.workload]
    args.batch = args.batch or (2048 if tfr else 4096)
    args.out = os.path.abspath(args.out)
    data = data_dir(args)
    if args.mode == "generate":
        _generate(args, data)
        return
    if args.mode:
        import json
        print(json.dumps(_run_mode(args.mode, args)))
        return
    marker = os.path.join(data, f".complete-{'' if args.workload == 'csv' else args.workload + '-'}{args.examples}")
    if not os.path.exists(marker):
        shutil.rmtree(data, ignore_errors=True)
        t = time.time()
        # In a process of its own: this one stays small, so the measured processes it starts (their peak
        # RSS counts what they share with it until they exec) report their own memory only.
        import subprocess
        subprocess.run([sys.executable, os.path.abspath(__file__), "--mode", "generate", "--workload", args.workload,
                        "--examples", str(args.examples), "--out", args.out], check=True)
        open(marker, "w").close()
        print(f"generated {args.examples} examples in {time.time() - t:.1f} s", flush=True)
    modes = [FLOORS[args.workload] if m == "floor" else m for m in args.modes.split(",")]
    if tfr and "single" in modes:
        modes.remove("single")  # the one-process reference is written for the CSV workloads' pinned limits
    if "beam" in modes:  # the spec's transform graph in the cache first (built once, not in a measured process)
        from tpu_embed.serving.tft_output import TransformGraph
        os.environ["TPU_EMBED_CACHE_DIR"] = os.path.join(args.out, "cache")
        TransformGraph(workload_spec(args)).result()
    floor = FLOORS[args.workload]
    passes: Dict[str, List[dict]] = collections.defaultdict(list)
    for i in range(args.repeat):  # the modes one after the other, pass after pass
        for mode in modes:
            r = _measure(mode, args)
            passes[mode].append(r)
            print(f"{mode:8s}: {r['examples']:,} examples in {r['seconds']:.2f} s = "
                  f"{r['examples'] / r['seconds']:,.0f} examples/s, CPU {r['cpu_s']:.1f} s, "
                  f"peak RSS {r['peak_rss_mb']:,.0f} MB", flush=True)
        if args.repeat > 1 and floor in passes and "beam" in passes:
            f, b = passes[floor][-1], passes["beam"][-1]
            ratio = (f["examples"] / f["seconds"]) / (b["examples"] / b["seconds"])  # per example, as below
            print(f"pass {i + 1}: tpu-embed run is {ratio:.2f}x the time of {floor}", flush=True)
    # Each mode's median pass (the lower of the middle two for an even count): one slow pass of a noisy machine
    # does not make the figures.
    results = {m: sorted(rs, key=lambda r: r["seconds"])[(len(rs) - 1) // 2] for m, rs in passes.items()}
    if args.repeat > 1:
        print(f"medians of {args.repeat} passes: " + ", ".join(f"{m} {r['seconds']:.2f} s" for m, r in results.items()))
    rate = {k: v["examples"] / v["seconds"] for k, v in results.items()}
    if "beam" in rate:
        for base in ("single", floor):
            if base in rate:
                print(f"tpu-embed run is {rate[base] / rate['beam']:.2f}x the time of {base}")
    if "beam-bare" in rate:
        for mode in ("beam", "beam-cold"):
            if mode in rate:
                print(f"the transform output ({mode}) adds {rate['beam-bare'] / rate[mode] - 1:.1%} to tpu-embed run "
                      f"({results[mode]['seconds']:.2f} s against {results['beam-bare']['seconds']:.2f} s)")
    if "beam-noprofile" in rate and "beam" in rate:
        print(f"the lookup statistics add {rate['beam-noprofile'] / rate['beam'] - 1:.1%} to tpu-embed run "
              f"({results['beam']['seconds']:.2f} s against {results['beam-noprofile']['seconds']:.2f} s)")
        if floor in rate:
            print(f"tpu-embed run --no-profile is {rate[floor] / rate['beam-noprofile']:.2f}x the time of {floor}")
    if floor in rate and "beam" in rate:
        chips = args.candidates or "spec's own (default)"
        single = f"{rate['single']:,.0f}" if "single" in rate else "-"
        print(f"| workload | examples | batch | workers | profile chip counts | {floor} floor ex/s | single process "
              "ex/s | tpu-embed run ex/s | run / floor | peak RSS run (MB) |")
        print(f"| {args.workload} | {args.examples:,} | {args.batch} | {args.workers} | {chips} | {rate[floor]:,.0f} | "
              f"{single} | {rate['beam']:,.0f} | {rate[floor] / rate['beam']:.2f}x | "
              f"{results['beam']['peak_rss_mb']:,.0f} |")


if __name__ == "__main__":
    main()
