"""The engine of the pipeline YAML schema: frozen dataclasses with strict validation, errors
that name the dotted key, value rules, dotted overrides and a strict YAML loader.

A section is a frozen dataclass subclass of :class:`Section` whose fields, types and defaults
*are* its schema (the sections of a pipeline file are in :mod:`kahm_dask.pipeline.config.sections`).
Validation is strict and happens on every construction (also when the dataclasses are built
directly in Python):

* unknown keys are rejected, naming the full dotted key and the valid keys (with a "did you
  mean");
* types are exact: booleans must be booleans, integers must not be booleans, floats accept
  integers; a wrong type is named with the expected type;
* invalid values are named with the allowed range (:func:`bound`, :func:`rule`, which reads a
  parameter's rule from :mod:`kahm_dask.params`, and the checks of memory sizes, scheduler and
  dashboard addresses).

YAML is read with PyYAML's safe loader, changed in two ways: numbers follow YAML 1.2, so
``1e-5`` is a float (YAML 1.1 reads it as a string) and ``1:30`` is a string (not the
sexagesimal integer 90); and duplicate keys are an error instead of "last one wins".
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
import types
import typing
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from dask.utils import parse_bytes

from kahm_dask.params import PARAMS, Range

__all__ = [
    "ConfigError",
    "Section",
    "invalid_value",
    "bound",
    "rule",
    "param",
    "within",
    "set_dotted",
    "load_yaml",
    "MEMORY",
    "ADDRESS",
    "DASHBOARD",
    "DASHBOARD_RULE",
    "dashboard_is_local",
]

class ConfigError(ValueError):
    """An invalid configuration value or key; the message names the dotted key.

    ``key`` is the dotted key at fault (or None), ``origin`` the file or source it came from.
    The message is ``<subject> in <origin><detail>``, e.g. ``unknown key
    'model.n_componets' in pipelines/x.yaml; valid keys: n_components, ...``.
    """

    def __init__(
        self, subject: str, detail: str = "", *, key: str | None = None, origin: str | None = None
    ) -> None:
        self.subject, self.detail, self.key, self.origin = subject, detail, key, origin
        where = f" in {origin}" if origin else ""
        super().__init__(f"{subject}{where}{detail}")

    def located(self, origin: str) -> ConfigError:
        """This error with ``origin`` filled in (unchanged if it already has one)."""
        if self.origin is not None:
            return self
        return ConfigError(self.subject, self.detail, key=self.key, origin=origin)


# --------------------------------------------------------------------------- errors


def invalid_value(key: str, reason: str, value: Any) -> ConfigError:
    """``invalid value for '<key>': <reason>, got <value>``."""
    return ConfigError(f"invalid value for '{key}'", f": {reason}, got {value!r}", key=key)


def _wrong_type(key: str, expected: str, value: Any) -> ConfigError:
    got = "null" if value is None else f"{type(value).__name__} {value!r}"
    return ConfigError(f"wrong type for '{key}'", f": expected {expected}, got {got}", key=key)


def _unknown_key(key: str, name: Any, valid: list[str]) -> ConfigError:
    close = difflib.get_close_matches(str(name), valid, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ConfigError(f"unknown key '{key}'", f"{hint}; valid keys: {', '.join(valid)}", key=key)


def _join_key(prefix: str, name: Any) -> str:
    """Dotted key of ``name`` inside the section ``prefix`` ("" = top level)."""
    return f"{prefix}.{name}" if prefix else str(name)


# --------------------------------------------------------------------------- type checks


class _Mismatch(Exception):
    """Internal: a value does not have the type of one hint (the caller names the key)."""


def _members(hint: Any) -> tuple[Any, ...]:
    """The members of a union hint, or ``(hint,)``."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return typing.get_args(hint)
    return (hint,)


