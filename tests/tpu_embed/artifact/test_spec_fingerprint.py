"""Spec fingerprints and normalized forms are pinned: manifests and `spec.yaml` files already written must keep
matching the specs they were made from.

`RECORDED` holds, for every bundled and fixture spec and for specs that put each compatibility rule of the
normalization (`tpu_embed.artifact.spec.normalized.COMPATIBILITY_RULES`) in its given and its not-given state,
the fingerprint and the sha256 of `to_yaml()` (the normalized form, key order included) as recorded from the
code that wrote the artifacts in use. A change of either is a change of every artifact made from that spec.
"""

from __future__ import annotations

import copy
import hashlib
import os

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import ROOT, SPECS
from tests.helpers.training import VARIANTS, variant_spec
from tpu_embed.artifact.spec import Spec, load_spec, parse_spec
from tpu_embed.artifact.spec.normalized import COMPATIBILITY_RULES, normalize

SPEC_FILES = {**SPECS, "movielens_v1_artifact": os.path.join(ROOT, "tests", "fixtures", "movielens_v1_artifact",
                                                             "spec.yaml")}

BASE = {
    "inputs": {"format": "csv", "patterns": ["x.csv"]},
    "label": {"column": "label"},
    "dense": ["d"],
    "categorical": [{"name": "a"}, {"name": "b", "table": "shared"}, {"name": "c", "table": "shared"},
                    {"name": "h", "vocabulary": {"type": "hashing", "num_buckets": 7}},
                    {"name": "i", "vocabulary": {"type": "identity", "num_buckets": 9, "default_value": 0}}],
    "defaults": {"table": {"dim": 8}},
    "optimizer": {"type": "adagrad", "learning_rate": 0.1},
    "topology": {"num_chips": 2},
    "global_batch_size": 16,
}

APPEND = {"vocabulary": {"mode": "append", "capacity": 100}}

# name: sections written over BASE (a categorical entry's changes go in "categorical.0").
CHANGES = {
    "base": {},
    "not_given_written": {"categorical.0": {"vocabulary": {"mode": "rebuild", "capacity": None}},
                          "profile_candidate_chip_counts": [], "shards": {"layout": "tensorflow"}, "base": None,
                          "shuffle": None, "epochs": 1, "partition": {"ids": "frequency"}},
    "append": {"categorical.0": APPEND},
    "frozen": {"categorical.0": {"vocabulary": {"mode": "frozen"}}},
    "append_shared": {"categorical.1": APPEND, "categorical.2": APPEND},
    "candidates": {"profile_candidate_chip_counts": [4, 8]},
    "layout_jax": {"shards": {"layout": "jax", "compression": "gzip"}, "topology": {"num_chips": 2,
                                                                                      "num_sc_per_chip": 2}},
    "layout_both": {"shards": {"layout": "both"}},
    "compressed": {"shards": {"compression": "ZLIB"}},
    "based": {"base": "../day1"},
    "shuffled": {"shuffle": {"seed": 7}, "epochs": 3},
    "shuffled_once": {"shuffle": {"seed": 0}},
    "balanced": {"partition": {"ids": "balanced"}},
    "limits": {"limits": {"max_ids_per_table": {"z": 3, "a": 5}, "allow_id_dropping": True}},
    "limits_empty": {"limits": {}},
    "pipelined": {"training": {"pipeline_execution_with_tensor_core": True}},
    "everything": {"categorical.0": APPEND, "profile_candidate_chip_counts": [4], "shards": {"layout": "both"},
                   "base": "../day1", "shuffle": {"seed": 3}, "epochs": 2, "partition": {"ids": "balanced"},
                   "limits": {"max_unique_ids_per_table": {"b": 2}}},
}

