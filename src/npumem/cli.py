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
              help="float32 elements per vector (suffixes K/M allowed); the matrices are "
                   "sqrt(size) square.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write the memory snapshot (snapshot.pickle) into this folder.")
def demo(device: str, size: str, out_dir: str | None) -> None:
    """Run the single-operator flow end to end (pool, H2D, two-phase Add and MatMul, D2H) and
    verify the result."""
    from .demo import run_demo

    elements = _size_option(size)
    if elements <= 0:
        raise click.BadParameter("must be positive", param_hint="--size")
    try:
        passed = run_demo(elements, device=device, echo=click.echo, out_dir=out_dir)
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


@main.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--allocator", "allocators", default="pool,torch,device", show_default=True,
              help="Comma-separated: pool (npumem), torch (PyTorch's policy), device (no cache).")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="A pool setting (NPUMEM_ALLOC_CONF keys), repeatable.")
@click.option("--memory", default="64GiB", show_default=True, help="Simulated device memory.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def replay(traces, allocators, settings, memory, as_json):
    """Replay allocation traces through allocators and compare what they reserve."""
    import json

    from .alloc.settings import parse_settings
    from .errors import InvalidParamError
    from .trace import TraceFormatError, read_trace
    from .trace.replay import ALLOCATORS, replay as run_replay
    from .units import format_size

    names = [name.strip() for name in allocators.split(",") if name.strip()]
    unknown = [name for name in names if name not in ALLOCATORS]
    if unknown or not names:
        raise click.BadParameter(f"unknown allocator(s) {unknown}; choose from {', '.join(ALLOCATORS)}",
                                 param_hint="--allocator")
    try:
        pool_settings = parse_settings(",".join(settings))
    except InvalidParamError as exc:
        raise click.BadParameter(exc.message, param_hint="--set") from None
    device_memory = _size_option(memory)
    show_progress = not as_json and sys.stderr.isatty()
    results = []
    for path in traces:
        try:
            events = list(read_trace(path))
        except TraceFormatError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        for name in names:
            def progress(count, name=name, path=path):
                if show_progress:
                    click.echo(f"\r{path} [{name}]: {count}/{len(events)} events", err=True, nl=False)
            result = run_replay(events, name, pool_settings, trace_name=path, memory=device_memory,
                                progress=progress)
            if show_progress:
                click.echo("\r" + " " * 70 + "\r", err=True, nl=False)
            results.append(result)
    if as_json:
        click.echo(json.dumps([r.as_dict() for r in results], indent=2))
        return
    click.echo(f"{'trace':<28} {'allocator':<9} {'events':>7} {'peak live':>11} {'peak reserved':>13} "
               f"{'ratio':>6} {'dev allocs':>10} {'hit rate':>8} {'alloc us':>8}")
    for r in results:
        click.echo(f"{r.trace[-28:]:<28} {r.allocator:<9} {r.events:>7} "
                   f"{format_size(r.peak_allocated_bytes):>11} {format_size(r.peak_reserved_bytes):>13} "
                   f"{r.reserved_over_allocated:>6.3f} {r.device_allocs:>10} {r.cache_hit_rate:>8.1%} "
                   f"{r.mean_alloc_us:>8.2f}")
    if pool_settings != pool_settings.__class__():
        click.echo(f"pool settings: {results[0].settings if results else ''}")
