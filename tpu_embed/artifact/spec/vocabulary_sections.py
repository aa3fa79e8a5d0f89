"""The `vocabulary` section of a categorical feature: frequency (counted tokens), identity or hashing.

Each type carries the other types' fields as class constants, so code reads `f.vocabulary.num_oov_buckets`
whatever the type.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Dict, Literal, Mapping, Optional, Type, Union

from pydantic import BaseModel, Discriminator, Tag, model_validator

from tpu_embed.artifact.spec.fields import Count, NullIsDefault, PosInt, SpecModel, field
from tpu_embed.artifact.spec.normalized import normalize_vocabulary
from tpu_embed.artifact.spec.spec_error import SpecError


class FrequencyVocabulary(SpecModel):
    type: Literal["frequency"] = "frequency"
    top_k: Optional[PosInt] = field(None, fix="a positive integer, or null for every token.")
    frequency_threshold: Optional[Count] = field(None, fix="the minimum count (>= 0) a token needs, or null.")
    num_oov_buckets: Count = field(
        1, fix="0 drops out-of-vocabulary values (counted), N > 0 hashes them into N buckets.")
    # Daily retraining (docs/how-to/daily-retraining.md): rebuild recounts from scratch; append keeps a base
    # artifact's ids and gives new tokens the next ones; frozen keeps the base's vocabulary as it is.
    mode: Literal["rebuild", "append", "frozen"] = field(
        "rebuild", fix="use rebuild (recount, the default), append (keep the base's ids, add new tokens) or frozen "
                       "(the base's vocabulary as it is).")
    capacity: Optional[PosInt] = field(
        None, fix="the table rows reserved for tokens (the OOV buckets come after them), or null to let the "
                  "vocabulary grow.")
    num_buckets: ClassVar[None] = None
    default_value: ClassVar[None] = None

    @model_validator(mode="after")
    def _capacity_rules(self) -> "FrequencyVocabulary":
        if self.capacity is not None and self.mode == "rebuild":
            raise SpecError("capacity", "only applies to mode: append or frozen (rows reserved across a lineage).",
                            "set mode: append, or remove capacity (top_k caps a rebuilt vocabulary).")
        if self.capacity is not None and self.top_k is not None and self.top_k > self.capacity:
            raise SpecError("top_k", f"{self.top_k} is more than capacity={self.capacity} (the vocabulary never "
                            "holds more tokens than its capacity).", "lower top_k, or raise capacity.")
        return self

    def to_dict(self) -> dict:
        """Without `mode` and `capacity` when they are the defaults (the normalized form of earlier specs)."""
        return normalize_vocabulary(super().to_dict())


class IdentityVocabulary(SpecModel):
    type: Literal["identity"]
    num_buckets: PosInt = field(fix="an identity vocabulary needs num_buckets (the table's row count).")
    default_value: Optional[Count] = field(None, fix="the id for invalid values, or null (policies.invalid_ids).")
    top_k: ClassVar[None] = None
    frequency_threshold: ClassVar[None] = None
    num_oov_buckets: ClassVar[int] = 0
    mode: ClassVar[str] = "rebuild"  # no vocabulary: the ids are stable already
    capacity: ClassVar[None] = None

    @model_validator(mode="after")
    def _default_below_num_buckets(self) -> "IdentityVocabulary":
        if self.default_value is not None and self.default_value >= self.num_buckets:
            raise SpecError("default_value", f"{self.default_value} is not below num_buckets={self.num_buckets}.",
                            f"use an id in [0, {self.num_buckets}).")
        return self


class HashingVocabulary(SpecModel):
    type: Literal["hashing"]
    num_buckets: PosInt = field(fix="a hashing vocabulary needs num_buckets (the table's row count).")
    top_k: ClassVar[None] = None
    frequency_threshold: ClassVar[None] = None
    num_oov_buckets: ClassVar[int] = 0
    mode: ClassVar[str] = "rebuild"  # no vocabulary: the ids are stable already
    capacity: ClassVar[None] = None
    default_value: ClassVar[None] = None


VOCABULARIES: Dict[str, Type[BaseModel]] = {
    "frequency": FrequencyVocabulary, "identity": IdentityVocabulary, "hashing": HashingVocabulary}


def vocabulary_type(v: Any) -> Optional[str]:
    """The `type` of a vocabulary section (given or parsed); frequency where a mapping has none."""
    if not isinstance(v, Mapping):
        return getattr(v, "type", None)
    t = v.get("type", FrequencyVocabulary.model_fields["type"].default)
    return t if isinstance(t, str) else repr(t)


VocabularySpec = Annotated[Union[Annotated[FrequencyVocabulary, Tag("frequency")],
                                 Annotated[IdentityVocabulary, Tag("identity")],
                                 Annotated[HashingVocabulary, Tag("hashing")]],
                           Discriminator(vocabulary_type), NullIsDefault]
