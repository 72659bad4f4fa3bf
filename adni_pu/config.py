"""Typed settings: dataclasses filled from TOML files and CLI overrides, saved with each run.

Every subsystem declares its settings as a (nested) dataclass. This module turns a
TOML file plus ``key.sub=value`` overrides into that dataclass, refusing unknown keys
and wrongly typed values with a message that names the file, the field, what was
expected and what was found, and writes the resolved settings back as TOML.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import tomllib

from adni_pu.errors import ConfigError
from adni_pu.fileio import atomic_write_text

T = TypeVar("T")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (and convert the few safe cases)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{where}: expected {_type_name(tp)}, found {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: expected one of {list(args)}, found {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table of settings, found {value!r}")
        return from_dict(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, found {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise ConfigError(f"{where}: expected {len(args)} values, found {len(value)}")
            return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, found {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true or false, found {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where}: expected an integer, found {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, found {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected text, found {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, (str, Path)):
            raise ConfigError(f"{where}: expected a path, found {value!r}")
        return Path(value)
    return value


_RANGE = "adni_pu.range"


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a numeric setting may take: a lower and an upper bound, each optional and
    each open (``>``, ``<``) or closed (``>=``, ``<=``)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if value != value:  # NaN lies in no range
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None
                    and (value >= self.high if self.high_open else value > self.high))

    def describe(self) -> str:
        """``> 0``, ``>= 1``, ``in [0, 1)``, ``<= 1``."""
        if self.low is not None and self.high is not None:
            return (f"in {'(' if self.low_open else '['}{self.low:g}, "
                    f"{self.high:g}{')' if self.high_open else ']'}")
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"{'<' if self.high_open else '<='} {self.high:g}"


def bounded(default: Any, *, gt: float | None = None, ge: float | None = None,
            lt: float | None = None, le: float | None = None) -> Any:
    """A dataclass field holding a number in a range (``gt``/``ge`` below, ``lt``/``le``
    above); :func:`from_dict` and :func:`check_ranges` refuse a value outside it with one
    line naming the setting, the range and the value (``None`` is left to the type)."""
    rng = Range(gt if gt is not None else ge, lt if lt is not None else le,
                gt is not None, lt is not None)
    return dataclasses.field(default=default, metadata={_RANGE: rng})


def range_problem(field: dataclasses.Field, value: Any, shown: Any = None) -> str | None:
    """Why ``value`` is outside ``field``'s range (``expected ..., found <shown>``, by
    default the value itself), or None."""
    rng = field.metadata.get(_RANGE)
    if rng is None or value is None or isinstance(value, bool) \
            or not isinstance(value, (int, float)) or value in rng:
        return None
    kind = "an integer" if field.type in (int, "int") else "a number"
    return f"expected {kind} {rng.describe()}, found {value if shown is None else shown!r}"


def check_ranges(obj: Any) -> None:
    """Refuse (``ConfigError``) the first field of settings ``obj`` outside its range; for
    ``__post_init__``, so settings made directly are held to the ranges too
    (``lr=-1: expected a number > 0, found -1``)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        problem = range_problem(f, value)
        if problem is not None:
            raise ConfigError(f"{f.name}={value!r}: {problem}")


def check_setting(cls: type, name: str, value: Any, where: str) -> Any:
    """``value`` checked against the type and range of ``cls``'s setting ``name`` (for a
    command-line option that replaces a setting, e.g. ``--bootstrap``); ``where`` names
    the option in the error."""
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    value = _coerce(value, typing.get_type_hints(cls)[name], where)
    problem = range_problem(field, value)
    if problem is not None:
        raise ConfigError(f"{where}: {problem}")
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass ``cls`` from a plain dict, refusing unknown keys, bad types and
    values outside a setting's range (:func:`bounded`)."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    names = set(fields)
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"{where}: unknown setting(s) {unknown}; expected some of {sorted(names)}"
        )
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    for k, v in kwargs.items():
        problem = range_problem(fields[k], v, data[k])
        if problem is not None:
            raise ConfigError(f"{where}.{k}: {problem}")
    try:
        obj = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    return obj


def to_dict(obj: Any) -> Any:
    """Plain-data view of a settings object (dataclasses, tuples and paths flattened)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b=value`` where value is read as TOML (falls back to a bare string)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. train.epochs=20")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.split("."), value


def merge(base: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``base[path[0]][path[1]]... = value`` in place, creating tables on the way."""
    node = base
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {'.'.join(path)}: {part} is not a table")
    node[path[-1]] = value


def load(
    cls: type[T],
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    defaults: dict[str, Any] | None = None,
    values: dict[str, Any] | None = None,
) -> T:
    """Load settings ``cls`` from an optional TOML file, then apply overrides.

    Precedence (lowest first): dataclass defaults, ``defaults``, the file, ``values`` (a
    nested dict of settings given as values by library code or CLI options: never turned
    into ``KEY=VALUE`` text), ``overrides`` (the user's ``--set`` strings).
    """
    data: dict[str, Any] = json.loads(json.dumps(defaults or {}))
    where = "config"
    if path is not None:
        path = Path(path)
        where = str(path)
        if not path.is_file():
            raise ConfigError(f"{path}: settings file not found")
        try:
            file_data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML ({exc})") from exc
        deep_update(data, file_data)
    deep_update(data, _plain(values or {}))
    base = copy.deepcopy(data)  # before the overrides, for the blame
    for text in overrides or []:
        keys, value = parse_override(text)
        merge(data, keys, value)
    try:
        return from_dict(cls, data, where)
    except ConfigError as exc:
        raise _blame_override(exc, where, overrides or [], cls, base) from exc


