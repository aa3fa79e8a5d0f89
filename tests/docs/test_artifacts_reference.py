"""docs/reference/artifacts.md is enough to read an artifact: a decoder written from the page alone.

Everything below "the page's formats" follows the page's words (the TFRecord framing, the tf.train.Example
wire format, the record keys, both shard layouts, the manifest's `layout` and `shards.format`, the
HostEmbedding checkpoint keys) with numpy, zlib and the standard library; no tpu_embed decoding helper. It
decodes

* the version-1 fixture artifact (tests/fixtures/movielens_v1_artifact: keys by name, int32 ids, padding
  and gains stored), and
* an artifact the jobs write here (shard format 2: GZIP, short keys, uint8/uint16 ids, omitted padding and
  unit gains; `shards.layout: both`, so the jax records too; a weighted sum feature, a sqrtn feature with two
  OOV buckets, a sequence feature sharing its table with a bag feature, a hashing and identity features),

back to (example, feature, position, id, gain) and checks that against the raw CSV rows mapped through the
vocabulary files (what the ids mean), that the CSR arrays rebuilt with the page's padding rules equal the
library's decoders' (`decode_record`, `tpu_embed.artifact.jax_records.decode_batches`), and that activations
computed from the decoded ids and a saved HostEmbedding checkpoint, read by the keys the page lists, equal
`HostEmbedding.dequeue`'s.
"""

from __future__ import annotations

import collections
import csv
import gzip
import json
import os
import re
import struct
import zlib

import google_crc32c
import numpy as np
import pytest

from tests.helpers import ROOT

FIXTURE = os.path.join(ROOT, "tests", "fixtures", "movielens_v1_artifact")
DATA = os.path.join(ROOT, "data", "movielens_sample.csv")
PAD = (1 << 31) - 1  # the page: PAD_VALUE, 2**31 - 1

SPEC = f"""\
name: artifacts_reference
inputs: {{format: csv, patterns: [{DATA}]}}
label: {{column: rating}}
dense: [{{name: timestamp, fill: 0.0}}]
categorical:
  - {{name: user_id, vocabulary: {{type: identity, num_buckets: 6041}}}}
  - {{name: movie_id, weight_column: rating, vocabulary: {{type: identity, num_buckets: 3953}}}}
  - {{name: genres, delimiter: "|", vocabulary: {{type: frequency, num_oov_buckets: 1}}}}
  - {{name: genre_seq, column: genres, delimiter: "|", sequence_length: 3, table: genres,
     vocabulary: {{type: frequency, num_oov_buckets: 1}}}}
  - {{name: gender, vocabulary: {{type: frequency, num_oov_buckets: 1}},
     embedding_lookup_device: tpu_tensor_core, tensor_core_width: 1}}
  - {{name: zip, vocabulary: {{type: frequency, frequency_threshold: 2, num_oov_buckets: 2}}}}
  - {{name: title, vocabulary: {{type: hashing, num_buckets: 1000}}}}
tables:
  - {{name: user_id, dim: 16}}
  - {{name: movie_id, dim: 16, combiner: sum}}
  - {{name: genres, dim: 8, combiner: mean}}
  - {{name: gender, dim: 4}}
  - {{name: zip, dim: 8, combiner: sqrtn}}
  - {{name: title, dim: 8}}
optimizer: {{type: adagrad, learning_rate: 0.05}}
topology: {{num_chips: 2, num_sc_per_chip: 4, num_hosts: 2}}
global_batch_size: 16
shards: {{layout: both, compression: GZIP}}
"""


# ================================================================ the page's formats

def round_up(n, m=8):
    return (n + m - 1) // m * m


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord_payloads(path: str, compression: str):
    """A shard file's records: the file is one GZIP / ZLIB stream when compressed; frames of
    uint64 length | uint32 masked crc32c of the length | payload | uint32 masked crc32c of the payload."""
    data = open(path, "rb").read()
    if compression == "GZIP":
        data = gzip.decompress(data)
    elif compression == "ZLIB":
        data = zlib.decompress(data)
    pos = 0
    while pos < len(data):
        (length,), (crc_len,) = struct.unpack_from("<Q", data, pos), struct.unpack_from("<I", data, pos + 8)
        assert crc_len == masked_crc(data[pos:pos + 8])
        payload = data[pos + 12:pos + 12 + length]
        assert struct.unpack_from("<I", data, pos + 12 + length)[0] == masked_crc(payload)
        yield payload
        pos += 16 + length


