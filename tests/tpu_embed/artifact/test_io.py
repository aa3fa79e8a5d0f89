"""tpu_embed.artifact.io on local paths and on a GCS emulator (loopback), and tpu_embed.artifact.manifest's reader.

The same checks run against both backends: atomic writes return the sha256
and size and leave nothing behind when they fail, globbing is sorted and
lists files only, and errors name the path.
"""

from __future__ import annotations

import hashlib
import os

import pytest

from tests.helpers.object_store import gcs_emulator
from tpu_embed.artifact import io as tio
from tpu_embed.artifact.manifest import (
    SCHEMA_VERSION,
    Manifest,
    ManifestError,
    ManifestNotFoundError,
    manifest_bytes,
    read_manifest,
)


@pytest.fixture(scope="module")
def emulator():
    with gcs_emulator("io-test") as url:
        yield url


@pytest.fixture(params=["local", "gs"])
def base(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "root")
    request.getfixturevalue("emulator")
    return f"gs://io-test/{request.node.name.replace('[', '-').rstrip(']')}"


def _listing(base: str):
    return [p[len(base) + 1:] for p in tio.glob(tio.join(base, "**"))]


# ---------------------------------------------------------------- paths

def test_paths():
    assert tio.join("gs://b/x/", "/y/", "z.json") == "gs://b/x/y/z.json"
    assert tio.join("/tmp/a", "b", "c") == os.path.join("/tmp/a", "b", "c")
    assert tio.protocol("gs://b/x") == "gs" and tio.protocol("/x") == "" and tio.protocol("file:///x") == ""
    assert tio.is_url("s3://b/k") and not tio.is_url("relative/path") and not tio.is_url("file:///x")
    assert tio.dirname("gs://b/x/y.json") == "gs://b/x" and tio.dirname("gs://b/x") == "gs://b"
    assert tio.dirname("gs://b") == "gs://b" and tio.basename("gs://b/x/y.json") == "y.json"
    assert tio.relpath("gs://b/out/profiles/m.json", "gs://b/out/") == "profiles/m.json"
    assert tio.relpath("gs://b/out", "gs://b/out") == "."
    assert tio.relpath("gs://b/output2/x", "gs://b/out") is None and tio.relpath("gs://c/out/x", "gs://b/out") is None
    assert tio.relpath("/a/b/c", "/a") == os.path.join("b", "c") and tio.relpath("/a/x", "/a/b") is None
    assert tio.is_absolute("gs://b") and tio.is_absolute("/x") and not tio.is_absolute("x/y")


# ---------------------------------------------------------------- both backends

def test_write_read_exists_delete(base):
    path = tio.join(base, "sub", "x.bin")
    assert not tio.exists(path)
    w = tio.write_atomic(path, [b"ab", b"", b"cd"])
    assert (w.path, w.sha256, w.bytes) == (path, hashlib.sha256(b"abcd").hexdigest(), 4)
    assert tio.exists(path) and tio.isfile(path) and tio.read_bytes(path) == b"abcd" and tio.size(path) == 4
    with tio.open_read(path) as fh:
        assert fh.read(3) == b"abc" and fh.read() == b"d"
    assert tio.write_text_atomic(path, "é\n").bytes == 3 and tio.read_text(path) == "é\n"  # replaced
    empty = tio.write_atomic(tio.join(base, "empty"), b"")
    assert empty.bytes == 0 and tio.read_bytes(empty.path) == b""
    tio.delete(path)
    assert not tio.exists(path)
    tio.delete(path)  # missing_ok
    with pytest.raises(FileNotFoundError):
        tio.delete(path, missing_ok=False)
    with pytest.raises(FileNotFoundError, match="x.bin"):
        tio.read_bytes(path)
    assert _listing(base) == ["empty"]


