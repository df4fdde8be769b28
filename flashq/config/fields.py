"""The config's keys as data, read from the pydantic models: each section's dotted path, and each
field's type, default and allowed values.

The generated reference page (`flashq.config.reference`) and the did-you-mean for an unknown key
(`flashq.config._format_errors`) both read the models through here, so neither can drift from
them. Importable without torch or vLLM, like the models.
"""

from __future__ import annotations

import inspect
import json
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


@dataclass(frozen=True)
class FieldDoc:
    key: str  # dotted, as an override names it: trainer.loss.clip_eps_low
    type: str
    default: str  # as YAML writes it
    allowed: tuple[str, ...]  # the Literal choices and the numeric bounds; none when any value of the type goes
    description: str
    section: bool = False  # the field holds a section of its own (documented under its key)


@dataclass(frozen=True)
class SectionDoc:
    key: str  # dotted; "" for the top level
    model: type[BaseModel]
    about: str  # the model's docstring, as one paragraph
    same_as: str | None = None  # the same model is documented under this key already
    fields: list[FieldDoc] = field(default_factory=list)


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds, if it holds one (`EnvConfig | None` holds EnvConfig)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        models = [m for a in get_args(annotation) if (m := section_model(a)) is not None]
        return models[0] if len(models) == 1 else None
    return None


def section_at(root: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    """The model at a dotted path's parts (["trainer", "loss"]), or None if the path is not a section."""
    model = root
    for part in path:
        info = model.model_fields.get(part)
        model = section_model(info.annotation) if info is not None else None
        if model is None:
            return None
    return model


def sections(root: type[BaseModel]) -> list[SectionDoc]:
    """Every section under `root`, depth first in field order; a model met again (eval.task is a
    task section) is named, not repeated."""
    out: list[SectionDoc] = []
    seen: dict[type[BaseModel], str] = {}

    def walk(model: type[BaseModel], key: str) -> None:
        if model in seen:
            out.append(SectionDoc(key, model, _about(model), same_as=seen[model]))
            return
        seen[model] = key
        out.append(SectionDoc(key, model, _about(model), fields=[_field_doc(key, n, i) for n, i in model.model_fields.items()]))
        for name, info in model.model_fields.items():
            if (sub := section_model(info.annotation)) is not None:
                walk(sub, f"{key}.{name}" if key else name)

    walk(root, "")
    return out


def all_keys(root: type[BaseModel]) -> list[str]:
    """Every dotted key an override can set, sections included (trainer.lora)."""
    keys = []
    for sec in sections(root):
        if sec.same_as is not None:
            keys += [sec.key + k.removeprefix(sec.same_as) for k in keys if k.startswith(sec.same_as + ".")]
        keys += [f.key for f in sec.fields]
    return keys


def _summary(model: type[BaseModel] | None) -> str:
    """A section's first sentence, for the row that names it in its parent's table."""
    about = _about(model) if model is not None else ""
    return about.split(". ")[0].rstrip(".") + "." if about else ""


def _about(model: type[BaseModel]) -> str:
    doc = model.__dict__.get("__doc__")
    return " ".join(inspect.cleandoc(doc).split()) if doc else ""


def _field_doc(section: str, name: str, info: FieldInfo) -> FieldDoc:
    key = f"{section}.{name}" if section else name
    sub = section_model(info.annotation)
    return FieldDoc(
        key=key,
        type="section" if sub is not None else type_name(info.annotation),
        default=_default(info),
        allowed=(*_choices(info.annotation), *_bounds(info)),
        description=" ".join((info.description or _summary(sub)).split()),
        section=sub is not None,
    )


def type_name(annotation: Any) -> str:
    """The type as a config's author thinks of it: int, float or null, list of str, mapping."""
    if annotation is type(None):
        return "null"
    if get_origin(annotation) is Literal:
        return " or ".join(dict.fromkeys(type_name(type(v)) for v in get_args(annotation)))
    if get_origin(annotation) in (Union, types.UnionType):
        return " or ".join(dict.fromkeys(type_name(a) for a in get_args(annotation)))
    if get_origin(annotation) is list:
        return f"list of {type_name(get_args(annotation)[0])}"
    if get_origin(annotation) is dict or annotation is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, Path):
        return "path"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _choices(annotation: Any) -> tuple[str, ...]:
    if get_origin(annotation) is Literal:
        return tuple(_yaml(v) for v in get_args(annotation))
    if get_origin(annotation) in (Union, types.UnionType, list):
        return tuple(c for a in get_args(annotation) for c in _choices(a))
    return ()


_BOUNDS = ((at.Ge, "ge", ">="), (at.Gt, "gt", ">"), (at.Le, "le", "<="), (at.Lt, "lt", "<"))


def _bounds(info: FieldInfo) -> tuple[str, ...]:
    out = []
    for item in info.metadata:
        for kind, attr, sign in _BOUNDS:
            if isinstance(item, kind):
                out.append(f"{sign} {_yaml(getattr(item, attr))}")
        if isinstance(item, at.MinLen):
            out.append(f"at least {item.min_length} item{'s' if item.min_length != 1 else ''}")
        if isinstance(item, at.MaxLen):
            out.append(f"at most {item.max_length} items")
    return tuple(out)


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return _yaml(info.default_factory())  # type: ignore[call-arg]
    if info.default is PydanticUndefined:
        return "required"
    return _yaml(info.default)


def _yaml(value: Any) -> str:
    """A value as a config file writes it."""
    if isinstance(value, BaseModel):
        return "(section)"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str):
        return value if value else '""'
    return json.dumps(value, default=str)