def _varint(buf: bytes, pos: int):
    shift = out = 0
    while True:
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return out, pos


def _fields(buf: bytes):
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        wire = tag & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            assert wire == 1
            value, pos = buf[pos:pos + 8], pos + 8
        yield tag >> 3, wire, value


def parse_example(payload: bytes) -> dict:
    """tf.train.Example: features (1) -> feature map entries (1: key 1, value 2) -> Feature: bytes_list 1,
    float_list 2, int64_list 3, each list's values in its field 1 (numbers packed or not)."""
    out = {}
    for n, _, features in _fields(payload):
        assert n == 1
        for m, _, entry in _fields(features):
            assert m == 1
            parts = {k: v for k, _, v in _fields(entry)}
            key = parts[1].decode("utf-8")
            (kind, _, lst), = list(_fields(parts.get(2, b"")))
            values = []
            for _, wire, v in _fields(lst):
                if kind == 1:
                    values.append(bytes(v))
                elif kind == 3:
                    if wire == 0:
                        values.append(v)
                    else:
                        p = 0
                        while p < len(v):
                            x, p = _varint(v, p)
                            values.append(x)
                else:
                    values += np.frombuffer(v, "<f4").tolist()
            if kind == 3:
                values = [x - (1 << 64) if x >= 1 << 63 else x for x in values]
            out[key] = ({1: "bytes", 2: "float", 3: "int64"}[kind], values)
    return out


def raw(ex: dict, key: str, dtype) -> np.ndarray:
    return np.frombuffer(ex[key][1][0], np.dtype(dtype).newbyteorder("<"))


ID_TYPES = {"int32": np.int32, "uint16": np.uint16, "uint8": np.uint8}


def widen(a: np.ndarray, name: str) -> np.ndarray:
    """Stored ids to int32: the stored type's maximum stands for PAD_VALUE (narrow types)."""
    if name == "int32":
        return a.astype(np.int32)
    return np.where(a == np.iinfo(ID_TYPES[name]).max, PAD, a).astype(np.int32)


Entry = collections.namedtuple("Entry", "example feature position id gain")


