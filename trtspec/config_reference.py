"""The build-config reference (docs/configuration.md), generated from the pydantic schema in trtspec.config.

The schema is the one home of every field, its type, default, limits and meaning; this renders it as Markdown.
tests/test_config_reference.py fails when the checked-in file differs from what this renders. Regenerate with:

    python -m trtspec.config_reference > docs/configuration.md
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

import annotated_types
from pydantic import BaseModel, ByteSize
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from trtspec.config import BuildConfig, yaml_key

HEADER = """# Build configuration reference

<!-- Generated from trtspec/config.py by `python -m trtspec.config_reference > docs/configuration.md`; do not edit. -->

One YAML file describes one deployment; `trtspec doctor CONFIG` and `trtspec build CONFIG` validate it.
Unknown keys are errors. Each section below is a mapping in the file; the examples in `build_configs/` use them.
"""


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]), True
    return tp, False


def _constraints(metadata: list[Any]) -> list[str]:
    out = []
    for m in metadata:
        if isinstance(m, FieldInfo):  # Field(ge=...) inside Annotated carries its limits as metadata
            out += _constraints(m.metadata)
            continue
        for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None and isinstance(m, (annotated_types.Ge, annotated_types.Gt, annotated_types.Le, annotated_types.Lt, annotated_types.Interval)):
                # 0 and 0.0 alike: typing caches Annotated[float, Field(ge=0)] and [..., ge=0.0] as one (their
                # limits compare equal), so which spelling a field shows depends on what was imported first
                out.append(f"{sym} {v:g}" if isinstance(v, (int, float)) else f"{sym} {v}")
        pattern = getattr(m, "pattern", None)
        if pattern:
            out.append(f"matches `{pattern}`")
    return out


def type_name(tp: Any) -> str:
    """A reader's name for an annotation: `int (>= 1)`, `one of: a, b`, `map int -> int`, `list of int`."""
    tp, optional = _unwrap_optional(tp)
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(tp)
        limits = _constraints(meta)
        name = type_name(base)
        return f"{name} ({', '.join(limits)})" if limits else name
    if origin is typing.Literal:
        return "one of: " + ", ".join(f"`{a}`" for a in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of: " + ", ".join(f"`{m.value}`" for m in tp)
    if origin is dict:
        k, v = typing.get_args(tp)
        return f"map {type_name(k)} -> {type_name(v)}"
    if origin is list:
        (item,) = typing.get_args(tp)
        return f"list of {type_name(item)}"
    if isinstance(tp, type) and issubclass(tp, ByteSize):
        return "size (bytes, or with a unit: `256MiB`, `2GB`)"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "section"
    if isinstance(tp, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(tp.__name__, tp.__name__)
    return str(tp)


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.default
    if value is PydanticUndefined and field.default_factory is not None:
        value = field.default_factory()
    if value is None:
        return "unset"
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _model_of(tp: Any) -> type[BaseModel] | None:
    tp, _ = _unwrap_optional(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _section(path: str, model: type[BaseModel], out: list[str]) -> None:
    doc = (model.__doc__ or "").strip()
    out += [f"## `{path}`" if path else "## Top level", ""]
    if doc and not doc.startswith(("Usage docs", "A base class")):
        out += [_cell(doc), ""]
    out += ["| key | type | default | meaning |", "|---|---|---|---|"]
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        name = yaml_key(model, name)
        annotation = field.annotation
        if field.metadata:
            annotation = typing.Annotated[(annotation, *field.metadata)]
        sub = _model_of(field.annotation)
        key = f"{path}.{name}" if path else name
        if sub is not None:
            nested.append((key, sub))
            kind = "section" + (" (optional)" if _unwrap_optional(field.annotation)[1] else "")
            out.append(f"| `{name}` | {kind}: see [`{key}`](#{key.replace('.', '')}) | {_default(field)} | {_cell(field.description or '')} |")
        else:
            out.append(f"| `{name}` | {_cell(type_name(annotation))} | {_default(field)} | {_cell(field.description or '')} |")
    out.append("")
    for key, sub in nested:
        _section(key, sub, out)


def render() -> str:
    out = [HEADER]
    _section("", BuildConfig, out)
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    print(render(), end="")
