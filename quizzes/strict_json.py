"""JSON parsed strictly: a duplicate key or NaN/Infinity is an error, not a silent choice (bank files, credentials)."""

from __future__ import annotations

import json
from typing import Any


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} in one JSON object")
        out[key] = value
    return out


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


def loads(text: str) -> Any:
    """json.loads, refusing duplicate keys and NaN/Infinity with a ValueError (json.JSONDecodeError is one too)."""
    return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
