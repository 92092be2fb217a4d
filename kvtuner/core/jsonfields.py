"""Typed reads of fields from JSON documents (profiles, the library), one line per mistake."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def typed_field(data: Mapping[str, Any], key: str, typ: type, *default: Any) -> Any:
    """``data[key]`` checked against ``typ`` (bool is not an int here); ``default`` if absent."""
    if key not in data:
        if default:
            return default[0]
        raise KeyError(key)
    value = data[key]
    if value is None and default and default[0] is None:
        return None
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{key} must be a whole number, not {value!r:.40}")
    if typ is str and not isinstance(value, str):
        raise ValueError(f"{key} must be text, not {value!r:.40}")
    return value


def require_object(data: Any, what: str) -> Mapping[str, Any]:
    """``data`` when it is a JSON object (a mapping).

    Raises:
        ValueError: ``'<what>' must be an object``.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"'{what}' must be an object")
    return data
