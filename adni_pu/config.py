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


def from_dict(cls: type[T], data: dict[str, Any], where: str = "config") -> T:
    """Build dataclass ``cls`` from a plain dict, refusing unknown keys and bad types."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(
            f"{where}: unknown setting(s) {unknown}; expected some of {sorted(names)}"
        )
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()}
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
    for text in overrides or []:
        keys, value = parse_override(text)
        merge(data, keys, value)
    try:
        return from_dict(cls, data, where)
    except ConfigError as exc:
        raise _blame_override(exc, where, overrides or []) from exc


def _blame_override(exc: ConfigError, where: str, overrides: list[str]) -> ConfigError:
    """The error of a bad value, named by the ``--set`` that gave it (not the file)."""
    msg = str(exc)
    for text in reversed(overrides):
        keys = [k.strip() for k in text.split("=", 1)[0].strip().split(".")]
        head = ".".join([where, *keys])
        parent = ".".join([where, *keys[:-1]])
        if msg.startswith(head + ":"):
            return ConfigError(f"--set {text.strip()}: {msg[len(head) + 1:].strip()}")
        if msg.startswith(parent + ": unknown setting") and repr(keys[-1]) in msg:
            return ConfigError(f"--set {text.strip()}: {msg[len(parent) + 1:].strip()}")
    return exc


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
