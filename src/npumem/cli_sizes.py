"""Sizes given on the command line (--memory, --size, ...), read the same way by every verb."""

from __future__ import annotations

import click

from .units import parse_size


def size_option(value: str, option: str) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None


def device_memory(value: str | None) -> int | None:
    """--memory: a device's size in bytes (None when not given). A bare number is refused: a
    device's size in bytes is written with a unit, and '40' means 40 GiB far more often."""
    if value is None:
        return None
    if value.strip().isdigit() and int(value) > 0:
        raise click.BadParameter(f"{value}: give the unit, such as {value}GiB (a bare number "
                                 "would be bytes)", param_hint="--memory")
    size = size_option(value, "--memory")
    if size <= 0:
        raise click.BadParameter(f"{value}: a device holds some memory; give a size such as "
                                 "16GiB", param_hint="--memory")
    return size
