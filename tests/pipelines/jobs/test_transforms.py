"""Each transform alone with TestPipeline + assert_that, plus bad input, policies and --strict."""

from __future__ import annotations

import collections
import json
import os
import typing

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines import jobs, runner
from pipelines.cli import main as cli_main
from pipelines.jobs import (
    build_shards,
    collect_profile,
    compute_vocabulary,
    counters,
    global_batches,
    manifest_writer,
    map_to_ids,
    read_examples,
)
from pipelines.mapping import ids as mapping
from pipelines.mapping import vocabulary as pvocab
from pipelines.read import parse, records, splits
from pipelines.sharding import batches as batching
from pipelines.token_index import TokenCounter
from profiles.errors import ProfileMismatchError
from profiles.store import ProfileStore
from tpu_embed.artifact import tfrecord
from tpu_embed.artifact.spec import parse_spec

RUNNER = ["--runner=DirectRunner", "--direct_running_mode=in_memory"]


def tp():
    return BeamTestPipeline(argv=RUNNER, blocking=True)


def small_spec(tmp_path, fmt="csv", patterns=("*.csv",), **over):
    raw = {
        "inputs": {"format": fmt, "patterns": list(patterns)},
        "label": {"column": "label"},
        "dense": [{"name": "x", "fill": -1.0}],
        "categorical": [
            {"name": "c", "delimiter": "|", "weight_column": "w", "vocabulary": {"num_oov_buckets": 1}},
            {"name": "d", "vocabulary": {"type": "identity", "num_buckets": 10}},
        ],
        "defaults": {"table": {"dim": 8}},
        "optimizer": {"type": "sgd", "learning_rate": 0.1},
        "topology": {"num_chips": 1},
        "global_batch_size": 4,
    }
    raw.update(over)
    return parse_spec(raw, base_dir=str(tmp_path))


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(p)


GOOD = "label,x,c,w,d\n1,0.5,a|b,1|2,3\n0,,b,0.5,4\n1,2,,,\n0,3,a|a|c,1|1|1,9\n1,4,b,1,1\n"
BAD = ("label,x,c,w,d\n"
       "1,0.5,a,1,3\n"          # line 2 ok
       "1,abc,a,1,3\n"          # line 3 unparsable number
       ",1,a,1,3\n"             # line 4 blank label (no fill)
       "1,1,a|b,1,3\n"          # line 5 weight mismatch
       "1,1,a,1,3,extra\n"      # line 6 malformed (too many columns)
       "0,1,b,nan,12\n")        # line 7 ok: NaN weight and out-of-range id are policies, not dead letters


def test_read_examples_and_dead_letters(tmp_path):
    write(tmp_path, "a_good.csv", GOOD)
    write(tmp_path, "b_bad.csv", BAD)
    write(tmp_path, "c_missing.csv", "label,x,c\n1,2,a\n")
    write(tmp_path, "d_empty.csv", "")
    spec = small_spec(tmp_path)
    files = splits.list_input_files(spec.input_patterns())
    assert [os.path.basename(f.path) for f in files] == ["a_good.csv", "b_bad.csv", "c_missing.csv", "d_empty.csv"]
    with tp() as p:
        out = p | read_examples.ReadExamples(spec, files)
        assert_that(out["chunks"] | beam.Map(lambda c: (c.file_index, c.num_rows)), equal_to([(0, 5), (1, 2)]),
                    label="chunks")
        assert_that(out["dead"] | beam.Map(lambda d: (os.path.basename(d.file), d.record, d.reason)), equal_to([
            ("b_bad.csv", 3, "unparsable_number"), ("b_bad.csv", 4, "missing_value"),
            ("b_bad.csv", 5, "weight_mismatch"), ("b_bad.csv", 6, "malformed_record"),
            ("c_missing.csv", -1, "missing_columns"), ("d_empty.csv", -1, "empty_file")]), label="dead")
        stats = out["stats"] | beam.CombineGlobally(counters.SumCounters())
        assert_that(stats | beam.Map(lambda s: (s["records_read"], s["records_valid"], s["files_read"])),
                    equal_to([(11, 7, 4)]), label="stats")


