"""Sizes given on the command line (--memory, --size, ...), read the same way by every verb."""

from __future__ import annotations

import re

import click

from .units import MiB, parse_size


def size_option(value: str, option: str) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def device_memory(value: str | None) -> int | None:
    """--memory: a device's size in bytes (None when not given). A bare number is bytes when it
    could be a device's bytes (1 MiB or more: 11198791680, as torch.cuda.mem_get_info gives
    it); a smaller one is refused with the unit it most likely lacks ('40' is 40 GiB far more
    often than 40 bytes)."""
    if value is None:
        return None
    text = value.strip()
    if _BARE.fullmatch(text) and 0 < float(text) < MiB:
        raise click.BadParameter(f"{text} bytes is too small for a device (a number without a "
                                 f"unit is bytes from 1 MiB, {MiB:,}, up); did you mean "
                                 f"{_likely_unit(text)}?", param_hint="--memory")
    size = size_option(value, "--memory")
    if size <= 0:
        raise click.BadParameter(f"{value}: a device holds some memory; give a size such as "
                                 "16GiB", param_hint="--memory")
    return size


_BARE = re.compile(r"\d+(?:\.\d+)?")


def _likely_unit(number: str) -> str:
    """The size a small bare number most likely means: GiB up to 1024 (a device of up to a
    TiB), MiB above (16384 is 16 GiB written in MiB)."""
    return f"{number}GiB" if float(number) <= 1024 else f"{number}MiB"