# name: (fingerprint, sha256 of to_yaml()), recorded from the code that wrote the artifacts in use.
RECORDED = {
    "criteo": ("2ab84fd9ed734271741407b2b8685ac4262a310aa744066dbec11a7ee8490d47",
              "860afdd7eea41852bc5276b874a2e3825da81f9b79df436f6a741d34604a65f2"),
    "movielens": ("10b2de4feba381dfbb168021573a3d27e8cd35bc1b666618d28771ca6a5d371e",
                 "a13ad89f1c6ad9ce482ad9155bb51cc294797c98479016e19178c7724e37db64"),
    "movielens_v1_artifact": ("10b2de4feba381dfbb168021573a3d27e8cd35bc1b666618d28771ca6a5d371e",
                             "a13ad89f1c6ad9ce482ad9155bb51cc294797c98479016e19178c7724e37db64"),
    "criteo4": ("97a161a25e536fe4dfc4c8f5c00eba8f010a61e559b238bc59489a41380bf494",
               "9d958c79a08e2c48db54c8aceeb5b8c7863b3bbf11666b8fe7de514272b9ab24"),
    "movielens2": ("6034547a80ddbb2782a26b5eae811fdb62fbfe50e015b364b23fb950a00d7883",
                  "873050ac6f310652c7ee55f0665039f65ed2f925d2a045b40011585fd3ce1c99"),
    "movielens_2hosts": ("10b2de4feba381dfbb168021573a3d27e8cd35bc1b666618d28771ca6a5d371e",
                        "bbbc7e0049f33fa7da3d733a3144443bb91aa0cec916dacbe01db19a7853b7b9"),
    "base": ("7d9e58f13f53682c164f02e8c8dab2dabacab074c90a9997c448c69388ea9177",
            "b51274fad2d4a407b0d27ac7dd65767a758d15feb52626347ef15486798af7c1"),
    "not_given_written": ("7d9e58f13f53682c164f02e8c8dab2dabacab074c90a9997c448c69388ea9177",
                         "b51274fad2d4a407b0d27ac7dd65767a758d15feb52626347ef15486798af7c1"),
    "append": ("c1ba675bb3272e837511762d13f48b49239b4f292b79dce3ed7f03e62b2667e3",
              "21a8db621da456dc4f869376fcc5c34518f261f11a971fbdeae942012f01d9d8"),
    "frozen": ("83571b9688f49762f5299ef1a2854bb83c3c4afcf64311ce0856400bc986f69a",
              "ba65630f6b487047d2dfedb5a57e683b7afba6df903555d3c8d9b8501f0ae5db"),
    "append_shared": ("6e81396f8d46b6e1e791dc14fa944c4a17451c99b297f6ecc0d6146dbc5a45ca",
                     "0f2f673384d70e2ac941692d42f55b620faf20491f34ecf53cf1fe3fd5f5ddb2"),
    "candidates": ("7d9e58f13f53682c164f02e8c8dab2dabacab074c90a9997c448c69388ea9177",
                  "0e62460c1a5040fad69e7b9b32a5dfe852651c1b9913575b11b5762c0c0dcd1c"),
    "layout_jax": ("433262ca4fc6e355d6a4491be2a42f082e1aa2d2bb211938b1faeb3364012221",
                  "273d8ca11266362ade0ae64162788b409ebd5fcdd1a9c00b386bc761ea3c2e89"),
    "layout_both": ("7d9e58f13f53682c164f02e8c8dab2dabacab074c90a9997c448c69388ea9177",
                   "13a905c7865196c3a0323225a857d1e4999e737a08a48284e5477ec38d0c48ab"),
    "compressed": ("7d9e58f13f53682c164f02e8c8dab2dabacab074c90a9997c448c69388ea9177",
                  "4c86e780fb416b8e760e75dfdaf3fa2a68dd83fefc735e0760447680cbbf113b"),
    "based": ("7d9e58f13f53682c164f02e8c8dab2dabacab074c90a9997c448c69388ea9177",
             "c0b3d21adbce32b0359b973031903a565fb799fc8ef016073601f13b732da842"),
    "shuffled": ("fb6a1104a9c6fed35d8de45f637a7553a36919f6974883b6bbdb32eb697f3f12",
                "41ae82104d901e4db7a173476b44bb8e27409da1b3a4836e4a397b7ad830fad6"),
    "shuffled_once": ("f43470ff80acd11ca7360346992c904487cf029fae02c3e8621098b3060880a0",
                     "4bfa5d635b27b2ca467732622edd4d0679ccd9e85eb7d12b4d9818f13e44dbf6"),
    "balanced": ("49257a6fb81cf295857f5092859e228d3ee5e7d0b4c6170f75c58ad81ce94581",
                "af4f87110650ae1550950c6fd94050acb90aa97f5eba6aed4a3fb98d68b4a764"),
    "limits": ("cabd4e15cda4cfe934aa18ded1885f49f245f6cdbfa984f054b10854c57f80cf",
              "d1900e5c87431a4b3ebf6c23b23acad09e791b1293fb5aaaf4be0e6250ad24bd"),
    "limits_empty": ("3eee9cec946b398f4b97b1ee263fa88f42e1c11b54d2472ee14f0b625ede0c11",
                    "6317628f6b8a5559854fec530403ca44ca7496987e4221b67abf38cee5d4bd5f"),
    "pipelined": ("7d9e58f13f53682c164f02e8c8dab2dabacab074c90a9997c448c69388ea9177",
                 "db17fc280394fb58d669f524c31c6ace19df182b8b0f1f91e55f75df9f464567"),
    "everything": ("9f3e9b9c08600e8a739b26c99c98cfae3ecf2c03fcc227c3aa9ce68bcf137b87",
                  "28ceb33733b1a20a495da344a0da202c86108a3d90748284029f1633145c0501"),
}