def test_strict_stops_with_file_and_record(tmp_path, capsys):
    write(tmp_path, "b_bad.csv", BAD)
    spec = small_spec(tmp_path)
    files = splits.list_input_files(spec.input_patterns())
    with pytest.raises(Exception, match=r"b_bad.csv record 3: unparsable_number"):
        with tp() as p:
            _ = p | read_examples.ReadExamples(spec, files, strict=True)


def test_strict_names_a_whole_file_as_such(tmp_path):
    write(tmp_path, "c_missing.csv", "label,x\n1,2\n")
    spec = small_spec(tmp_path)
    files = splits.list_input_files(spec.input_patterns())
    with pytest.raises(Exception, match=r"--strict: \S*c_missing.csv whole file: missing_columns") as e:
        with tp() as p:
            _ = p | read_examples.ReadExamples(spec, files, strict=True)
    assert "record -1" not in str(e.value)


def test_policies_counted_and_dead_letter_files(tmp_path):
    write(tmp_path, "b_bad.csv", BAD)
    spec = small_spec(tmp_path)
    out = str(tmp_path / "out")
    m = runner.run_all(jobs.JobConfig(spec=spec, output=out, write_profile=False, tail="pad"))
    c = m["counts"]
    assert c["records_read"] == 6 and c["records_invalid"] == 4
    assert c["dead_letters"] == {"malformed_record": 1, "missing_value": 1, "unparsable_number": 1,
                                 "weight_mismatch": 1}
    assert c["ids"]["c"]["nan_weights_dropped"] == 1
    assert c["ids"]["d"]["invalid_ids_dropped"] == 1
    assert c["examples_written"] == 2 and c["examples_padding"] == 2
    dl = [f for f in m["files"] if f["kind"] == "dead_letter"]
    assert len(dl) == 1 and dl[0]["records"] == 4
    lines = [json.loads(x) for x in open(os.path.join(out, dl[0]["path"]))]
    assert [x["record"] for x in lines] == [3, 4, 5, 6]
    assert "abc" in lines[0]["detail"]
    # error policies stop the job with a message naming the feature and the fix
    spec_err = small_spec(tmp_path, policies={"invalid_ids": "error"})
    with pytest.raises(Exception, match=r"feature 'd'.*policies.invalid_ids"):
        runner.run_all(jobs.JobConfig(spec=spec_err, output=str(tmp_path / "out2"), write_profile=False))


