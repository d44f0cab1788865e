"""The `npumem` command line: thin verbs that parse, call the library and print."""

from __future__ import annotations

import sys

import click

from . import __version__
from .units import parse_size


def _size_option(value: str) -> int:
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="npumem")
def main() -> None:
    """npumem: accelerator device memory, on a simulated NPU or real hardware."""


@main.command()
@click.option("--device", default="sim", show_default=True, help="Device backend to run on.")
@click.option("--size", default="1M", show_default=True,
              help="Number of float32 elements to move (suffixes K/M allowed).")
def demo(device: str, size: str) -> None:
    """Run the AscendCL memory flow end to end and verify the result."""
    from .demo import run_demo

    elements = _size_option(size)
    if elements <= 0:
        raise click.BadParameter("must be positive", param_hint="--size")
    try:
        passed = run_demo(elements, device=device, echo=click.echo)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(0 if passed else 1)


@main.command()
def info() -> None:
    """Show the devices and their memory."""
    from . import runtime as rt
    from .constants import MemAttr
    from .units import format_size

    rt.init()
    try:
        backend = rt.RUNTIME.backend
        click.echo(f"backend: {backend.name}, {backend.device_count} device(s)")
        for device in range(backend.device_count):
            for attr in MemAttr:
                free, total = backend.mem_info(device, attr)
                if total:
                    click.echo(f"  device {device} {attr.name:<15} {format_size(free):>12} free "
                               f"of {format_size(total)}")
    finally:
        rt.finalize()