def changed(changes: dict) -> dict:
    raw = copy.deepcopy(BASE)
    for key, value in changes.items():
        if key.startswith("categorical."):
            entry = raw["categorical"][int(key.split(".")[1])]
            entry.update(copy.deepcopy(value))
        else:
            raw[key] = copy.deepcopy(value)
    return raw


def spec_named(name: str) -> Spec:
    if name in SPEC_FILES:
        return load_spec(SPEC_FILES[name])
    if name in VARIANTS:
        return variant_spec(name)
    return parse_spec(changed(CHANGES[name]))


def pinned(spec: Spec):
    return spec.fingerprint, hashlib.sha256(spec.to_yaml().encode("utf-8")).hexdigest()


NAMES = [*SPEC_FILES, *VARIANTS, *CHANGES]


@pytest.mark.parametrize("name", NAMES)
def test_fingerprints_and_normalized_forms_are_unchanged(name):
    assert pinned(spec_named(name)) == RECORDED[name]


def test_every_spec_is_pinned():
    assert sorted(RECORDED) == sorted(NAMES)


def test_not_given_values_written_out_normalize_as_if_left_out():
    assert spec_named("not_given_written").to_dict() == spec_named("base").to_dict()


def test_each_rule_leaves_its_keys_out_only_in_its_not_given_state():
    plain = spec_named("base").to_dict()
    assert all(k not in plain for k in ("profile_candidate_chip_counts", "base", "shuffle", "epochs", "partition"))
    assert "layout" not in plain["shards"] and "mode" not in plain["categorical"][0]["vocabulary"]
    full = spec_named("everything").to_dict()
    assert full["categorical"][0]["vocabulary"]["mode"] == "append" and full["shards"]["layout"] == "both"
    assert (full["profile_candidate_chip_counts"], full["base"], full["shuffle"], full["epochs"],
            full["partition"]) == ([4], "../day1", {"seed": 3}, 2, {"ids": "balanced"})
    assert {r.section for r in COMPATIBILITY_RULES} == {"", "shards", "categorical[].vocabulary"}


def test_normalize_leaves_out_what_the_rules_say_and_keeps_the_order():
    d = {"categorical": [{"vocabulary": {"type": "frequency", "mode": "rebuild", "capacity": None}},
                         {"vocabulary": {"type": "frequency", "mode": "append", "capacity": None}}],
         "shards": {"compression": "none", "layout": "tensorflow"}, "base": None, "shuffle": None, "epochs": 1,
         "profile_candidate_chip_counts": [], "partition": {"ids": "frequency"}, "x": 1}
    normalize(d)
    assert d == {"categorical": [{"vocabulary": {"type": "frequency"}},
                                 {"vocabulary": {"type": "frequency", "mode": "append", "capacity": None}}],
                 "shards": {"compression": "none"}, "x": 1}
    assert list(d) == ["categorical", "shards", "x"]


# One optional section each: (a given value, a written not-given value); absent from the draw: left out.
OPTIONAL = {
    "profile_candidate_chip_counts": ([2, 4], []),
    "shards": ({"layout": "jax", "compression": "GZIP"}, {"layout": "tensorflow"}),
    "base": ("../day0", None),
    "shuffle": ({"seed": 11}, None),
    "partition": ({"ids": "balanced"}, {"ids": "frequency"}),
    "limits": ({"max_ids_per_chip_per_sample": 32}, None),
}
VOCABULARY = ({"mode": "append", "capacity": 50}, {"mode": "rebuild"})


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(OPTIONAL)), st.booleans()),
       st.lists(st.sampled_from([None, True, False]), min_size=3, max_size=3))
def test_generated_specs_round_trip_and_written_defaults_change_nothing(sections, vocabularies):
    """`sections`: {key: given?} (absent keys left out); `vocabularies`: a, b and c's mode (None: not written)."""
    raw, plain = copy.deepcopy(BASE), copy.deepcopy(BASE)
    for key, is_given in sections.items():
        raw[key] = copy.deepcopy(OPTIONAL[key][0 if is_given else 1])
        if is_given:
            plain[key] = copy.deepcopy(raw[key])
    shared = vocabularies[1] if vocabularies[1] is not None else vocabularies[2]
    for i, mode in enumerate(vocabularies[:1] + [shared, shared]):
        if mode is not None:
            raw["categorical"][i]["vocabulary"] = dict(VOCABULARY[0 if mode else 1])
            if mode:
                plain["categorical"][i]["vocabulary"] = dict(VOCABULARY[0])
    if sections.get("shuffle"):
        raw["epochs"] = plain["epochs"] = 2
    spec = parse_spec(raw)
    d = spec.to_dict()
    again = parse_spec(d)
    assert again.to_dict() == d and again.fingerprint == spec.fingerprint
    assert parse_spec(yaml.safe_load(spec.to_yaml())).to_dict() == d
    left_out = parse_spec(plain)
    assert left_out.to_dict() == d and left_out.fingerprint == spec.fingerprint
