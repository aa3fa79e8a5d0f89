"""The normalized spec (manifests, `spec.yaml` in an artifact) and its fingerprint.

`Spec.to_dict` writes every key with its value; `normalize` then leaves out the keys that a spec written
before they existed did not have, while they hold the value such a spec meant. An artifact records its spec's
fingerprint and normalized form; leaving these keys out keeps both the same for every spec that does not use
them, so artifacts already written stay valid for the specs they were made from.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, NamedTuple, Tuple

from tpu_embed.core.canonical import fingerprint

VOCABULARY = "categorical[].vocabulary"


class LeftOut(NamedTuple):
    section: str  # where the keys are: "" the top level, "shards", or VOCABULARY (each feature's vocabulary)
    unless: Mapping[str, Any]  # the keys are left out while these keys hold these values ...
    keys: Tuple[str, ...]  # ... these keys


# Each key added to the spec after fingerprints were first recorded, with the value that means "not used".
COMPATIBILITY_RULES: Tuple[LeftOut, ...] = (
    LeftOut(VOCABULARY, {"mode": "rebuild", "capacity": None}, ("mode", "capacity")),  # daily retraining
    LeftOut("", {"profile_candidate_chip_counts": []}, ("profile_candidate_chip_counts",)),
    LeftOut("shards", {"layout": "tensorflow"}, ("layout",)),  # jax-tpu-embedding's records
    LeftOut("", {"base": None}, ("base",)),  # a lineage's previous artifact
    LeftOut("", {"shuffle": None}, ("shuffle", "epochs")),  # epochs > 1 needs shuffle
    LeftOut("", {"partition": {"ids": "frequency"}}, ("partition",)),  # balanced ids
)

# Where the data lives and how files are stored, not what the artifact holds: the same spec run on another copy
# of the data (CSV, Parquet or TFRecord) or read by the training job has the same fingerprint.
NOT_FINGERPRINTED = ("inputs", "name", "profile_data_directory", "profile_candidate_chip_counts", "training",
                     "shards", "base")


def _sections(d: Dict[str, Any], section: str) -> List[Dict[str, Any]]:
    if section == VOCABULARY:
        return [f["vocabulary"] for f in d["categorical"]]
    return [d[section]] if section else [d]


def leave_out(rule: LeftOut, section: Dict[str, Any]) -> None:
    """Removes `rule.keys` from `section` (in place) if its `unless` keys hold the not-used values."""
    for k, v in rule.unless.items():
        if k not in section or section[k] != v:
            return
    for k in rule.keys:
        del section[k]


def normalize(full: Dict[str, Any]) -> None:
    """Removes from `full` (every key of the spec, as `Spec.to_dict` builds it; changed in place) the keys
    `COMPATIBILITY_RULES` leave out: what remains is the normalized spec that older artifacts recorded, the
    order of its keys kept."""
    for rule in COMPATIBILITY_RULES:
        for section in _sections(full, rule.section):
            leave_out(rule, section)


def normalize_vocabulary(vocabulary: Dict[str, Any]) -> Dict[str, Any]:
    """One vocabulary section (a copy) without the keys `COMPATIBILITY_RULES` leave out of it."""
    d = dict(vocabulary)
    for rule in COMPATIBILITY_RULES:
        if rule.section == VOCABULARY:
            leave_out(rule, d)
    return d


def fingerprint_of(normalized: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of a normalized spec without the keys in `NOT_FINGERPRINTED`."""
    return fingerprint({k: v for k, v in normalized.items() if k not in NOT_FINGERPRINTED})