def _type_name(hint: Any) -> str:
    """Readable name of a type hint for error messages."""
    if len(_members(hint)) > 1:
        return " or ".join(_type_name(a) for a in _members(hint))
    origin = typing.get_origin(hint)
    if hint is list:
        return "a list"
    names = {
        type(None): "null",
        bool: "bool (true or false)",
        Path: "a path (non-empty str)",
        list: "a list of strings",
        dict: "a mapping with string keys",
    }
    if origin is Literal:
        return "one of " + ", ".join(map(repr, typing.get_args(hint)))
    if isinstance(hint, type) and issubclass(hint, Section):
        return "a mapping"
    return names.get(origin or hint, getattr(hint, "__name__", str(hint)))


def _check_scalar(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against a non-union hint and return it normalized.

    Raises ``_Mismatch`` for a wrong type and ConfigError for a wrong value.
    """
    origin = typing.get_origin(hint)
    if origin is Literal:
        if not isinstance(value, str):
            raise _Mismatch
        if value not in typing.get_args(hint):
            raise invalid_value(key, f"expected {_type_name(hint)}", value)
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise _Mismatch
        return list(value)
    if origin is dict:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
            raise _Mismatch
        return dict(value)
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise _Mismatch
        if not math.isfinite(value):
            raise invalid_value(key, "must be a finite number", value)
        return float(value)
    if hint is int and isinstance(value, bool):
        raise _Mismatch
    if hint is Path:
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            raise _Mismatch
        return Path(os.path.abspath(os.path.expanduser(value)))
    if not isinstance(value, hint):  # bool, int, str, or a nested section
        raise _Mismatch
    return value


def _check_value(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against the type hint ``hint`` and return it normalized.

    Union members are tried in order, so ``int | float`` keeps ints as ints.
    """
    for member in _members(hint):
        if member is type(None):
            if value is None:
                return None
            continue
        try:
            return _check_scalar(value, member, key)
        except _Mismatch:
            continue
    raise _wrong_type(key, _type_name(hint), value)


# --------------------------------------------------------------------------- value checks


def within(values: Range) -> dict:
    """Field metadata: a non-null value must lie in ``values``."""
    reason = f"must be {values.bounds_text()}"

    def check(value: Any, key: str) -> None:
        if value not in values:
            raise invalid_value(key, reason, value)

    return {"check": check}


def bound(*, gt: float | None = None, ge: float | None = None, lt: float | None = None) -> dict:
    """Field metadata: a non-null value must be ``> gt`` (or ``>= ge``) and ``< lt`` (if given)."""
    return within(Range(Real, gt if ge is None else ge, lt, closed="neither" if ge is None else "left"))


def param(name: str) -> Any:
    """The dataclass field of the parameter ``name`` of :data:`kahm_dask.params.PARAMS`: its default
    and its rule from the table, and its name, so that the section maps onto the estimators'
    parameters (:func:`kahm_dask.pipeline.config.sections.estimator_params`)."""
    checks = rule(name) if PARAMS[name].range is not None else {}  # choices: the field's Literal type checks them
    return dataclasses.field(default=PARAMS[name].default, metadata={**checks, "param": name})


def rule(name: str) -> dict:
    """Field metadata: the range of the model/privacy parameter ``name`` (kahm_dask/params.py)."""
    return within(PARAMS[name].range)


def _check_memory(value: str, key: str) -> None:
    if value == "auto":
        return
    try:
        parse_bytes(value)
    except (ValueError, TypeError):
        reason = "expected 'auto' or a size such as '2GiB' or '500MB'"
        raise invalid_value(key, reason, value) from None


def _check_address(value: str, key: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*://\S+", value):
        raise invalid_value(
            key, "expected a scheduler address with protocol, such as 'tcp://127.0.0.1:8786'", value
        )


MEMORY = {"check": _check_memory}
ADDRESS = {"check": _check_address}

#: The dashboard of a local cluster: this machine's loopback interface only.
DASHBOARD = "127.0.0.1:8787"
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


def dashboard_is_local(address: str) -> bool:
    """Whether a dashboard address ``host:port`` listens on the loopback interface only (an
    empty host, as in ``:8787``, means every interface)."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host in _LOOPBACK


def _check_dashboard(value: str, key: str) -> None:
    if not re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]*):\d{1,5}", value):
        raise invalid_value(key, "expected host:port, such as '127.0.0.1:8787' (null: no dashboard)", value)


DASHBOARD_RULE = {"check": _check_dashboard}


# --------------------------------------------------------------------------- sections


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@dataclass(frozen=True, kw_only=True)
class Section:
    """Base of every schema dataclass: validates and normalizes its fields on construction.

    Subclasses set ``_key``, the dotted prefix of their keys ("" at the top level), declare
    fields with type hints (the expected types), put value checks in the field metadata
    (``bound``, ``MEMORY``, ``ADDRESS``) and cross-field checks in ``_validate``. The
    cluster config schema (``cluster.py``) is built from the same pieces.
    """

    _key: ClassVar[str] = ""

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for f in dataclasses.fields(self):
            key = _join_key(self._key, f.name)
            value = _check_value(getattr(self, f.name), hints[f.name], key)
            if value is not None and "check" in f.metadata:
                f.metadata["check"](value, key)
            object.__setattr__(self, f.name, value)
        self._validate()

    def _validate(self) -> None:
        """Cross-field checks and normalization after the field checks; none by default."""

    @classmethod
    def from_mapping(cls, raw: Any) -> typing.Self:
        """Build the section from a parsed YAML mapping (None = all defaults)."""
        raw = {} if raw is None else raw
        if not isinstance(raw, Mapping):
            if not cls._key:
                raise ConfigError("wrong top-level type", f": expected a mapping, got {raw!r}")
            raise _wrong_type(cls._key, "a mapping", raw)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name in raw:
            if name not in fields:
                raise _unknown_key(_join_key(cls._key, name), name, list(fields))
        for f in fields.values():
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if required and f.name not in raw:
                key = _join_key(cls._key, f.name)
                raise ConfigError(f"missing required key '{key}'", "; it has no default", key=key)
        kwargs = {name: _nested(_hints(cls)[name], value) for name, value in raw.items()}
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The section as plain JSON-able data (paths as str); ``from_mapping`` inverts it."""
        return _plain(dataclasses.asdict(self))


def _nested(hint: Any, value: Any) -> Any:
    """Parse ``value`` as a nested section if ``hint`` is one (or an optional one)."""
    members = _members(hint)
    sections = [m for m in members if isinstance(m, type) and issubclass(m, Section)]
    if not sections or (value is None and type(None) in members):
        return value
    return sections[0].from_mapping(value)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value



def set_dotted(d: dict[str, Any], key: str, value: Any) -> None:
    """Set ``d[a][b][c] = value`` for ``key = "a.b.c"``, creating missing sections."""
    *parents, last = key.split(".")
    node = d
    for depth, name in enumerate(parents):
        child = node.get(name)
        if child is None:
            child = node[name] = {}
        if not isinstance(child, dict):
            section = ".".join(parents[: depth + 1])
            raise ConfigError(
                f"cannot override '{key}'", f": '{section}' is a value, not a section",
                key=key, origin="the overrides",
            )
        node = child
    node[last] = value


# --------------------------------------------------------------------------- YAML


class _StrictLoader(yaml.SafeLoader):
    """Safe loader with YAML 1.2 numbers and an error on duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"found duplicate key {key!r}", key_node.start_mark,
                )
            if isinstance(key, Hashable):
                seen.add(key)
        return super().construct_mapping(node, deep)


_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    _INT,
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_StrictLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def load_yaml(path: str | os.PathLike[str]) -> Any:
    """Parse a YAML file with the strict loader; syntax errors become ConfigError."""
    with open(path, encoding="utf-8") as fh:
        try:
            return yaml.load(fh, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            raise ConfigError(f"cannot parse {os.fspath(path)}", f": {exc}") from None