def test_cli_strict_message(tmp_path, capsys):
    write(tmp_path, "b_bad.csv", BAD)
    spec_path = write(tmp_path, "spec.yaml", json.dumps({
        "inputs": {"format": "csv", "patterns": ["*.csv"]}, "label": "label",
        "categorical": [{"name": "c", "delimiter": "|"}], "defaults": {"table": {"dim": 8}},
        "optimizer": {"type": "sgd", "learning_rate": 0.1}, "global_batch_size": 4}))
    rc = cli_main(["vocab", "--spec", spec_path, "--output", str(tmp_path / "o"), "--strict"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "b_bad.csv record 4: missing_value" in err


def test_tfrecord_and_parquet_readers(tmp_path):
    import tensorflow as tf

    def example(label, c, d):
        return tf.train.Example(features=tf.train.Features(feature={
            "label": tf.train.Feature(float_list=tf.train.FloatList(value=[label])),
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=[1.5])),
            "c": tf.train.Feature(bytes_list=tf.train.BytesList(value=c)),
            "w": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * len(c))),
            "d": tf.train.Feature(int64_list=tf.train.Int64List(value=[d])),
        })).SerializeToString()

    recs = [example(1, [b"a", b"b"], 3), b"\x08\x01garbage", example(0, [b"b"], 4),
            tf.train.Example().SerializeToString()]  # the last one has no label -> missing_value
    write(tmp_path, "part.tfrecord", b"".join(tfrecord.frame(r) for r in recs))
    spec = small_spec(tmp_path, fmt="tfrecord", patterns=["*.tfrecord"])
    files = splits.list_input_files(spec.input_patterns())
    with tp() as p:
        out = p | read_examples.ReadExamples(spec, files)
        assert_that(out["chunks"] | beam.FlatMap(lambda c: c.features["c"].tokens.to_pylist()),
                    equal_to([b"a", b"b", b"b"]), label="tokens")
        assert_that(out["dead"] | beam.Map(lambda d: (d.record, d.reason)),
                    equal_to([(1, "malformed_record"), (3, "missing_value")]), label="dead")

    table = pa.table({"label": pa.array([1.0, 0.0]), "x": pa.array([None, 2.0]),
                      "c": pa.array([["a", "b"], ["c"]]), "w": pa.array([[1.0, 2.0], [1.0]]),
                      "d": pa.array(["3", "x"])})
    pq.write_table(table, str(tmp_path / "p.parquet"))
    spec = small_spec(tmp_path, fmt="parquet", patterns=["*.parquet"])
    raw = next(it for it in splits.read_file("parquet", splits.list_input_files(spec.input_patterns())[0],
                                          spec.required_columns()) if isinstance(it, records.RawBatch))
    chunk, dead = parse.parse_batch(raw, spec)
    assert dead == [] and chunk.dense[:, 0].tolist() == [-1.0, 2.0]
    counts = collections.Counter()
    block = mapping.map_chunk(chunk, spec, {"c": pa.array([b"b", b"a"], pa.large_binary())}, counts)
    assert block.features["c"].ids.tolist() == [1, 0, 2]  # c is OOV -> bucket 2
    assert block.features["d"].ids.tolist() == [3] and counts["feature/d/invalid_ids_dropped"] == 1


def test_compute_vocabulary_combine(tmp_path):
    write(tmp_path, "a.csv", GOOD)
    spec = small_spec(tmp_path)
    files = splits.list_input_files(spec.input_patterns())
    out = str(tmp_path / "o")
    with tp() as p:
        chunks = (p | read_examples.ReadExamples(spec, files))["chunks"]
        v = chunks | compute_vocabulary.ComputeVocabulary(spec, out)
        assert_that(v["vocabularies"] | beam.Map(lambda d: (d["key"], d["size"], d["tokens_counted"])),
                    equal_to([("c", 3, 7)]), label="info")
    # a: 3, b: 3, c: 1 -> ties by token bytes descending
    assert open(os.path.join(out, "vocab", "c.txt"), "rb").read() == b"b\na\nc\n"


def test_compute_vocabulary_without_records_writes_every_key_a_dummy(tmp_path):
    """No record, no token: every vocabulary key still gets its file (TFT's dummy token), through the keys the
    counts lack."""
    write(tmp_path, "a.csv", "label,x,c,w,d\n")
    spec = small_spec(tmp_path)
    out = str(tmp_path / "o")
    with tp() as p:
        chunks = (p | read_examples.ReadExamples(spec, splits.list_input_files(spec.input_patterns())))["chunks"]
        v = chunks | compute_vocabulary.ComputeVocabulary(spec, out)
        assert_that(v["vocabularies"] | beam.Map(lambda d: (d["key"], d["size"], d["empty_vocabulary_dummy"])),
                    equal_to([("c", 1, True)]), label="info")
    assert open(os.path.join(out, "vocab", "c.txt"), "rb").read() == pvocab.TFT_EMPTY_VOCABULARY_TOKEN + b"\n"


