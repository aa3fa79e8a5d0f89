"""What the jobs must write, computed from the raw rows by plain Python: vocabularies, ids, gains, and the
entries of each chip's CSR buffers decoded back (the end-to-end reference of tests/pipelines/runner/test_e2e.py)."""

from __future__ import annotations

import collections
import csv
import json
import os

import numpy as np
import pytest

from tpu_embed.artifact import shard_records, tfrecord
from tpu_embed.artifact.shard_format import ShardFormat
from tpu_embed.sparsecore import PAD_VALUE
from tpu_embed.sparsecore.padding import round_up

# ---------------------------------------------------------------- plain Python reference

def raw_rows(spec):
    rows = []
    for path in spec.input_patterns():
        with open(path, newline="", encoding="utf-8") as fh:
            rows.extend(csv.DictReader(fh))
    return rows


def raw_values(f, row):
    v = row[f.column]
    parts = v.split(f.delimiter) if f.delimiter else [v]
    return [p for p in parts if p != ""]


def plain_vocabulary(spec, key):
    counts = collections.Counter()
    for row in raw_rows(spec):
        for f in spec.vocabulary_groups()[key]:
            for t in raw_values(f, row):
                if "\n" not in t and "\r" not in t:
                    counts[t.encode("utf-8")] += 1
    v = spec.vocabulary_groups()[key][0].vocabulary
    items = [(t, c) for t, c in counts.items() if v.frequency_threshold is None or c >= v.frequency_threshold]
    items.sort(key=lambda tc: (tc[1], tc[0]), reverse=True)  # count desc, token bytes desc
    if v.top_k is not None:
        items = items[:v.top_k]
    return [t for t, _ in items]


def plain_ids(spec, f, row, vocabs):
    out = []
    for t in raw_values(f, row):
        v = f.vocabulary
        if v.type == "frequency":
            vocab = vocabs[spec.vocabulary_key(f)]
            tb = t.encode("utf-8")
            out.append(vocab.index(tb) if tb in vocab else len(vocab))  # the examples use 1 OOV bucket
        elif v.type == "identity":
            out.append(int(t))
        else:
            import tensorflow as tf
            out.append(int(tf.strings.to_hash_bucket_fast([t], v.num_buckets).numpy()[0]))
    if f.sequence_length:
        out = out[:f.sequence_length]
    return out


def expected_gains(ids, weights, combiner):
    w = np.ones(len(ids), np.float32) if weights is None else np.asarray(weights, np.float32)
    if combiner == "mean":
        scale = 1.0 / w.sum() if len(ids) else 0.0
    elif combiner == "sqrtn":
        scale = 1.0 / np.sqrt((w * w).sum()) if len(ids) else 0.0
    else:
        scale = 1.0
    out = collections.defaultdict(float)
    for i, x in zip(ids, w):
        out[i] += float(x) * scale
    return dict(out)


def assert_real_example(record, pos: int, row: dict, spec) -> None:
    """Slot `pos` of a decoded step record holds raw CSV `row`: mask 1, its label and its dense values."""
    assert record["mask"][pos] == 1
    assert record["label"][pos] == np.float32(row[spec.label.column] or 0)
    for j, dn in enumerate(spec.dense):
        raw = row[dn.column]
        assert record["dense"][pos, j] == np.float32(float(raw) if raw != "" else dn.fill)


def expected_chip_entries(spec, vocabs, rows, slot_rows):
    """{(feature, chip-local example, vocabulary id): gain} a chip's CSR must hold when its slot i holds
    raw row `slot_rows[i]` (None: a padding slot, no entries): what `decode_chip` returns."""
    expect = {}
    for f in spec.sparse_core_features:
        table = spec.table(f.table)
        for i, k in enumerate(slot_rows):
            if k is None:
                continue
            ids = plain_ids(spec, f, rows[k], vocabs)
            if f.sequence_length:
                for p_, ident in enumerate(ids):
                    expect[(f.name, i * f.sequence_length + p_, ident)] = 1.0
            else:
                for ident, g in expected_gains(ids, None, table.combiner).items():
                    expect[(f.name, i, ident)] = g
    return expect


# ---------------------------------------------------------------- CSR decoding

