"""Building blocks of config sections, shared by every subsystem's own section."""

from __future__ import annotations

import copy
import math
import os
import re
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path, PurePath
from typing import Annotated, Any, ClassVar, TypeVar

import msgspec
import yaml

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}
# Longest duration any key takes: a year. Timers and deadlines are computed as now + duration, and asyncio refuses
# (OverflowError) or never wakes on astronomically large ones; nothing a host monitor waits for is longer.
MAX_DURATION = 366 * 86400.0
MIN_POSITIVE_DURATION = 0.001
_PATH_MAX = 4096  # Linux PATH_MAX and NAME_MAX
_NAME_MAX = 255


def parse_duration(value: Any) -> float:
    """``"90s"``, ``"5m"``, ``"1.5h"``, ``"250ms"`` or a number of seconds -> seconds (finite, 0 to a year)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 30s, 5m or 1h")
    seconds: float | None = None
    if isinstance(value, int | float):
        seconds = float(value) if not isinstance(value, int) or abs(value) < 1 << 64 else math.inf
    elif isinstance(value, str) and len(value) <= 64:
        m = _DURATION.match(value)
        if m:
            seconds = float(m.group(1)) * _UNIT[m.group(2)]
    if seconds is None:
        shown = repr(value) if len(repr(value)) <= 64 else repr(value)[:60] + "..."
        raise ValueError(f"expected a duration like 30s, 5m or 1h, got {shown}")
    if math.isnan(seconds):
        raise ValueError("expected a duration like 30s, 5m or 1h, got NaN")
    if seconds < 0:
        raise ValueError("duration must not be negative")
    if seconds > MAX_DURATION:
        raise ValueError("duration too long (at most 366d)")
    return seconds


def positive_duration(value: Any) -> float:
    """A duration that must be > 0 (a step, a window, an interval: zero divides by zero or spins), at least 1 ms."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError("must be greater than 0")
    if seconds < MIN_POSITIVE_DURATION:  # a timer period this short is a busy loop, not a schedule
        raise ValueError("must be at least 1ms")
    return seconds


def check_path(value: Any) -> Any:
    """A path key: no NUL byte (the OS cannot take it) and within the OS limits (4096 bytes, 255 per name)."""
    text = str(value) if isinstance(value, str | PurePath) else None
    if text is not None:
        if "\0" in text:
            raise ValueError("path contains a NUL byte")
        if len(os.fsencode(text)) > _PATH_MAX or any(len(os.fsencode(p)) > _NAME_MAX for p in text.split("/")):
            raise ValueError(f"path too long (at most {_PATH_MAX} bytes, {_NAME_MAX} per name)")
    return value


@dataclass(frozen=True, slots=True)
class DurationKey:
    """Marks a duration key in ``Annotated``: ``"90s"``, ``"5m"`` or a number of seconds, read by
    :func:`parse_duration` (``positive``: :func:`positive_duration`); bounds are ``msgspec.Meta`` beside it."""

    positive: bool = False


Duration = Annotated[float, DurationKey()]
PositiveDuration = Annotated[float, DurationKey(positive=True)]
# A path key. Every path value of every section is checked by check_path (the decoder's hook), whatever its name.
SafePath = Path


class SecretStr:
    """A secret string (webhook URLs, HMAC keys, tokens): ``repr``/``str`` never show it, as pydantic's ``SecretStr``
    did; ``get_secret_value()`` returns it."""

    __slots__ = ("_secret_value",)

    def __init__(self, secret_value: str) -> None:
        self._secret_value = secret_value

    def get_secret_value(self) -> str:
        return self._secret_value

    def _display(self) -> str:
        return "**********" if self._secret_value else ""

    def __str__(self) -> str:
        return self._display()

    def __repr__(self) -> str:
        return f"SecretStr({self._display()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretStr) and other._secret_value == self._secret_value

    def __hash__(self) -> int:
        return hash(self._secret_value)

    def __len__(self) -> int:
        return len(self._secret_value)


class FieldError(ValueError):
    """Raised by a section's checks across keys when the problem is one key's: reported at that key's path."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


Loc = tuple[int | str, ...]


def format_loc(loc: Loc) -> str:
    """``("notify", "receivers", 0, "url")`` -> ``notify.receivers[0].url``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


class ValidationError(ValueError):
    """Values a section cannot take: ``errors`` holds every ``(key path, message)``, ``problems`` the
    ``key.path: message`` lines."""

    def __init__(self, errors: list[tuple[Loc, str]]) -> None:
        self.errors = errors
        super().__init__("; ".join(self.problems))

    @property
    def problems(self) -> list[str]:
        return [f"{format_loc(loc)}: {msg}" for loc, msg in self.errors]


class Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True, dict=True):
    """Base of every config section: unknown keys are errors (typos must not pass silently), values frozen.

    No float key takes ``.inf`` or ``.nan``: every comparison with NaN is false, so a NaN threshold silently
    disables its rule, and an infinite one never fires or overflows timer arithmetic.

    Files are read by :func:`validate`, which reports every problem at once by key path; checks across keys go in
    :meth:`check` (run for every instance, however it is made), a key's own check in ``_check_<key>`` (a
    classmethod taking the value and the keys validated before it).
    """

    # Also take the attribute name (``for_``) where the key is an alias (``for``).
    populate_by_name: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            v = getattr(self, name)
            if isinstance(v, float) and not math.isfinite(v):
                raise FieldError(name, "Input should be a finite number")
        self.check()

    def check(self) -> None:
        """Checks across keys; raise ``ValueError`` (``FieldError`` for one key's problem)."""

    @classmethod
    def before(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The section's mapping before its keys are read (to check or fill keys that depend on each other)."""
        return data


S = TypeVar("S", bound=Section)


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is SecretStr:
        if isinstance(obj, SecretStr):
            return obj
        if isinstance(obj, str):
            return SecretStr(obj)
        raise ValueError("Input should be a valid string")
    if tp is Path:
        if isinstance(obj, str | PurePath):
            return Path(check_path(obj))
        raise ValueError("Input is not a valid path for <class 'pathlib.Path'>")
    raise NotImplementedError


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, SecretStr | PurePath):
        return str(obj)
    return None  # a value's private attribute (a matcher's compiled regex), dropped by _public


def _public(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _public(v) for k, v in data.items() if not (isinstance(k, str) and k.startswith("_"))}
    if isinstance(data, list | tuple):
        return [_public(v) for v in data]
    return data


@dataclass(frozen=True)
class _Field:
    name: str
    key: str
    type: Any
    base: Any
    metas: tuple[Any, ...]
    optional: bool
    required: bool
    section: type[Section] | None  # a section, or the item of a list of sections
    is_list: bool
    duration: DurationKey | None
    default: Any
    default_factory: Any


def field_types(tp: Any) -> tuple[Any, tuple[Any, ...], bool]:
    """``Annotated[X, m...] | None`` -> (X, (m...), optional)."""
    optional = False
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            optional = len(rest) < len(args)
            tp = rest[0]
    metas: tuple[Any, ...] = ()
    if typing.get_origin(tp) is Annotated:
        tp, *extra = typing.get_args(tp)
        metas = tuple(extra)
    return tp, metas, optional


def section_of(tp: Any) -> tuple[type[Section] | None, bool]:
    """(section, is_list) when ``tp`` (bare) is a section or a tuple of sections."""
    if isinstance(tp, type) and issubclass(tp, Section):
        return tp, False
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (tuple, list) and args and isinstance(args[0], type) and issubclass(args[0], Section):
        return args[0], True
    return None, False


@cache
def _plan(cls: type[Section]) -> tuple[_Field, ...]:
    out = []
    for f in msgspec.structs.fields(cls):
        base, metas, optional = field_types(f.type)
        section, is_list = section_of(base)
        duration = next((m for m in metas if isinstance(m, DurationKey)), None)
        required = f.default is msgspec.NODEFAULT and f.default_factory is msgspec.NODEFAULT
        out.append(_Field(f.name, f.encode_name, f.type, base, metas, optional, required, section, is_list, duration,
                          f.default, f.default_factory))
    return tuple(out)


def validate(cls: type[S], data: Any) -> S:
    """``data`` (a parsed YAML mapping) as ``cls``; every problem at once in one :class:`ValidationError`."""
    errors: list[tuple[Loc, str]] = []
    out = _section(cls, data, (), errors)
    if out is None or errors:
        raise ValidationError(errors)
    return out


def _section(cls: type[S], data: Any, loc: Loc, errors: list[tuple[Loc, str]]) -> S | None:
    n = len(errors)
    if isinstance(data, dict):
        try:
            data = cls.before(data)
        except FieldError as e:
            errors.append(((*loc, e.field), e.message))
            return None
        except ValueError as e:
            errors.append((loc, str(e)))
            return None
    if not isinstance(data, dict):
        errors.append((loc, f"Input should be a valid dictionary or instance of {cls.__name__}"))
        return None
    plan = _plan(cls)
    known = {f.key for f in plan} | ({f.name for f in plan} if cls.populate_by_name else set())
    values: dict[str, Any] = {}
    given: set[str] = set()
    for f in plan:
        if f.key in data:
            raw = data[f.key]
        elif cls.populate_by_name and f.name in data:
            raw = data[f.name]
        else:
            if f.required:
                errors.append(((*loc, f.key), "Field required"))
            elif f.default is not msgspec.NODEFAULT:
                values[f.name] = f.default  # a key's check sees the keys before it, given or default
            else:
                values[f.name] = f.default_factory()
            continue
        given.add(f.name)
        where = (*loc, f.key)
        ok, value = _value(f, raw, where, errors)
        if not ok:
            continue
        check = getattr(cls, f"_check_{f.name}", None)
        if check is not None:
            try:
                value = check(value, values)
            except ValueError as e:
                errors.append((where, str(e)))
                continue
        values[f.name] = value
    errors.extend(((*loc, k), "Extra inputs are not permitted" if isinstance(k, str) else "Keys should be strings")
                  for k in data if k not in known)
    if len(errors) > n:
        return None
    try:
        obj = cls(**values)
    except FieldError as e:
        key = next((f.key for f in plan if f.name == e.field), e.field)
        errors.append(((*loc, key), e.message))
        return None
    except ValueError as e:
        errors.append((loc, str(e)))
        return None
    msgspec.structs.force_setattr(obj, "_fields_set", frozenset(given))
    return obj


