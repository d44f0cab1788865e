"""Byte sizes: parsing ("16GiB"), formatting, and the alignment arithmetic of the CANN rules."""

from __future__ import annotations

import re

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

_UNITS = {
    "": 1, "b": 1,
    "k": KiB, "kib": KiB,
    "m": MiB, "mib": MiB,
    "g": GiB, "gib": GiB,
    "t": TiB, "tib": TiB,
}
# KB, MB, GB, TB mean powers of ten to some tools and of two to others: refused, with both
_AMBIGUOUS = {"kb": (KiB, 10**3), "mb": (MiB, 10**6), "gb": (GiB, 10**9), "tb": (TiB, 10**12)}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse "16GiB", "512 MiB", "4k" or a plain integer into bytes.

    One-letter units (k, m, g, t) are powers of two, as PyTorch's settings read them. KB, MB,
    GB and TB are refused: the same text means 10**9 or 2**30 bytes depending on the tool, so
    the error gives both and asks for GiB or bytes.
    """
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must be non-negative, got {text}")
        return text
    match = _SIZE_RE.match(str(text))
    if match and match.group(2).lower() in _AMBIGUOUS:
        number, unit = match.groups()
        binary, decimal = _AMBIGUOUS[unit.lower()]
        raise ValueError(f"{text!r} is ambiguous: {number}{unit[0].upper()}iB is "
                         f"{int(float(number) * binary):,} bytes, {number} x 10^"
                         f"{len(str(decimal)) - 1} is {int(float(number) * decimal):,}; write "
                         f"{number}{unit[0].upper()}iB, or the bytes")
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"cannot read {text!r} as a size; use a number with an optional unit "
            "B, KiB, MiB, GiB or TiB, e.g. '16GiB'"
        )
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def format_size(nbytes: int) -> str:
    """Human-readable size with binary units: 1536 -> '1.50 KiB'."""
    sign = "-" if nbytes < 0 else ""
    value = float(abs(nbytes))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if value < 1024:
            return f"{sign}{int(value)} B" if unit == "B" else f"{sign}{value:.2f} {unit}"
        value /= 1024
    return f"{sign}{value:.2f} EiB"


def align_up(length: int, k: int) -> int:
    """ALIGN_UP(len, k) = ((len - 1) // k + 1) * k, as written in the CANN documentation.

    ALIGN_UP(0, k) is 0.
    """
    return -(-length // k) * k


def carve_size(length: int) -> int:
    """Bytes a piece of `length` takes when carved from a big block: ALIGN_UP(len, 32) + 32."""
    return align_up(length, 32) + 32


def carve(lengths: list[int], start_align: int = 64) -> tuple[list[int], int]:
    """Lay pieces out in one block by the CANN carving rules (seed 003).

    Each piece takes m = ALIGN_UP(len, 32) + 32 bytes and starts on a `start_align` boundary
    (64; 128 for media memory). Returns the offsets of the pieces and the block size they need.
    """
    offsets, end = [], 0
    for length in lengths:
        if length <= 0:
            raise ValueError(f"piece lengths must be positive, got {length}")
        offset = align_up(end, start_align)
        offsets.append(offset)
        end = offset + carve_size(length)
    return offsets, end
