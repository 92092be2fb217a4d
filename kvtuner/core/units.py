"""Byte units, parsing and formatting.

All sizes inside kvtuner are integers in bytes; names end in ``_bytes``.
Binary prefixes throughout (1 MiB = 2**20 bytes), as llama.cpp prints them.
"""

from __future__ import annotations

import re

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_FACTORS = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB}


def parse_size(text: str | int) -> int:
    """Parse a memory size such as ``"12G"``, ``"12GiB"``, ``"11.5 GB"``, ``"8192M"`` into bytes.

    Every prefix is binary (``12G`` == ``12GB`` == ``12GiB`` == 12 * 2**30 bytes): GPU
    vendors' "12 GB" cards hold 12 GiB. A bare number is bytes.

    Raises:
        ValueError: text is not a size; the message says what is expected.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must be positive, got {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"'{text}' is not a size: use a number with an optional unit, e.g. 12G, 12GiB or 8192M")
    value = float(m.group(1)) * _FACTORS[m.group(2).lower()]
    return int(round(value))


def mib(n_bytes: float) -> float:
    """Bytes to MiB (float)."""
    return n_bytes / MiB


def fmt_bytes(n_bytes: float | None, digits: int = 2) -> str:
    """Human-readable binary size: ``"12.75 MiB"``, ``"4.00 GiB"``; ``"-"`` for None."""
    if n_bytes is None:
        return "-"
    value = float(n_bytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit, factor in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value >= factor:
            return f"{sign}{value / factor:.{digits}f} {unit}"
    return f"{sign}{int(value)} B"


def pad_to(value: int, multiple: int) -> int:
    """Round ``value`` up to a multiple of ``multiple`` (ggml's ``GGML_PAD``)."""
    return ((value + multiple - 1) // multiple) * multiple