_BOOL = {"true": True, "false": False, "yes": True, "no": False, "on": True, "off": False, "y": True, "n": False,
         "t": True, "f": False, "1": True, "0": False}


def _value(f: _Field, raw: Any, loc: Loc, errors: list[tuple[Loc, str]]) -> tuple[bool, Any]:
    if raw is None and f.optional:
        return True, None
    if f.section is not None:
        if not f.is_list:
            one = _section(f.section, raw, loc, errors)
            return one is not None, one
        if not isinstance(raw, list | tuple):
            errors.append((loc, "Input should be a valid tuple"))
            return False, None
        items = [_section(f.section, x, (*loc, i), errors) for i, x in enumerate(raw)]
        return all(x is not None for x in items), tuple(items)
    try:
        if f.duration is not None:
            seconds = positive_duration(raw) if f.duration.positive else parse_duration(raw)
            _bounds(seconds, f.metas)
            return True, seconds
        if f.base in (int, float) and _not_finite(raw, f.base):
            raise ValueError("Input should be a finite number")
        if f.base is bool and isinstance(raw, str) and raw.lower() in _BOOL:
            raw = _BOOL[raw.lower()]
        if f.base in (int, float) and isinstance(raw, bool):
            raw = f.base(raw)
        if f.base is int and isinstance(raw, float) and raw.is_integer() and abs(raw) >= 2**63:
            raise ValueError("Unable to parse input string as an integer, exceeded maximum size")
        return True, msgspec.convert(raw, f.type, strict=False, dec_hook=_dec_hook)
    except ValueError as e:  # msgspec.ValidationError is one
        sub, msg = _split(str(e)) if isinstance(e, msgspec.ValidationError) else ((), str(e))
        errors.append(((*loc, *sub), _message(msg, f, raw)))
        return False, None


def _not_finite(raw: Any, base: Any) -> bool:
    if isinstance(raw, float):
        return not math.isfinite(raw)
    if base is float and isinstance(raw, str) and len(raw) < 32:
        try:
            return not math.isfinite(float(raw))
        except ValueError:
            return False
    return False


_OPS = {">=": "greater than or equal to", ">": "greater than", "<=": "less than or equal to", "<": "less than"}


def _bounds(v: float, metas: tuple[Any, ...]) -> None:
    for m in metas:
        if not isinstance(m, msgspec.Meta):
            continue
        for op, bound in ((">=", m.ge), (">", m.gt), ("<=", m.le), ("<", m.lt)):
            if bound is None:
                continue
            if not (v >= bound if op == ">=" else v > bound if op == ">" else v <= bound if op == "<=" else v < bound):
                raise ValueError(f"Input should be {_OPS[op]} {_number(bound)}")


def _number(v: float | str) -> str:
    f = float(v)
    return str(int(f)) if f.is_integer() and abs(f) < 1e16 else repr(f) if isinstance(v, float) else str(v)


_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\.\.\.\]")
_EXPECTED = re.compile(r"Expected `(\w+)[^`]*`, got `(\w+)`")
_BOUND = re.compile(r"Expected `(?:int|float)[^`]*` (>=|>|<=|<) (\S+)")
_LENGTH = re.compile(r"Expected `str[^`]*` of length (>=|<=) (\d+)")
_PATTERN = re.compile(r"Expected `str[^`]*` matching regex (.*)")
_KIND = {"int": "a valid integer", "float": "a valid number", "bool": "a valid boolean", "str": "a valid string",
         "array": "a valid tuple", "object": "a valid dictionary"}
_UNPARSED = {"int": ", unable to parse string as an integer", "float": ", unable to parse string as a number",
             "bool": ", unable to interpret input"}


