"""pydantic's validation errors as SpecErrors: the spec key of the error's location, the field's fix, and a
problem in the spec's words."""

from __future__ import annotations

from typing import Any, List, Tuple, get_args

from pydantic import BaseModel, ValidationError

from tpu_embed.artifact.spec.fields import section_keys
from tpu_embed.artifact.spec.spec_error import SpecError, unknown_key
from tpu_embed.artifact.spec.vocabulary_sections import VOCABULARIES

PROBLEMS = {  # pydantic error type -> problem (others: pydantic's message)
    "missing": "missing.", "extra_forbidden": "unknown key.", "too_short": "must not be empty.",
    "int_type": "expected an integer, got {input!r}.", "float_type": "expected a finite number, got {input!r}.",
    "finite_number": "expected a finite number, got {input!r}.", "bool_type": "expected true/false, got {input!r}.",
    "string_type": "expected a string, got {input!r}.", "string_too_short": "must not be empty.",
    "string_too_long": "{input!r} must be a single character.",
    "string_pattern_mismatch": "{input!r} is not a valid name.",
    "greater_than_equal": "must be >= {ge}, got {input!r}.", "greater_than": "must be > {gt}, got {input!r}.",
    "literal_error": "{input!r} is not supported.", "tuple_type": "must be a list, got {input!r}.",
    "dict_type": "expected a mapping, got {input!r}.", "model_type": "expected a mapping, got {input!r}.",
    "union_tag_not_found": "expected a mapping, got {input!r}.",
    "union_tag_invalid": "{tag!r} is not a vocabulary type."}


def models_in(tp: Any) -> List[Any]:
    """The pydantic models a field's type holds (itself, or inside Optional, Union, Tuple ...)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for a in get_args(tp) for m in models_in(a)]


def locate(root: Any, loc: Tuple[Any, ...]) -> Tuple[str, Any, str]:
    """pydantic's `loc` as a spec key (`categorical[3].vocabulary.top_k`), the innermost model, the nearest fix."""
    key, model, fix, tp = "", root, "", root
    for part in loc:
        if isinstance(part, int):
            key += f"[{part}]"
            continue
        models = models_in(tp)
        if part in VOCABULARIES and VOCABULARIES[part] in models:  # the tag of the vocabulary union: no key
            model = tp = VOCABULARIES[part]
            continue
        key, model, tp = f"{key}.{part}" if key else str(part), models[0] if models else model, None
        for name, f in model.model_fields.items() if models else ():
            if part == name or part in getattr(f.validation_alias, "choices", ()):
                tp, fix = f.annotation, (f.json_schema_extra or {}).get("fix") or fix
    return key, model, fix


def spec_error(error: ValidationError, root: Any, prefix: str = "") -> SpecError:
    """The first error of `error` as a SpecError keyed `prefix` + its location, with the field's fix; but an
    unknown key before a missing one (`global_batch_sise` explains a missing `global_batch_size`)."""
    errors = error.errors(include_url=False)
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    e = unknown[0] if unknown and any(e["type"] == "missing" for e in errors) else errors[0]
    where, model, fix = locate(root, e["loc"])
    key = ".".join(k for k in (prefix, where) if k).replace(".[", "[")
    ctx, kind = e.get("ctx") or {}, e["type"]
    inner = ctx.get("error")
    if isinstance(inner, SpecError):  # raised by a validator, keyed relative to where it ran
        return SpecError(".".join(k for k in (key, inner.key) if k) or "<root>", inner.problem, inner.fix)
    if kind == "extra_forbidden":
        owner = [t for t, c in VOCABULARIES.items() if key.rsplit(".", 1)[-1] in c.model_fields]
        vtype = [t for t, c in VOCABULARIES.items() if c is model]
        if vtype and owner:
            return SpecError(key, f"does not apply to a {vtype[0]} vocabulary.", f"remove it, or set type: {owner[0]}.")
        return unknown_key(key or "<root>", section_keys(model))
    elif kind.startswith("union_tag"):
        key, fix = key + ".type" * (kind == "union_tag_invalid"), f"use one of {list(VOCABULARIES)}."
    elif kind == "literal_error" and not fix:
        fix = f"use one of {ctx.get('expected')}."
    try:
        problem = str(inner) if inner is not None else PROBLEMS[kind].format(input=e.get("input"), **ctx)
    except (KeyError, IndexError, ValueError):
        problem = e["msg"] + "."
    return SpecError(key or "<root>", problem, fix)


def validate(model: Any, data: Any, prefix: str = "") -> Any:
    """`model` validated from `data`; its first error a SpecError keyed `prefix` + the location."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise spec_error(e, model, prefix) from None