def test_compute_vocabulary_counts_chunks_as_they_are_read(tmp_path, monkeypatch):
    """Each chunk's tokens reach the counter before the next chunk is read: nothing between the read and the
    combine makes the local runner hold every chunk's tokens (a Flatten there did, and the vocabulary
    job's memory grew with the data)."""
    write(tmp_path, "a.csv", "label,x,c,w,d\n" + "".join(f"1,{i},t{i % 7},1,{i % 10}\n" for i in range(40)))
    spec = small_spec(tmp_path)
    files = splits.list_input_files(spec.input_patterns())
    events = []
    # looked up when called
    as_tokens, add = parse.FeatureValues.as_tokens, compute_vocabulary.TokenCountCombineFn.add_input
    monkeypatch.setattr(parse.FeatureValues, "as_tokens", lambda fv: events.append("read") or as_tokens(fv))
    monkeypatch.setattr(compute_vocabulary.TokenCountCombineFn, "add_input",
                        lambda self, acc, t: events.append("count") or add(self, acc, t))
    with tp() as p:
        chunks = (p | read_examples.ReadExamples(spec, files, chunk_rows=10))["chunks"]
        _ = chunks | compute_vocabulary.ComputeVocabulary(spec, str(tmp_path / "o"))
    assert events.count("read") == 4 and events[:4] == ["read", "count", "read", "count"]
    by_count = (4, 3, 2, 1, 0, 6, 5)  # 6 of each of t0..t4, 5 of t5, t6; ties by token descending
    assert open(tmp_path / "o" / "vocab" / "c.txt", "rb").read() == b"".join(b"t%d\n" % i for i in by_count)


def test_large_elements_are_sized_without_pickling(tmp_path, monkeypatch):
    """Beam estimates the size of a PCollection's first elements by encoding them, also inside a fused
    stage; chunks and id blocks are typed `BulkElement`, whose coder sizes them from their arrays."""
    import pickle

    from pipelines.jobs.coders import BulkCoder
    from pipelines.read.spill import approx_nbytes
    write(tmp_path, "a.csv", "label,x,c,w,d\n" + "".join(f"1,{i},t{i % 7},1,{i % 10}\n" for i in range(40)))
    spec = small_spec(tmp_path)
    files = splits.list_input_files(spec.input_patterns())
    pickled, dumps = [], pickle.dumps
    monkeypatch.setattr(pickle, "dumps", lambda x, *a, **k: pickled.append(type(x).__name__) or dumps(x, *a, **k))
    with tp() as p:
        chunks = (p | read_examples.ReadExamples(spec, files, chunk_rows=10))["chunks"]
        vocab = {"c": pa.array([b"t1", b"t2"], pa.large_binary())}
        blocks = chunks | beam.Map(lambda c: mapping.map_chunk(c, spec, vocab, collections.Counter()))
        assert_that(blocks | beam.Map(lambda b: b.num_examples), equal_to([10] * 4))
        _ = chunks | compute_vocabulary.ComputeVocabulary(spec, str(tmp_path / "o"))
    assert "ParsedChunk" not in pickled
    # The vocabulary's counts tables are written where the combine makes them (never encoded), and its
    # one accumulator is encoded once, for the combine's GroupByKey (not again to be sized).
    assert "Table" not in pickled and pickled.count("TokenCounter") == 1
    chunk, _ = parse.parse_batch(next(i for i in splits.read_file("csv", files[0], spec.required_columns())
                                      if isinstance(i, records.RawBatch)), spec)
    coder = BulkCoder()
    assert coder.decode(coder.encode(chunk)).features["c"].tokens.equals(chunk.features["c"].tokens)
    size = coder.estimate_size(("chunks", chunk))
    assert size == approx_nbytes(("chunks", chunk)) and 0 < approx_nbytes(chunk) <= len(dumps(chunk))


def test_token_count_combine_fn_matches_counter():
    rng = np.random.default_rng(0)
    arrays, expect = [], collections.Counter()
    for _ in range(20):
        toks = [b"t%d" % x for x in rng.zipf(1.5, 300) % 50] + [b"", b"x\ny"]
        expect.update(t for t in toks if t and b"\n" not in t)
        arrays.append(pa.array(toks, pa.large_binary()))
    with tp() as p:
        got = (p | beam.Create([("k", t) for t in arrays])
               | beam.CombinePerKey(compute_vocabulary.TokenCountCombineFn())
               | beam.Map(lambda kv: sorted(zip(kv[1].column("token").to_pylist(), kv[1].column("count").to_pylist()))))
        assert_that(got, equal_to([sorted(expect.items())]))
    counter = TokenCounter()
    for a in arrays:
        counter.add(a)
    tokens, counts, distinct = pvocab.finalize(pvocab.counts_table(counter), top_k=5, frequency_threshold=3)
    ref = sorted(((t, c) for t, c in expect.items() if c >= 3), key=lambda tc: (tc[1], tc[0]), reverse=True)[:5]
    assert list(zip(tokens, counts)) == ref and distinct == len(expect)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=4), max_size=30), st.integers(0, 3))