def decode_chip(chip, layout_json, topology):
    """{(feature, chip-local example, vocabulary id): gain} from one chip's CSR prefixes."""
    nsc = topology["num_sc_per_chip"]
    S = topology["num_chips"] * nsc
    log2s = S.bit_length() - 1
    rp_block = round_up(S, 8)
    feats = layout_json["features"]
    out = {}
    for stack, d in chip.items():
        sfeats = [f for f in feats if f["stack"] == stack]
        rp, sids, toks, gains = d["row_pointers"], d["sorted_sample_ids"], d["sorted_token_ids"], d["sorted_gains"]
        ptr = 0
        for sc in range(nsc):
            for dest in range(S):
                end = int(rp[sc * rp_block + dest])
                for k in range(ptr, end):
                    s, t, g = int(sids[k]), int(toks[k]), float(gains[k])
                    assert s != PAD_VALUE
                    for f in sfeats:
                        per_sc = f["sample_count"] // nsc
                        lo = f["sample_offset"] // nsc
                        if lo <= s < lo + per_sc:
                            break
                    else:
                        raise AssertionError(f"sample {s} of {stack} belongs to no feature")
                    row = sc * per_sc + (s - lo)
                    ident = ((t - f["col_offset"] // S) << log2s) | ((dest - f["col_shift"]) % S)
                    key = (f["path"], row, ident)
                    assert key not in out, f"duplicate entry {key}"
                    out[key] = g
                ptr = round_up(end, 8)
            assert np.all(sids[ptr:] == PAD_VALUE) if sc == nsc - 1 else True
    return out


# ---------------------------------------------------------------- the whole check

def assert_shards_decode_to_raw_rows(spec, d, name):
    """Every step, chip, feature and example of artifact `d` (written from `spec`) against the raw rows."""
    m = json.load(open(os.path.join(d, "manifest.json")))
    fmt = ShardFormat.from_json(m["shards"]["format"])
    topo = m["topology"]
    layout = m["layout"]
    vocabs = {k: plain_vocabulary(spec, k) for k in spec.vocabulary_groups()}
    rows = raw_rows(spec)
    B = spec.global_batch_size
    H = spec.topology.num_hosts
    hb = B // H
    per_chip = spec.per_chip_batch_size
    cph = spec.topology.chips_per_host
    steps = m["shards"]["steps"]
    tail = spec.policies.tail
    assert steps == (len(rows) // B if tail == "drop" else -(-len(rows) // B))
    seen_examples = 0
    for h in range(H):
        records = [shard_records.decode_record(r, fmt) for p in shard_records.shard_files(d, h)
                   for r in tfrecord.read_records(p)]
        assert [r["step"] for r in records] == list(range(steps))
        for r in records:
            assert r["host"] == h
            for pos in range(hb):
                k = r["step"] * B + h * hb + pos
                if k >= len(rows):
                    assert r["mask"][pos] == 0 and r["label"][pos] == 0
                    continue
                seen_examples += 1
                assert_real_example(r, pos, rows[k], spec)
            for f in spec.tensor_core_features:
                tc = r["tensor_core"][f.name]
                starts = np.concatenate([[0], np.cumsum(tc["lengths"])])
                for pos in range(hb):
                    k = r["step"] * B + h * hb + pos
                    expect = plain_ids(spec, f, rows[k], vocabs)[:f.tensor_core_width] if k < len(rows) else []
                    assert tc["ids"][starts[pos]:starts[pos + 1]].tolist() == expect
            # SparseCore: decode every chip and compare with the raw rows.
            for c in range(cph):
                gchip = h * cph + c
                got = decode_chip(r["sparse_core"][c], layout, topo)
                first = r["step"] * B + gchip * per_chip
                slots = [k if k < len(rows) else None for k in range(first, first + per_chip)]
                expect = expected_chip_entries(spec, vocabs, rows, slots)
                assert set(got) == set(expect), (name, r["step"], gchip, sorted(set(got) ^ set(expect))[:5])
                for key, g in expect.items():
                    assert got[key] == pytest.approx(g, rel=1e-6), key
                for dd in r["sparse_core"][c].values():
                    assert dd["dropped_ids"] == 0
    c = m["counts"]
    assert c["records_read"] == len(rows) and c["records_invalid"] == 0
    assert c["examples_written"] == seen_examples
    assert c["examples_dropped"]["tail"] + seen_examples == len(rows)
    assert c["examples_padding"] == (steps * B - len(rows) if tail == "pad" else 0)
