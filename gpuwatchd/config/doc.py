"""The config reference (docs/configuration.md) generated from the config models, so it cannot drift.

Each key's meaning is the comment block right above its field in the source (the house style already puts the
reason for every default there), else the section's docstring. ``python -m gpuwatchd.config.doc --write``
regenerates the file; tests/test_config.py fails when it is out of date.
"""

from __future__ import annotations

import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any

import msgspec
from msgspec.structs import FieldInfo

from gpuwatchd.config.loader import Config
from gpuwatchd.config.types import DurationKey, SecretStr, Section, field_types, section_of

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
BEGIN = "<!-- BEGIN GENERATED: python -m gpuwatchd.config.doc --write -->"
END = "<!-- END GENERATED -->"


def _field_comments(cls: type[Section]) -> dict[str, str]:
    """Field name -> the ``#`` comment lines directly above its definition in the class body."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, Section)) or klass is Section:
            continue
        names = getattr(klass, "__struct_fields__", ())
        try:
            lines = inspect.getsource(klass).splitlines()
        except (OSError, TypeError):
            continue
        pending: list[str] = []
        for line in lines:
            stripped = line.strip()
            if stripped.startswith("#"):
                pending.append(stripped.lstrip("#").strip())
                continue
            m = re.match(r"^\s+(\w+)\s*:", line)
            if m and m.group(1) in names and pending:
                out[m.group(1)] = " ".join(pending)
            pending = []
    return out


def _is_duration(meta: Any) -> bool:
    # Positive durations (PositiveDuration) are listed as numbers, as the page always had them.
    return isinstance(meta, DurationKey) and not meta.positive


def _fmt_seconds(v: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if v >= size and v % size == 0:
            return f"{int(v // size)}{unit}"
    return f"{v * 1000:g}ms" if v < 1 else f"{v:g}s"


def _field_type(field: FieldInfo) -> str:
    return _type_name(field.type)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        base = args[0]
        return "duration" if any(_is_duration(a) for a in args[1:]) else _type_name(base)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        names = [_type_name(a) for a in args if a is not type(None)]
        opt = type(None) in args
        return " | ".join(names) + (" (optional)" if opt else "")
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (tuple, list):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if isinstance(tp, type):
        if tp is SecretStr:
            return "secret string"
        if issubclass(tp, Section):
            return "section"
        return {"float": "number", "int": "integer", "str": "string", "bool": "boolean", "Path": "path"}.get(
            tp.__name__, tp.__name__
        )
    return str(tp)


def _default(field: FieldInfo, path: str) -> str:
    if field.required:
        return "required"
    if path == "host":
        return "`$GPUWATCHD_HOST`, else this machine's hostname"
    value = field.default if field.default_factory is msgspec.NODEFAULT else field.default_factory()
    if isinstance(value, float) and _field_type(field) == "duration":
        return f"`{_fmt_seconds(value)}`"
    if isinstance(value, Section):
        return ""
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        if value and isinstance(value[0], Section):
            return f"{len(value)} built in"
        return "`[" + ", ".join(str(v) for v in value) + "]`" if value else "`[]`"
    if value == "":
        return '`""`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _section_model(tp: Any) -> tuple[type[Section] | None, bool]:
    """(model, is_list) when the field holds a section or a list of sections."""
    base, _, _ = field_types(tp)
    return section_of(base)


def _doc(cls: type[Section]) -> str:
    own = cls.__dict__.get("__doc__") or ""  # not inherited: Section's docstring says nothing about the section
    return " ".join(inspect.cleandoc(own).split("\n\n")[0].split())


def _rows(cls: type[Section], prefix: str, out: list[str], sections: list[tuple[str, type[Section]]]) -> None:
    comments = _field_comments(cls)
    for field in msgspec.structs.fields(cls):
        name = field.name
        path = f"{prefix}{field.encode_name}"
        model, is_list = _section_model(field.type)
        if model is not None:
            sections.append((f"{path}[]" if is_list else path, model))
            if not is_list:
                continue
        meaning = comments.get(name) or (_doc(model) if model is not None else "")
        meaning = meaning.replace("|", "\\|")
        out.append(f"| `{path}` | {_field_type(field)} | {_default(field, path)} | {meaning} |")


def render_reference() -> str:
    """The generated part of docs/configuration.md: one table per section, every key with type and default."""
    out: list[str] = []
    queue: list[tuple[str, type[Section]]] = [("", Config)]
    seen: set[str] = set()
    while queue:
        path, model = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        title = f"`{path}`" if path else "Top level"
        out += [f"### {title}", ""]
        doc = _doc(model)
        if doc:
            out += [doc, ""]
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        nested: list[tuple[str, type[Section]]] = []
        _rows(model, f"{path}." if path else "", out, nested)
        out.append("")
        queue[0:0] = nested
    return "\n".join(out).rstrip() + "\n"


def splice(document: str, generated: str) -> str:
    """Replace the generated block of ``document``."""
    head, sep, rest = document.partition(BEGIN)
    if not sep:
        raise ValueError(f"{DOC_PATH.name}: marker {BEGIN!r} not found")
    _, sep, tail = rest.partition(END)
    if not sep:
        raise ValueError(f"{DOC_PATH.name}: marker {END!r} not found")
    return f"{head}{BEGIN}\n\n{generated}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = splice(DOC_PATH.read_text(encoding="utf-8"), render_reference())
    if "--write" in argv:
        DOC_PATH.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(render_reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