def test_failed_write_leaves_old_content_and_no_temp_file(base):
    path = tio.join(base, "d", "f.json")
    tio.write_atomic(path, b"old")

    def chunks():
        yield b"new, half"
        raise RuntimeError("producer failed")

    with pytest.raises(RuntimeError, match="producer failed"):
        tio.write_atomic(path, chunks())
    assert tio.read_bytes(path) == b"old"
    with pytest.raises(RuntimeError):
        tio.write_atomic(tio.join(base, "d", "never.json"), chunks())
    assert not tio.exists(tio.join(base, "d", "never.json"))
    assert _listing(base) == ["d/f.json"]
    if not tio.is_url(base):
        assert os.listdir(os.path.join(base, "d")) == ["f.json"]  # no .tmp-* left


def test_transient_writes_are_atomic_but_neither_synced_nor_hashed(base, monkeypatch):
    """durable=False (shard runs, the read spill): same bytes, same atomicity, no fsync, no sha256."""
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real(fd))
    path = tio.join(base, "t", "run.bin")
    w = tio.write_atomic(path, [b"ab", b"cd"], durable=False)
    assert (w.path, w.sha256, w.bytes) == (path, None, 4) and tio.read_bytes(path) == b"abcd"
    assert synced == []

    def chunks():
        yield b"half"
        raise RuntimeError("producer failed")

    with pytest.raises(RuntimeError, match="producer failed"):
        tio.write_atomic(path, chunks(), durable=False)
    assert tio.read_bytes(path) == b"abcd" and _listing(base) == ["t/run.bin"]
    if not tio.is_url(base):
        assert os.listdir(os.path.join(base, "t")) == ["run.bin"]  # no .tmp-* left
    tio.write_atomic(path, b"x")
    assert len(synced) == int(not tio.is_url(base))  # the default stays durable


def test_local_replace_failure_removes_the_temp_file(tmp_path, monkeypatch):
    path = str(tmp_path / "x.json")
    tio.write_atomic(path, b"old")

    def boom(*a, **k):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        tio.write_atomic(path, b"new")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["x.json"] and open(path, "rb").read() == b"old"


def test_glob_is_sorted_files_only(base):
    names = ["b/2.csv", "a.csv", "b/10.csv", "c.txt", "b/1.csv", "B.csv", "a/z.csv"]
    for n in names:  # written out of order
        tio.write_atomic(tio.join(base, n), n.encode())
    assert tio.glob(tio.join(base, "*.csv")) == [tio.join(base, n) for n in ("B.csv", "a.csv")]
    assert tio.glob(tio.join(base, "b", "*.csv")) == [tio.join(base, n) for n in ("b/1.csv", "b/10.csv", "b/2.csv")]
    assert _listing(base) == sorted(names)  # '**': every file at any depth, sorted, no directories
    stats = tio.list_files(tio.join(base, "b", "1*.csv"))
    assert [(s.path, s.size) for s in stats] == [(tio.join(base, "b/1.csv"), 7), (tio.join(base, "b/10.csv"), 8)]
    assert tio.list_files(tio.join(base, "c.txt")) == [tio.FileStat(tio.join(base, "c.txt"), 5)]  # no pattern
    assert tio.list_files(tio.join(base, "nothing", "*.csv")) == [] == tio.list_files(tio.join(base, "none.csv"))
    assert tio.glob(tio.join(base, "b")) == []  # a directory is not a file


def test_memory_filesystem_through_fsspec():
    """Any fsspec scheme works the same (memory:// here)."""
    w = tio.write_atomic("memory://io-test/x/y.txt", b"zz")
    assert w.bytes == 2 and tio.read_bytes("memory://io-test/x/y.txt") == b"zz"
    assert tio.glob("memory://io-test/**") == ["memory://io-test/x/y.txt"]
    tio.delete("memory://io-test/x/y.txt")
    assert not tio.exists("memory://io-test/x/y.txt")


def test_unknown_scheme_is_a_clear_error():
    with pytest.raises(ValueError, match="no filesystem for nosuchfs://"):
        tio.read_bytes("nosuchfs://x/y")


# ---------------------------------------------------------------- the manifest's one reader