def decode_tensorflow(ex: dict, m: dict, host: int, step: int):
    """One host's step record in TensorFlow's SparseCore layout -> (entries, {(chip, stack): TF's arrays})."""
    fmt, layout = m["shards"]["format"], m["layout"]
    topo = layout["topology"]
    nsc = topo["num_sc_per_chip"]
    S = topo["num_chips"] * nsc
    block = round_up(S, 8)
    per_chip, per_host, glob = (m["batch_sizes"][k] for k in ("per_chip", "per_host", "global"))
    entries, arrays = [], {}
    for c in range(fmt["chips_per_host"]):
        for i, st in enumerate(fmt["stacks"]):
            name = st["name"]

            def key(long, short, c=c, i=i, name=name):
                return f"sc/{c}/{name}/{long}" if fmt.get("keys", "names") == "names" else f"sc/{c}/{i}/{short}"

            sid = widen(raw(ex, key("sorted_sample_ids", "sid"), ID_TYPES[st.get("sample_ids") or "int32"]),
                        st.get("sample_ids") or "int32")
            tid = widen(raw(ex, key("sorted_token_ids", "tid"), ID_TYPES[st.get("token_ids") or "int32"]),
                        st.get("token_ids") or "int32")
            gkey = key("sorted_gains", "g")
            gains = raw(ex, gkey, np.float32).copy() if gkey in ex else None
            sizes = ex[key("sizes", "n")][1]
            if (st.get("padding") or "stored") == "omitted":
                counts = np.asarray(ex[key("counts", "cnt")][1], np.int64)
                assert gains is None or gains.size == sid.size == int(counts.sum())
                n = int(round_up(counts).sum())
                full = {a: np.full(n, PAD, np.int32) for a in ("sid", "tid")}
                full_g = np.full(n, np.float32(PAD), np.float32)
                rp = np.zeros(counts.size, np.int32)
                at = real = 0
                for p, k in enumerate(counts):  # partition p starts where the earlier ones end, rounded up to 8
                    full["sid"][at:at + k], full["tid"][at:at + k] = sid[real:real + k], tid[real:real + k]
                    full_g[at:at + k] = 1.0 if gains is None else gains[real:real + k]
                    rp[p] = at + k
                    at, real = round_up(at + k), real + k
                sid, tid, gains = full["sid"], full["tid"], full_g
            else:
                rp = raw(ex, key("row_pointers", "rp"), np.int32)
                if gains is None:
                    gains = np.where(sid == PAD, np.float32(PAD), np.float32(1)).astype(np.float32)
            assert sizes[0] == rp.size == nsc * block and sizes[1] == sid.size == tid.size == gains.size
            arrays[(c, name)] = (rp, sid, tid, gains)
            feats = sorted((f for f in layout["features"] if f["stack"] == name), key=lambda f: f["sample_offset"])
            end = 0
            for p, stop in enumerate(rp.tolist()):
                start = round_up(end) if p else 0
                assert np.all(sid[stop:round_up(stop)] == PAD) and np.all(tid[stop:round_up(stop)] == PAD)
                assert np.all(gains[stop:round_up(stop)] == np.float32(PAD))
                local, dest = divmod(p, block)
                assert dest < S or stop == start  # the block's tail repeats its padded end
                for s, t, g in zip(sid[start:stop].tolist(), tid[start:stop].tolist(), gains[start:stop].tolist()):
                    f = next(f for f in feats if f["sample_offset"] // nsc <= s < (f["sample_offset"]
                                                                                   + f["sample_count"]) // nsc)
                    row = local * (f["sample_count"] // nsc) + s - f["sample_offset"] // nsc
                    width = int(np.prod(f["output_shape"][1:], dtype=np.int64))  # 1, or L of a sequence
                    example = step * glob + host * per_host + c * per_chip + row // width
                    ident = (t - f["col_offset"] // S) * S + (dest - f["col_shift"]) % S
                    entries.append(Entry(example, f["path"], row % width if width > 1 else -1, ident, g))
                end = stop
    return entries, arrays


def decode_jax(ex: dict, m: dict, host: int, step: int):
    """One host's step record in the jax layout -> (entries, {stack: (rp, eid, sid, g)})."""
    fj = m["shards"]["format"]["jax"]
    L, nsc = fj["local_devices"], fj["num_sc_per_device"]
    S = fj["num_devices"] * nsc
    W = max(S, 8)
    per_chip, per_host, glob = (m["batch_sizes"][k] for k in ("per_chip", "per_host", "global"))
    entries, arrays = [], {}
    for i, st in enumerate(fj["stacks"]):
        rp = raw(ex, f"jax/{i}/rp", np.int32)
        assert rp.size == L * fj["row_pointers_size_per_device"] == L * nsc * W
        rp = rp.reshape(L * nsc, W)
        eid, sid = raw(ex, f"jax/{i}/eid", np.int32), raw(ex, f"jax/{i}/sid", np.int32)
        g = raw(ex, f"jax/{i}/g", np.float32) if f"jax/{i}/g" in ex else \
            np.where(sid == PAD, np.float32(np.nan), np.float32(1)).astype(np.float32)
        arrays[st["name"]] = (rp, eid, sid, g)
        seg_start = 0
        for seg in range(L * nsc):
            device, local = divmod(seg, nsc)
            end = 0
            for d in range(S):
                start, stop = (round_up(end) if d else 0), int(rp[seg, d])
                a, b = seg_start + start, seg_start + stop
                pad = slice(b, seg_start + round_up(stop))
                assert np.all(eid[pad] == PAD) and np.all(sid[pad] == PAD) and np.all(np.isnan(g[pad]))
                for e, s, gain in zip(eid[a:b].tolist(), sid[a:b].tolist(), g[a:b].tolist()):
                    f = next(f for f in st["features"]
                             if f["row_offset"] // S <= s < f["row_offset"] // S + f["samples_per_sc"])
                    host_sample = seg * f["samples_per_sc"] + s - f["row_offset"] // S
                    width = max(f["sequence_length"], 1)
                    example = step * glob + host * per_host + host_sample // width
                    ident = (e - f["col_offset"] // S) * S + (d - f["col_shift"]) % S
                    entries.append(Entry(example, f["name"], host_sample % width if width > 1 else -1, ident, gain))
                end = stop
            assert all(int(x) == round_up(end) for x in rp[seg, S:])  # padded to max(S, 8) with the aligned end
            seg_start += round_up(int(rp[seg, -1]))
        assert seg_start == eid.size == sid.size == g.size
    return entries, arrays


def read_steps(artifact: str):
    """(host, step, parsed record) of every record, hosts' files in step order as the manifest lists them."""
    m = json.load(open(os.path.join(artifact, "manifest.json")))
    fmt = m["shards"]["format"]
    for host in range(fmt["num_hosts"]):
        files = sorted((f for f in m["files"] if f["kind"] == "shard" and f["host"] == host),
                       key=lambda f: f["first_step"])
        step = 0
        for f in files:
            for payload in tfrecord_payloads(os.path.join(artifact, f["path"]), fmt.get("compression", "none")):
                ex = parse_example(payload)
                assert ex["step"][1] == [step] and ex["host"][1] == [host]
                yield host, step, ex, payload
                step += 1


# ================================================================ what the ids mean: the CSV through the vocabularies

def expected_entries(artifact: str, m: dict, spec: dict):
    """The (example, feature, position, id, gain) of every SparseCore feature, from the raw CSV rows."""
    import tensorflow as tf  # only for Fingerprint64 (to_hash_bucket_fast): OOV buckets and hashing

    rows = list(csv.DictReader(open(DATA, encoding="utf-8")))
    tokens = sorted({t for r in rows for v in r.values() for t in [v, *v.split("|")]})
    fingerprints = {n: dict(zip(tokens, tf.strings.to_hash_bucket_fast(tokens, n).numpy().tolist()))
                    for n in {c["vocabulary"].get("num_oov_buckets") or c["vocabulary"].get("num_buckets") or 1
                              for c in spec["categorical"]}}

    def bucket(token: str, n: int) -> int:
        return fingerprints[n][token]

    n_examples = m["batching"]["steps"] * m["batch_sizes"]["global"]
    sc = {f["path"] for f in m["layout"]["features"]}
    combiner = {t: v["combiner"] for t, v in m["layout"]["tables"].items()}
    out = {}
    for cat in spec["categorical"]:
        name = cat["name"]
        if name not in sc:
            continue
        v = cat["vocabulary"]
        info = m["features"][name]
        if v["type"] == "frequency":
            lines = open(os.path.join(artifact, info["vocabulary_file"]), encoding="utf-8").read().splitlines()
            vocab = {t: i for i, t in enumerate(lines)}
            size = info["vocabulary_size"]
        for k, row in enumerate(rows[:n_examples]):
            values = row[cat.get("column") or name]
            values = values.split(cat["delimiter"]) if cat.get("delimiter") else [values]
            weights = [float(row[cat["weight_column"]])] * len(values) if cat.get("weight_column") else \
                [1.0] * len(values)
            if v["type"] == "frequency":
                ids = [vocab[t] if t in vocab else size + bucket(t, v["num_oov_buckets"]) for t in values]
            elif v["type"] == "identity":
                ids = [int(t) for t in values]
            else:
                ids = [bucket(t, v["num_buckets"]) for t in values]
            L = cat.get("sequence_length") or 0
            samples = [(j, [i], [w]) for j, (i, w) in enumerate(zip(ids[:L], weights[:L]))] if L else \
                [(-1, ids, weights)]
            for pos, sids, ws in samples:
                c = combiner[info["table"]]
                div = 1.0 if c == "sum" else sum(ws) if c == "mean" else float(np.sqrt(sum(w * w for w in ws)))
                for i, w in zip(sids, ws):
                    out[(k, name, pos, i)] = out.get((k, name, pos, i), 0.0) + w / div
    return out


def _as_dict(entries):
    d = {}
    for e in entries:
        key = (e.example, e.feature, e.position, e.id)
        assert key not in d, f"{key} twice: equal (sample, column) pairs are merged"
        d[key] = e.gain
    return d


def _same(got: dict, want: dict, what: str):
    assert set(got) == set(want), (what, sorted(set(got) ^ set(want))[:5])
    keys = sorted(got)
    np.testing.assert_allclose([got[k] for k in keys], [want[k] for k in keys], rtol=1e-6, err_msg=what)


# ================================================================ the tests

@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """An artifact the jobs write now: shard format 2 with every compact encoding, both layouts."""
    from pipelines import runner
    from pipelines.jobs import JobConfig
    from tpu_embed.artifact.spec import load_spec
    d = tmp_path_factory.mktemp("artifacts_reference")
    (d / "spec.yaml").write_text(SPEC)
    out = str(d / "artifact")
    runner.run_all(JobConfig(spec=load_spec(str(d / "spec.yaml")), output=out))
    return out


def _spec(artifact: str) -> dict:
    import yaml
    return yaml.safe_load(open(os.path.join(artifact, "spec.yaml"), encoding="utf-8"))


def _check_tensorflow_layout(artifact: str):
    from tpu_embed.artifact.shard_format import ShardFormat
    from tpu_embed.artifact.shard_records import decode_record
    m = json.load(open(os.path.join(artifact, "manifest.json")))
    fmt = ShardFormat.from_json(m["shards"]["format"])
    entries, labels = [], {}
    for host, step, ex, payload in read_steps(artifact):
        got, arrays = decode_tensorflow(ex, m, host, step)
        entries += got
        lib = decode_record(payload, fmt)  # the library's arrays: TF's padded prefixes
        for (c, stack), (rp, sid, tid, gains) in arrays.items():
            x = lib["sparse_core"][c][stack]
            np.testing.assert_array_equal(rp, x["row_pointers"])
            np.testing.assert_array_equal(sid, x["sorted_sample_ids"])
            np.testing.assert_array_equal(tid, x["sorted_token_ids"])
            np.testing.assert_array_equal(gains.view(np.int32), x["sorted_gains"].view(np.int32))
        mask = raw(ex, "mask", np.float32)
        for j, (label, real) in enumerate(zip(raw(ex, "label", np.float32), mask)):
            if real:
                labels[step * m["batch_sizes"]["global"] + host * m["batch_sizes"]["per_host"] + j] = label
    rows = list(csv.DictReader(open(DATA, encoding="utf-8")))
    assert labels == {k: np.float32(rows[k]["rating"]) for k in labels} and len(labels) == m["batching"]["examples"] \
        - m["batching"]["tail_dropped_per_epoch"]
    decoded = _as_dict(entries)
    _same(decoded, expected_entries(artifact, m, _spec(artifact)), artifact)
    return m, decoded


def test_the_version_1_fixture_decodes_by_the_page():
    m, decoded = _check_tensorflow_layout(FIXTURE)
    assert m["shards"]["format"]["version"] == 1 and {f for _, f, _, _ in decoded} >= {"genres", "zip", "title"}


def test_a_fresh_artifact_decodes_by_the_page_in_both_layouts(fresh):
    m, decoded = _check_tensorflow_layout(fresh)
    fmt = m["shards"]["format"]
    assert fmt["compression"] == "GZIP" and fmt["keys"] == "short" and fmt["layouts"] == ["tensorflow", "jax"]
    encodings = {(s["padding"], s["gains"], s["sample_ids"], s["token_ids"]) for s in fmt["stacks"]}
    assert {e[0] for e in encodings} == {"omitted"} and {e[2] for e in encodings} == {"uint8"}
    assert {e[3] for e in encodings} == {"uint8", "uint16"}
    assert any(p >= 0 for _, _, p, _ in decoded) and any(g != 1.0 for g in decoded.values())
    # The jax records of the same steps: the same (example, feature, position, id, gain), and the arrays the
    # library's jax decoder gives.
    from tpu_embed.artifact.jax_records import decode_batches
    jax_entries = []
    for host, step, ex, payload in read_steps(fresh):
        got, arrays = decode_jax(ex, m, host, step)
        jax_entries += got
        lib = decode_batches(payload, fmt["jax"])
        for name, (rp, eid, sid, g) in arrays.items():
            np.testing.assert_array_equal(rp.reshape(lib[name].row_pointers.shape), lib[name].row_pointers)
            np.testing.assert_array_equal(eid, lib[name].embedding_ids)
            np.testing.assert_array_equal(sid, lib[name].sample_ids)
            np.testing.assert_array_equal(g, lib[name].gains)
    _same(_as_dict(jax_entries), decoded, "jax layout")


def test_host_embedding_checkpoint_keys_and_rows_as_the_page_says(fresh, tmp_path):
    """The checkpoint's keys are the page's; activation = sum of gain x the checkpoint's row `id`, as dequeue says."""
    import tensorflow as tf

    import tpu_embed
    from tpu_embed.training.host_embedding import HostEmbedding
    m = json.load(open(os.path.join(fresh, "manifest.json")))
    emb = HostEmbedding.from_artifact(fresh, seed=3)
    record = next(iter(tpu_embed.input_fn(fresh)))
    acts, preserved = emb.dequeue(record)
    emb.apply_gradients({k: tf.ones_like(v) for k, v in acts.items()}, preserved)  # slots and counter move
    emb.flush()
    acts, _ = emb.dequeue(record)
    path = tf.train.Checkpoint(embedding=emb).save(str(tmp_path / "ckpt"))
    reader = tf.train.load_checkpoint(path)
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    spec = _spec(fresh)
    slots = {"adagrad": ["accumulators"]}[spec["optimizer"]["type"]]
    want = {"_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE",
            "embedding/iterations/.ATTRIBUTES/VARIABLE_VALUE"}
    rows = {f["table"]: f["table_vocabulary_size"] for f in m["features"].values()}
    for t in rows:
        want.add(f"embedding/tables/{t}/.ATTRIBUTES/VARIABLE_VALUE")
        want |= {f"embedding/slots/{t}/{s}/.ATTRIBUTES/VARIABLE_VALUE" for s in slots}
    assert set(shapes) == want
    dims = {t["name"]: t["dim"] for t in spec["tables"]}
    for t, n in rows.items():
        assert shapes[f"embedding/tables/{t}/.ATTRIBUTES/VARIABLE_VALUE"] == [n, dims[t]]
        assert dtypes[f"embedding/tables/{t}/.ATTRIBUTES/VARIABLE_VALUE"] == tf.float32
    assert int(reader.get_tensor("embedding/iterations/.ATTRIBUTES/VARIABLE_VALUE")) == 1
    # Step 0 of host 0, decoded by the page, looked up in the checkpoint's tables.
    host, step, ex, _ = next(read_steps(fresh))
    entries, _ = decode_tensorflow(ex, m, host, step)
    per_host = m["batch_sizes"]["per_host"]
    for name in {e.feature for e in entries}:
        table = reader.get_tensor(f"embedding/tables/{m['features'][name]['table']}/.ATTRIBUTES/VARIABLE_VALUE")
        L = m["features"][name]["sequence_length"]
        mine = np.zeros((per_host, L, table.shape[1]) if L else (per_host, table.shape[1]), np.float64)
        for e in entries:
            if e.feature == name:
                mine[(e.example,) + ((e.position,) if L else ())] += e.gain * table[e.id].astype(np.float64)
        np.testing.assert_allclose(mine, acts[name].numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_the_page_names_every_key_a_reader_meets(fresh):
    """Every key of the manifest's `layout` and `shards.format.jax` of both artifacts, and every record key kind,
    is named on the page (a key added to the writer without a word here fails this)."""
    page = open(os.path.join(ROOT, "docs", "reference", "artifacts.md"), encoding="utf-8").read()
    keys = set()
    for artifact in (FIXTURE, fresh):
        m = json.load(open(os.path.join(artifact, "manifest.json")))
        layout = m["layout"]
        keys |= set(layout) | set(layout["topology"])
        for part in ("stacks", "tables"):
            keys |= {k for v in layout[part].values() for k in v}
        keys |= {k for f in layout["features"] for k in f}
        fmt = m["shards"]["format"]
        keys |= set(fmt) | {k for s in fmt["stacks"] for k in s}
        if "jax" in fmt:
            keys |= {k for k in fmt["jax"] if k != "stacks"} | {k for s in fmt["jax"]["stacks"] for k in s}
            keys |= {k for s in fmt["jax"]["stacks"] for part in ("tables", "features") for x in s[part] for k in x}
    keys |= {"rp", "cnt", "sid", "tid", "g", "n", "eid", "st", "row_pointers", "sorted_sample_ids",
             "sorted_token_ids", "sorted_gains", "sizes", "counts"}
    spans = re.findall(r"``(.+?)``|`([^`]+)`", re.sub(r"```.*?```", "", page, flags=re.S), flags=re.S)
    named = {w for span in spans for w in re.findall(r"[A-Za-z0-9_]+", "".join(span))}
    missing = sorted(keys - named)
    assert not missing, f"docs/reference/artifacts.md does not name {missing}"
    for text in ("embedding/tables/<table>/.ATTRIBUTES/VARIABLE_VALUE", "roundup(S, 8)", "2147483648.0",
                 "embedding/slots/<table>/<slot>/.ATTRIBUTES/VARIABLE_VALUE",
                 "embedding/iterations/.ATTRIBUTES/VARIABLE_VALUE"):
        assert text in page, text
