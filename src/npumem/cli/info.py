"""`npumem info`: which backend runs, its devices, and each device's memory."""

from __future__ import annotations

import click


@click.command()
def info() -> None:
    """Show the devices and their memory."""
    from .. import runtime as rt
    from ..constants import MemAttr
    from ..units import format_size

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
