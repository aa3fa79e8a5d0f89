"""The building blocks of the spec's sections: their base model and the field types they share."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, List, Mapping, Type

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticUndefined, PydanticUseDefault


def field(default: Any = PydanticUndefined, fix: str = "", **kw: Any) -> Any:
    """A field whose validation errors carry the hint `fix`."""
    return Field(default, json_schema_extra={"fix": fix}, **kw)


def _null_is_default(v: Any) -> Any:
    if v is None:
        raise PydanticUseDefault()
    return v


NullIsDefault = BeforeValidator(_null_is_default)  # `key: null` means the field's default
PosInt = Annotated[int, Field(strict=True, ge=1)]
Count = Annotated[int, Field(strict=True, ge=0)]
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Str = Annotated[str, Field(strict=True, min_length=1)]
Name = Annotated[str, Field(strict=True, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$", json_schema_extra={
    "fix": "use letters, digits, '_', '.', '-' (it becomes a file name and a TF name)."})]


# A section of the spec: frozen, unknown keys refused; a bare string can stand for one field. No docstring:
# `inspect.getdoc` would hand it to every section that has none.
class SpecModel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    _shorthand: ClassVar[str] = ""  # a bare string `s` means {_shorthand: s}
    _same_as: ClassVar[Mapping[str, str]] = {}  # {field: the field whose value it defaults to}

    @model_validator(mode="before")
    @classmethod
    def _expand(cls, data: Any) -> Any:
        if cls._shorthand and isinstance(data, str):
            data = {cls._shorthand: data}
        if cls._same_as and isinstance(data, Mapping):
            data = {**{k: data[src] for k, src in cls._same_as.items() if src in data}, **data}
        return data

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")


def section_keys(cls: Type[BaseModel]) -> List[str]:
    """The keys a section accepts: its field names, or their aliases."""
    return [str(a) for n, f in cls.model_fields.items() for a in getattr(f.validation_alias, "choices", [n])]