def _manifest() -> dict:
    return {"schema_version": SCHEMA_VERSION, "kind": "tpu_embed.artifact", "spec_fingerprint": "f" * 64,
            "spec_name": "t", "topology": {"num_chips": 1, "num_sc_per_chip": 4, "num_hosts": 1},
            "batch_sizes": {"global": 8, "per_host": 8, "per_chip": 8, "chips_per_host": 1},
            "jobs": {"vocab": {"job": "vocab", "inputs": [{"path": "gs://b/d.csv", "bytes": 3}], "strict": False,
                               "counts": {"records_read": 2}, "engine": "combine"}},
            "files": [{"path": "vocab/a.txt", "sha256": "0" * 64, "bytes": 2, "kind": "vocabulary", "records": 1,
                       "feature": "a"}],
            "features": {"a": {"table": "a", "vocabulary_type": "frequency", "device": "tpu_embedding_core",
                               "sequence_length": 0, "dim": 4, "table_vocabulary_size": 2, "vocabulary_size": 1,
                               "vocabulary_key": "a", "vocabulary_file": "vocab/a.txt"}},
            "vocabularies": {"a": {"key": "a", "features": ["a"], "size": 1, "empty_vocabulary_dummy": False,
                                   "num_oov_buckets": 1, "top_k": None, "frequency_threshold": None,
                                   "tokens_counted": 2, "distinct_tokens": 1, "tokens_covered": 2, "coverage": 1.0,
                                   "files": ["vocab/a.txt"]}},
            "a_key_from_a_later_release": {"kept": True}}


def test_manifest_round_trips_byte_for_byte(base):
    d = _manifest()
    tio.write_atomic(tio.join(base, "manifest.json"), manifest_bytes(d))
    m = read_manifest(base)
    assert m.to_bytes() == manifest_bytes(d) == tio.read_bytes(tio.join(base, "manifest.json"))
    assert m.vocabulary_sizes == {"a": 1} and m.batch_sizes.global_ == 8 and m.files[0].feature == "a"
    assert m["jobs"]["vocab"]["counts"] == {"records_read": 2}  # the JSON view
    assert m.source == tio.join(base, "manifest.json")
    with pytest.raises(ManifestError, match="has no shards: run `tpu-embed shard`"):
        m.shard_files(0)


def test_manifest_errors_name_the_path_and_the_fix(base):
    with pytest.raises(ManifestNotFoundError, match=r"has no manifest.json: .*Run `tpu-embed run` \(or vocab/shard\) "
                                                    r"with --output"):
        read_manifest(base)
    path = tio.join(base, "manifest.json")
    good = manifest_bytes(_manifest())
    cases = [
        (good[:-40], "is truncated"),
        (b"{\"kind\": 1,]", "is not valid JSON"),
        (b"", "is empty"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[1, 2]", "not a tpu_embed manifest"),
        (manifest_bytes({**_manifest(), "kind": "plan"}), "not a tpu_embed artifact manifest"),
        (manifest_bytes({**_manifest(), "schema_version": SCHEMA_VERSION + 1}),
         "written by a newer tpu_embed .*Upgrade tpu_embed, or regenerate"),
        (manifest_bytes({**_manifest(), "schema_version": "1"}), "unknown schema_version"),
        (manifest_bytes({k: v for k, v in _manifest().items() if k != "topology"}),
         "does not match manifest schema 1: topology"),
        (manifest_bytes({**_manifest(), "files": [{"path": "x", "sha256": "0", "bytes": 1, "kind": "nonsense"}]}),
         "files.0.kind"),
    ]
    for data, match in cases:
        tio.write_atomic(path, data)
        with pytest.raises(ManifestError, match=match) as e:
            read_manifest(base)
        assert path in str(e.value)


def test_vocabulary_sizes_needs_the_vocab_job(tmp_path):
    d = {k: v for k, v in _manifest().items() if k != "vocabularies"}
    m = Manifest.from_json(d, "somewhere/manifest.json")
    with pytest.raises(ManifestError, match="somewhere/manifest.json has no vocabularies: run `tpu-embed vocab`"):
        _ = m.vocabulary_sizes