def test_writable_mask_keeps_what_tft_writes(tokens, start):
    """Not empty and no \\n or \\r (TFT's text files), also for a slice of the array."""
    arr = pa.array([b"pad"] * start + tokens, pa.large_binary()).slice(start)
    keep = pvocab.writable_mask(arr)
    want = [bool(t) and b"\n" not in t and b"\r" not in t for t in tokens]
    assert (keep is None and all(want)) or (keep is not None and keep.to_pylist() == want)


def _block(n, start, nf=1):
    lengths = np.arange(start, start + n) % 3
    ids = np.arange(int(lengths.sum()), dtype=np.int64) + 100 * start
    return batching.ExampleBlock(np.arange(start, start + n, dtype=np.float32), np.zeros((n, 0), np.float32),
                                 np.ones(n, np.float32),
                                 {"f": batching.FeatureBlock(lengths, ids, None, np.zeros(n, np.int32))})


@pytest.mark.parametrize("tail,steps", [("drop", 2), ("pad", 3)])
def test_form_global_batches(tail, steps):
    blocks = [((0, 0), _block(3, 0)), ((0, 1), _block(4, 3)), ((1, 0), _block(4, 7))]  # 11 examples, B=4
    with tp() as p:
        out = p | beam.Create(blocks) | global_batches.FormGlobalBatches(4, 0, tail)
        assert_that(out["steps"] | beam.Map(lambda kv: (kv[0], kv[1].label.tolist(), kv[1].mask.tolist())),
                    equal_to([(s, [float(x) if x < 11 else 0.0 for x in range(4 * s, 4 * s + 4)],
                               [1.0 if x < 11 else 0.0 for x in range(4 * s, 4 * s + 4)]) for s in range(steps)]),
                    label="steps")
        assert_that(out["info"] | beam.Map(lambda i: (i["examples"], i["steps"], i["tail_dropped"],
                                                      i["tail_padding"])),
                    equal_to([(11, steps, 3 if tail == "drop" else 0, 1 if tail == "pad" else 0)]), label="info")


def _mapped_first_chunk(tmp_path, csv_text):
    """The small spec's vocabulary job over `csv_text` in a.csv, then its first chunk read, parsed and mapped:
    (spec, output dir, vocabulary sizes, layout, limits, ExampleBlock)."""
    from pipelines.sharding import packing_limits as shard_limits
    write(tmp_path, "a.csv", csv_text)
    spec = small_spec(tmp_path)
    out = str(tmp_path / "o")
    runner.run_vocab(jobs.JobConfig(spec=spec, output=out))
    sizes = runner.vocab_sizes_for(jobs.JobConfig(spec=spec, output=out))
    layout = spec.layout(sizes)
    limits = shard_limits.resolve_limits(spec, layout)
    vocabs = map_to_ids.load_vocabularies(spec, out)
    files = splits.list_input_files(spec.input_patterns())
    raw = next(it for it in splits.read_file("csv", files[0], spec.required_columns())
               if isinstance(it, records.RawBatch))
    chunk, _ = parse.parse_batch(raw, spec)
    return spec, out, sizes, layout, limits, mapping.map_chunk(chunk, spec, vocabs, collections.Counter())


def test_build_shards_and_profile_combine(tmp_path):
    spec, out, sizes, _, limits, block = _mapped_first_chunk(tmp_path, GOOD)
    block = block.slice(0, 4)
    with tp() as p:
        steps = p | "Steps" >> beam.Create([(0, block)])
        info = p | "Info" >> beam.Create([{"steps": 1}])
        built = (steps, info) | build_shards.BuildShards(spec, sizes, limits, out, profile=True,
                                                         candidate_chip_counts=[1])
        assert_that(built["files"] | beam.Map(lambda f: (f.path, f.records)),
                    equal_to([("shards/host-00000/part-00000-of-00001.tfrecord", 1)]), label="files")
        prof = built["profile"] | collect_profile.CollectProfile(spec, sizes, str(tmp_path / "prof"),
                                                                 candidate_chip_counts=[1])
        assert_that(prof | beam.Map(lambda ps: len(ps) > 0), equal_to([True]), label="profile")