def _split(text: str) -> tuple[Loc, str]:
    """msgspec's ``message - at `$.a[0]``` -> (("a", 0), message)."""
    msg, sep, where = text.rpartition(" - at `")
    if not sep:
        return (), text
    parts: list[int | str] = []
    for m in _PATH_PART.finditer(where.rstrip("`").removeprefix("$")):
        if m.group(1) is not None:
            parts.append(m.group(1))
        elif m.group(2) is not None:
            parts.append(int(m.group(2)))
    return tuple(parts), msg


def _message(msg: str, f: _Field, raw: Any) -> str:
    """msgspec's wording of a type or bound error -> the wording the config's messages have always had."""
    base = f.base
    if m := _BOUND.fullmatch(msg):
        try:  # the bound as written (msgspec reports an int's `gt=0` as `>= 1`)
            _bounds(msgspec.convert(raw, base, strict=False), f.metas)
        except (ValueError, TypeError) as e:
            if str(e).startswith("Input should be"):
                return str(e)
        return f"Input should be {_OPS[m.group(1)]} {_number(m.group(2))}"
    if m := _LENGTH.fullmatch(msg):
        n = int(m.group(2))
        return f"String should have {'at least' if m.group(1) == '>=' else 'at most'} {n} character{'s' * (n != 1)}"
    if m := _PATTERN.fullmatch(msg):
        pattern = next((x.pattern for x in f.metas if isinstance(x, msgspec.Meta) and x.pattern), None)
        return f"String should match pattern '{pattern}'" if pattern else f"String should match pattern {m.group(1)}"
    if msg.startswith("Invalid enum value") and typing.get_origin(base) is typing.Literal:
        choices = [repr(a) for a in typing.get_args(base)]
        shown = choices[0] if len(choices) == 1 else f"{', '.join(choices[:-1])} or {choices[-1]}"
        return f"Input should be {shown}"
    if m := _EXPECTED.fullmatch(msg):
        want, got = m.group(1), m.group(2)
        if want in _KIND:
            extra = _UNPARSED.get(want, "") if got == "str" or (want == "bool" and got in ("int", "float")) else ""
            if want == "int" and got == "float":
                extra = ", got a number with a fractional part"
            return f"Input should be {_KIND[want]}{extra}"
    return msg


def fields_set(section: Section) -> frozenset[str]:
    """The keys the file (or the caller) gave this section, as opposed to those left at their defaults."""
    recorded: frozenset[str] | None = getattr(section, "_fields_set", None)
    if recorded is not None:
        return recorded
    out = set()
    for f in msgspec.structs.fields(section):
        default = f.default_factory() if f.default is msgspec.NODEFAULT and f.default_factory is not msgspec.NODEFAULT \
            else f.default
        if getattr(section, f.name) != default:
            out.add(f.name)
    return frozenset(out)


def replace(section: S, **changes: Any) -> S:
    """A copy of ``section`` with ``changes`` (attribute names), the changed keys counted as given; like pydantic's
    ``model_copy(update=...)``, which it replaces, the values are the caller's and not checked again."""
    unknown = changes.keys() - set(section.__struct_fields__)
    if unknown:
        raise TypeError(f"{type(section).__name__} has no key {sorted(unknown)[0]!r}")
    out = copy.copy(section)
    for name, value in changes.items():
        msgspec.structs.force_setattr(out, name, value)
    msgspec.structs.force_setattr(out, "_fields_set", fields_set(section) | changes.keys())
    return out


def dump(section: Section) -> dict[str, Any]:
    """Plain data by key (aliases as in the file), secrets masked: what a config dump may show."""
    out: dict[str, Any] = _public(msgspec.to_builtins(section, enc_hook=_enc_hook))
    return out

def yaml_error_message(e: yaml.YAMLError) -> str:
    """``line 3, column 7: invalid YAML: <problem>`` for a parse error (config files and scenario files), one line."""
    if isinstance(e, yaml.reader.ReaderError):  # a character YAML does not allow (NUL, other control characters)
        code = ord(e.character) if isinstance(e.character, str) else int(e.character)
        return f"character {e.position + 1}: invalid YAML: unacceptable character #x{code:04x}"
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    problem = " ".join(str(getattr(e, "problem", None) or e).split())
    return f"{where}invalid YAML: {problem}"


# A file with thousands of wrong keys gets the first ten and a count, not thousands of lines.
MAX_PROBLEMS_SHOWN = 10


def problem_lines(source: str, problems: list[str]) -> str:
    """``source: problem`` per line, at most ``MAX_PROBLEMS_SHOWN`` of them and then how many more there are."""
    shown = [f"{source}: {p}" for p in problems[:MAX_PROBLEMS_SHOWN]]
    if len(problems) > MAX_PROBLEMS_SHOWN:
        shown.append(f"{source}: ... and {len(problems) - MAX_PROBLEMS_SHOWN} more problems")
    return "\n".join(shown)