def _blame_override(exc: ConfigError, where: str, overrides: list[str], cls: type | None = None,
                    base: dict[str, Any] | None = None) -> ConfigError:
    """The error of a bad value, named by the ``--set`` that gave it (not the file).

    An error that names the overridden setting is the override's. Otherwise (a check of
    several settings together, e.g. ``prior`` in ``__post_init__``) the override found by
    :func:`_culprit` is blamed; when the settings fail without any override, the file is.
    """
    msg = str(exc)
    for text in reversed(overrides):
        keys = [k.strip() for k in text.split("=", 1)[0].strip().split(".")]
        head = ".".join([where, *keys])
        parent = ".".join([where, *keys[:-1]])
        if msg.startswith(head + ":"):
            return ConfigError(f"--set {text.strip()}: {msg[len(head) + 1:].strip()}")
        if msg.startswith(parent + ": unknown setting") and repr(keys[-1]) in msg:
            return ConfigError(f"--set {text.strip()}: {msg[len(parent) + 1:].strip()}")
    if cls is None or base is None or not overrides or _fails(cls, base, where):
        return exc
    culprit = _culprit(cls, base, where, overrides)
    if culprit is None:
        return exc
    rest = msg[len(where):].lstrip(".:").strip() if msg.startswith(where) else msg
    key = ".".join(parse_override(culprit)[0])
    if rest.startswith(key + ":"):  # "--set prior=1.5: prior: ..." says it twice
        rest = rest[len(key) + 1:].strip()
    return ConfigError(f"--set {culprit.strip()}: {rest}")


def _culprit(cls: type, base: dict[str, Any], where: str, overrides: list[str]) -> str | None:
    """The override to blame when settings ``base`` pass and fail with ``overrides``: the
    one whose removal alone makes them pass (overrides that only make sense together, such
    as the lists of one schedule, are not blamed for each other), else the first that makes
    them fail when added one at a time."""
    def with_overrides(texts: list[str]) -> dict[str, Any]:
        data = copy.deepcopy(base)
        for text in texts:
            keys, value = parse_override(text)
            merge(data, keys, value)
        return data

    for i in reversed(range(len(overrides))):
        if not _fails(cls, with_overrides(overrides[:i] + overrides[i + 1:]), where):
            return overrides[i]
    for i in range(len(overrides)):
        if _fails(cls, with_overrides(overrides[:i + 1]), where):
            return overrides[i]
    return None


def _fails(cls: type, data: dict[str, Any], where: str) -> bool:
    """Whether settings ``data`` are refused (for :func:`_blame_override`)."""
    try:
        from_dict(cls, copy.deepcopy(data), where)
    except ConfigError:
        return True
    return False


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``values`` with paths as text, as a TOML file would give them."""
    return {k: _plain(v) if isinstance(v, dict) else str(v) if isinstance(v, Path) else v
            for k, v in values.items()}


def preset_choice(path: str | Path | None, overrides: list[str] | None, preset: str | None,
                  default: str, values: dict[str, Any] | None = None) -> str:
    """Which preset a settings request names; the one rule for every settings type.

    In order of precedence: ``preset`` (a ``--preset`` option), the last ``preset=``
    override, ``values["preset"]``, the file's ``preset`` key, ``default``. A file that
    cannot be read is left to :func:`load`, which reports it.
    """
    if preset is not None:
        return preset
    name: Any = default
    if path is not None and Path(path).is_file():
        with contextlib.suppress(tomllib.TOMLDecodeError):
            name = tomllib.loads(Path(path).read_text()).get("preset", name)
    if values and "preset" in values:
        name = values["preset"]
    for text in overrides or []:
        keys, value = parse_override(text)
        if keys == ["preset"]:
            name = value
    return name


def preset_table(presets: dict[str, Any], name: Any) -> Any:
    """A copy of ``presets[name]``, or a :class:`ConfigError` naming the known presets."""
    if not isinstance(name, str) or name not in presets:
        raise ConfigError(f"preset {name!r}: expected one of {sorted(presets)}")
    return copy.deepcopy(presets[name])


def without_preset(overrides: list[str] | None) -> list[str]:
    """The overrides minus any ``preset=`` (when a ``--preset`` option decides it)."""
    return [o for o in overrides or [] if parse_override(o)[0] != ["preset"]]


def deep_update(base: dict[str, Any], new: dict[str, Any]) -> None:
    """Merge nested dict ``new`` into ``base`` in place (tables merged, values replaced)."""
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            deep_update(base[key], value)
        else:
            base[key] = value


def drop_added_later(settings: dict[str, Any], added_later: dict[tuple[str, str], Any]
                     ) -> None:
    """Remove from ``settings`` (a nested dict, in place) every ``(section, key)`` of
    ``added_later`` that holds the value it maps to: settings added after outputs or
    checkpoints existed, at the value that reproduces them, stay out of hashes and
    fingerprints, so what was made before still matches."""
    for (section, key), before in added_later.items():
        table = settings.get(section)
        if isinstance(table, dict) and key in table and table[key] == before:
            del table[key]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise ConfigError(f"cannot write {value!r} as TOML")


def dumps_toml(data: dict[str, Any], _prefix: str = "") -> str:
    """Serialise a nested dict of plain values to TOML (``None`` values are left out)."""
    lines: list[str] = []
    tables: list[tuple[str, dict[str, Any]]] = []
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    out = "\n".join(lines)
    for key, value in tables:
        name = f"{_prefix}{key}"
        body = dumps_toml(value, f"{name}.")
        out += ("\n\n" if out else "") + f"[{name}]\n" + body
    return out.strip() + "\n"




def save(obj: Any, path: str | Path) -> Path:
    """Write the resolved settings object as TOML (atomically)."""
    return atomic_write_text(path, dumps_toml(to_dict(obj)))