def test_a_bundle_without_steps_starts_no_profile_child(tmp_path, monkeypatch):
    """The job's second step stream (steps assembled across bundles) is empty when one worker reads in order:
    its bundle starts no child process for a profile of nothing (starting one delays the end of the job)."""
    from pipelines import child_process
    spec, out, sizes, _, limits, block = _mapped_first_chunk(tmp_path, GOOD)
    monkeypatch.setenv(child_process.ENV, "1")
    started, init = [], child_process.Child.__init__
    monkeypatch.setattr(child_process.Child, "__init__", lambda self: started.append(1) or init(self))
    with tp() as p:
        whole = p | "Whole" >> beam.Create([(0, block.slice(0, 4))])
        across = p | "Across" >> beam.Create([]).with_output_types(typing.Any)
        info = p | "Info" >> beam.Create([{"steps": 1}])
        built = ((whole, across), info) | build_shards.BuildShards(spec, sizes, limits, out, profile=True,
                                                            candidate_chip_counts=[1])
        partials = tuple(built["profile"]) | beam.Flatten() | beam.Map(lambda partial: partial.steps)
        assert_that(partials, equal_to([1]))
    assert len(started) == 1


@pytest.mark.parametrize("in_memory", [False, True], ids=["partial files", "partials in memory"])
@pytest.mark.parametrize("child", ["0", "1"], ids=["thread", "child process"])
def test_the_profile_of_partials_per_bundle_is_the_profile_of_all_steps_at_once(tmp_path, monkeypatch, child,
                                                                                in_memory):
    """BuildShards adds each bundle's steps to a partial profile in a background thread or a child process;
    merged, the partials are the profile one collector makes from every step in order (same files, the what-if
    steps' too, byte for byte), whether the partials travel as files or stay in this process's memory."""
    import profiles
    from pipelines import child_process
    monkeypatch.setenv(child_process.ENV, child)
    from pipelines.sharding import step_records
    from profiles.whatif_steps import write_what_if_steps
    rows = "".join(f"{i % 2},{i * 0.5},{'a|b' if i % 3 else 'c'},{'1|2' if i % 3 else '1'},{i % 10}\n"
                   for i in range(64))
    spec, out, sizes, layout, limits, block = _mapped_first_chunk(tmp_path, "label,x,c,w,d\n" + rows)
    B = spec.global_batch_size
    steps = [(s, block.slice(s * B, (s + 1) * B)) for s in range(block.num_examples // B)]
    collector = collect_profile.profile_collector(spec, sizes, [1, 2])
    acc = collector.create_accumulator()
    for s, b in steps:
        _, gids, oov, _ = step_records.build_step(s, b, spec, layout, limits)
        acc = collector.add_step(acc, gids, oov, step=s)
    profile = collector.extract_output(acc)
    want = profiles.ProfileStore(str(tmp_path / "want")).write(profile) + [
        write_what_if_steps(str(tmp_path / "want"), profile)]
    with tp() as p:
        step_pc = p | "Steps" >> beam.Create(steps).with_output_types(typing.Any) | beam.Reshuffle()
        info = p | "Info" >> beam.Create([{"steps": len(steps)}])
        built = (step_pc, info) | build_shards.BuildShards(spec, sizes, limits, out, profile=True,
                                                           candidate_chip_counts=[1, 2], partials_in_memory=in_memory)
        _ = built["profile"] | collect_profile.CollectProfile(spec, sizes, str(tmp_path / "got"),
                                                              candidate_chip_counts=[1, 2])
    assert not collect_profile._held  # every partial kept in memory was taken by the merge
    got = sorted(os.listdir(tmp_path / "got"))
    assert got == sorted(os.path.basename(w) for w in want) and len(got) > 0
    for name in got:
        assert (tmp_path / "got" / name).read_bytes() == (tmp_path / "want" / name).read_bytes(), name
    assert not os.path.exists(collect_profile.partials_dir(out))  # the partials' files are deleted


def test_partial_profiles_merged_from_their_files_are_the_profile_of_all_steps(tmp_path):
    """Partial profiles travel as files (`write_partial`): merged in any grouping they are the accumulator of
    every step at once; `CollectProfile` writes that profile and deletes every partial's file, a lost attempt's
    too (a file no element names)."""
    from pipelines.sharding import step_records
    rows = "".join(f"{i % 2},{i * 0.5},{'a|b' if i % 3 else 'c'},{'1|2' if i % 3 else '1'},{i % 10}\n"
                   for i in range(64))
    spec, out, sizes, layout, limits, block = _mapped_first_chunk(tmp_path, "label,x,c,w,d\n" + rows)
    B = spec.global_batch_size
    collector = collect_profile.profile_collector(spec, sizes, [1, 2])
    whole, parts = collector.create_accumulator(), [collector.create_accumulator() for _ in range(3)]
    for s in range(block.num_examples // B):
        _, gids, oov, _ = step_records.build_step(s, block.slice(s * B, (s + 1) * B), spec, layout, limits)
        whole = collector.add_step(whole, gids, oov, step=s)
        parts[s % 3] = collector.add_step(parts[s % 3], gids, oov, step=s)
    files = [collect_profile.write_partial(out, part) for part in parts]
    assert [f.steps for f in files] == [part.steps for part in parts] and all(os.path.exists(f.path) for f in files)
    assert collect_profile.merge_partials(collector, files) == whole
    assert collect_profile.merge_partials(collector, files[::-1]) == whole
    assert collect_profile.merge_partials(collector, []) == collector.create_accumulator()
    other = collect_profile.profile_collector(spec, {k: v + 1 for k, v in sizes.items()}, [1, 2])
    with pytest.raises(ProfileMismatchError, match="different tables"):
        collect_profile.merge_partials(other, files)  # partials of another model configuration
    lost = collect_profile.write_partial(out, parts[0])  # a failed attempt's partial: written, never named
    with tp() as p:
        paths = (p | beam.Create(files) | collect_profile.CollectProfile(spec, sizes, str(tmp_path / "got"),
                                                                         candidate_chip_counts=[1, 2]))
        assert_that(paths | beam.Map(len), equal_to([len(whole.tables) + len(whole.stacks) + 2]))
    assert not os.path.exists(lost.path) and not os.path.exists(collect_profile.partials_dir(out))
    want = collector.extract_output(whole)
    assert ProfileStore(str(tmp_path / "got")).read(model=want.model.key).accumulator == want.accumulator
    # Kept in this process's memory: no file; the merge takes each partial (once) as the files give it.
    held = [collect_profile.write_partial(out, part, in_memory=True) for part in parts]
    assert [f.steps for f in held] == [f.steps for f in files] and not os.path.exists(collect_profile.partials_dir(out))
    assert collect_profile.merge_partials(collector, held[::-1]) == whole and not collect_profile._held
    unnamed = collect_profile.write_partial(out, parts[0], in_memory=True)  # a failed attempt's, never named
    collect_profile.remove_partials(out)  # as the runner after a failed job
    assert not collect_profile._held and not os.path.exists(unnamed.path)



def test_manifest_extras_merge_a_keys_dicts_and_set_other_values():
    got = manifest_writer.merge_extras([{"vocabularies": {"a": {"size": 1}}}, {"batching": {"steps": 3}},
                             {"vocabularies": {"b": {"size": 2}}}, {"profile": {"files_written": 1}}])
    assert got == {"vocabularies": {"a": {"size": 1}, "b": {"size": 2}}, "batching": {"steps": 3},
                   "profile": {"files_written": 1}}
    assert manifest_writer.merge_extras([{"k": 1}, {"k": {"x": 1}}, {"k": {"y": 2}}]) == {"k": {"x": 1, "y": 2}}


def test_the_jobs_pipelines_stay_small(tmp_path):
    """Each transform costs its construction and the runner's translation (most of it Beam inspecting every
    method of each DoFn, several times), in each of `run`'s two pipelines: the manifest's inputs are side inputs
    of one step, not a combine or a list per section, and a `Create` followed by a reshuffle does not reshuffle
    first, a check of the chunks' sizes reads them as a side input. For this job: at most 33 and 48 ParDos."""
    write(tmp_path, "a.csv", GOOD)
    spec = small_spec(tmp_path)
    files = splits.list_input_files(spec.input_patterns())
    cfg = jobs.JobConfig(spec=spec, output=str(tmp_path / "o"))
    handed = jobs.ShardPass(chunk_sizes=[((0, 0), 5)])

    def pardos(build):
        p = beam.Pipeline(options=runner.pipeline_options([]))
        build(p)
        transforms = p.to_runner_api().components.transforms.values()
        return sum(t.spec.urn == "beam:transform:pardo:v1" for t in transforms)

    assert pardos(lambda p: jobs.build_vocab_pipeline(p, cfg, files)) <= 33
    assert pardos(lambda p: jobs.build_shard_pipeline(p, cfg, files, {"c": 3}, handed=handed)) <= 48


def test_no_output_type_of_the_jobs_is_inferred_from_bytecode(tmp_path, monkeypatch):
    """Beam infers an undeclared output type by interpreting the function's bytecode, and the functions it
    calls (slowest for the writers), each time a pipeline is built: the jobs' own steps declare theirs."""
    from apache_beam.typehints import trivial_inference
    write(tmp_path, "a.csv", GOOD)
    spec = small_spec(tmp_path)
    files = splits.list_input_files(spec.input_patterns())
    cfg = jobs.JobConfig(spec=spec, output=str(tmp_path / "o"))
    handed = jobs.ShardPass(chunk_sizes=[((0, 0), 5)])
    inferred, depth, infer = [], [0], trivial_inference.infer_return_type

    def ours(fn):
        """The project's function behind `fn` (a DoFn's method, or the one Beam's Map/FlatMap wraps)."""
        fn = getattr(fn, "__func__", fn)
        if (getattr(fn, "__module__", "") or "").startswith(("pipelines", "profiles", "tpu_embed")):
            return fn.__qualname__
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                inner = ours(cell.cell_contents) if callable(cell.cell_contents) else None
            except ValueError:  # an empty cell
                inner = None
            if inner:
                return inner
        return None

    def recording(c, *args, **kwargs):
        if depth[0] == 0:
            inferred.append(ours(c))
        depth[0] += 1
        try:
            return infer(c, *args, **kwargs)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(trivial_inference, "infer_return_type", recording)
    for build in (lambda p: jobs.build_vocab_pipeline(p, cfg, files),
                  lambda p: jobs.build_shard_pipeline(p, cfg, files, {"c": 3}, handed=handed)):
        build(beam.Pipeline(options=runner.pipeline_options([])))
    assert len(inferred) > 0 and [q for q in inferred if q] == []


def test_vocabularies_of_another_spec_are_a_one_line_manifest_error_exiting_1(tmp_path):
    """Shards over vocabularies made for another spec are refused like a missing vocabulary manifest: one line,
    exit 1 (exit 2 is for how the command was called)."""
    from pipelines import user_errors
    from tpu_embed.artifact.manifest import ManifestError
    write(tmp_path, "a.csv", "label,x,c,w,d\n1,0.5,a|b,1|2,3\n0,,c,1,4\n")
    out = str(tmp_path / "o")
    runner.run_vocab(jobs.JobConfig(spec=small_spec(tmp_path), output=out))
    other = small_spec(tmp_path, global_batch_size=8)
    with pytest.raises(ManifestError, match="were made for spec") as err:
        runner.vocab_sizes_for(jobs.JobConfig(spec=other, output=out))
    assert user_errors.exit_code(err.value) == 1
    said = user_errors.describe(err.value)
    assert said.expected and "\n" not in said.line
