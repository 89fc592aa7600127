"""Byte sizes: the allocator's constants, PyTorch's size formatting, and parsing of "8GiB"-style strings.

The constants are those of c10/cuda/CUDACachingAllocator.cpp (kMinBlockSize, kSmallSize, ...), so a reader can
hold this file beside PyTorch's and check every number.
"""

from __future__ import annotations

import re

from .lang import messages, say

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: every request is rounded up to a multiple of this
K_SMALL_SIZE = 1 * MiB  # kSmallSize: rounded sizes up to this go to the small pool
K_SMALL_BUFFER = 2 * MiB  # kSmallBuffer: segment size for small-pool requests
K_MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: large requests under this share a 20 MiB segment
K_LARGE_BUFFER = 20 * MiB  # kLargeBuffer: segment for large requests under 10 MiB (large_segment_size_mb's default)
K_ROUND_LARGE = 2 * MiB  # kRoundLarge: larger requests get a segment rounded up to this
PAGE_SIZE = 2 * MiB  # the driver hands out physical memory in 2 MiB pages

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1024 * GiB,
}
# the one word of a size that is not an international unit (KiB, MiB, GiB are): minialloc's figures say it in the
# notebook's language; PyTorch's own messages keep pytorch_format_size's English
TEXT = messages("minialloc.sizes.TEXT", {
    "bytes": "{n} bytes",
    "unit_bytes": "bytes",  # an axis's unit, when the sizes are under 4 KiB
    "decimal_hint": "(decimal; did you mean {binary}?)",
})
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def pytorch_format_size(n: int) -> str:
    """Format a byte count the way PyTorch's OOM message does (format_size in CUDACachingAllocator.cpp), in
    PyTorch's English whatever the notebook's language: the OOM message must match PyTorch's byte for byte.

    Up to 1024 -> "N bytes"; up to 1 MiB -> "x.xx KiB"; up to 1 GiB -> "x.xx MiB"; else "x.xx GiB".
    The bounds are inclusive, so exactly 1 MiB prints "1024.00 KiB", as PyTorch prints it.
    """
    if n <= 1024:
        return f"{n} bytes"
    if n <= MiB:
        return f"{n / KiB:.2f} KiB"
    if n <= GiB:
        return f"{n / MiB:.2f} MiB"
    return f"{n / GiB:.2f} GiB"


def format_size(n: int) -> str:
    """pytorch_format_size's figures for a person to read: the same units and bounds, and "N bytes" in the
    notebook's language (minialloc.lang)."""
    return say(TEXT, "bytes", n=n) if n <= 1024 else pytorch_format_size(n)


def parse_size(value: int | str) -> int:
    """Turn 8589934592, "8GiB", "80GB" or "512 MiB" into a number of bytes.

    Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal ones (KB, MB, GB, TB) powers of 1000, as on a
    GPU's data sheet ("80GB"). A bad value raises ValueError naming the value and the accepted forms.
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"size must be an int or a string like '8GiB', got {type(value).__name__} {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must be >= 0, got {value}")
        return value
    m = _SIZE_RE.match(value)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(
            f"cannot read size {value!r}: use a number of bytes or a number with a unit "
            "(B, KiB, MiB, GiB, TiB, or KB, MB, GB, TB), e.g. '8GiB' or '80GB'"
        )
    number, scale = float(m.group(1)), _UNITS[unit]
    if scale == 1 and number != int(number):
        raise ValueError(f"size {value!r} is not a whole number of bytes")
    return int(number * scale)  # "3.2GiB" is fine: rounded down to whole bytes


def readable_size(n: int) -> str:
    """minialloc's own figures: like format_size, but a size of exactly 1 MiB or 1 GiB moves up a unit
    ("1.00 GiB", not PyTorch's "1024.00 MiB"). PyTorch's message keeps format_size, to match it character for
    character."""
    if n < 1024:
        return say(TEXT, "bytes", n=n)
    if n < MiB:
        return f"{n / KiB:.2f} KiB"
    if n < GiB:
        return f"{n / MiB:.2f} MiB"
    return f"{n / GiB:.2f} GiB"


def decimal_size_hint(text: str) -> str:
    """For a size typed in decimal units ("80GB"), a note saying so and naming the binary spelling a GPU's
    capacity usually means ("80GiB"); "" for anything else."""
    m = _SIZE_RE.match(text) if isinstance(text, str) else None
    if m is None or m.group(2).lower() not in ("kb", "mb", "gb", "tb", "k", "m", "g", "t"):
        return ""
    binary = m.group(2)[0].upper() + "iB"
    return say(TEXT, "decimal_hint", binary=f"{m.group(1)}{binary}")
