"""The core's frozen values as JSON and back, by their type hints; pure.

A restarted agent takes over what the one before it knew (exporter.core.checkpoint); the values go
through JSON, never pickle, so that a file another process can write is data, not code. The codec
knows what the model is made of: dataclasses, enums, numbers, strings, None, tuples, frozensets and
mappings (as lists of pairs: their keys are enums and tuples as often as strings). A field the data
lacks takes its default, so that what an older llmstartup saved is read by a newer one.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from enum import Enum
from typing import Any

from exporter.core.model import frozen_map

Json = None | bool | int | float | str | list[Any] | dict[str, Any]


class DecodeError(ValueError):
    """The data is not a value of the type asked for."""


def encode(value: object) -> Json:
    if isinstance(value, Enum):
        return value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return [[encode(key), encode(item)] for key, item in value.items()]
    if isinstance(value, (tuple, list, frozenset, set)):
        return [encode(item) for item in value]
    raise TypeError(f"cannot encode a {type(value).__name__}")


def decode(kind: Any, data: Json) -> Any:
    """The value of type `kind` (a type hint) that `data` encodes; DecodeError when it does not."""
    try:
        return _decode(kind, data)
    except (TypeError, ValueError, KeyError, IndexError) as error:
        raise DecodeError(f"not a {getattr(kind, '__name__', kind)}: {error}") from None


def _decode(kind: Any, data: Json) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (types.UnionType, typing.Union):
        if data is None and type(None) in args:
            return None
        return _decode(next(a for a in args if a is not type(None)), data)
    if kind is Any:
        return data
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        if not isinstance(data, dict):
            raise TypeError("expected an object")
        hints = _hints(kind)
        return kind(**{f.name: _decode(hints[f.name], data[f.name]) for f in dataclasses.fields(kind)
                       if f.init and f.name in data})
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(data)
    if origin in (Mapping, dict, types.MappingProxyType) or kind in (Mapping, dict):
        key, item = args or (Any, Any)
        return frozen_map({_decode(key, k): _decode(item, v) for k, v in _pairs(data)})
    if origin is tuple:
        items = _items(data)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], x) for x in items)
        if len(args) != len(items):
            raise ValueError(f"expected {len(args)} items, got {len(items)}")
        return tuple(_decode(a, x) for a, x in zip(args, items))
    if origin in (frozenset, set):
        return frozenset(_decode(args[0], x) for x in _items(data))
    if kind is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise TypeError("expected a number")
        return float(data)
    if kind in (int, str, bool):
        if type(data) is not kind:
            raise TypeError(f"expected a {kind.__name__}")
        return data
    raise TypeError(f"cannot decode a {kind!r}")


def _items(data: Json) -> list[Any]:
    if not isinstance(data, list):
        raise TypeError("expected a list")
    return data


def _pairs(data: Json) -> list[Any]:
    items = _items(data)
    if not all(isinstance(pair, list) and len(pair) == 2 for pair in items):
        raise TypeError("expected [key, value] pairs")
    return items


@functools.cache
def _hints(kind: type) -> dict[str, Any]:
    return typing.get_type_hints(kind)
