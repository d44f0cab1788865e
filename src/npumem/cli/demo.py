"""`npumem demo`: the single-operator flow end to end, verified, on any backend."""

from __future__ import annotations

import sys

import click

from ..cli_sizes import size_option


@click.command()
@click.option("--device", default=None, help="Device backend: sim, torch:cpu, torch:cuda, torch:npu "
              "or torch (the best PyTorch device). Default: $NPUMEM_DEVICE, else sim.")
@click.option("--size", default="1M", show_default=True,
              help="float32 elements per vector (1M, 64K, 1000), or the bytes of each vector "
                   "(4MiB); the matrices are sqrt(size) square.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write the memory snapshot (snapshot.pickle) into this folder.")
def demo(device: str | None, size: str, out_dir: str | None) -> None:
    """Run the single-operator flow end to end (pool, H2D, two-phase Add and MatMul, D2H) and
    verify the result."""
    from ..demo import run_demo
    from ..device.select import default_spec
    from ..errors import FeatureNotSupportedError, InvalidParamError

    elements = size_option(size, "--size")
    if size.strip().lower().endswith("b"):          # bytes: 4 per float32 element
        elements //= 4
    if elements <= 0:
        raise click.BadParameter("must be at least one element (4 bytes)", param_hint="--size")
    try:
        passed = run_demo(elements, device=device or default_spec(), echo=click.echo,
                          out_dir=out_dir)
    except (InvalidParamError, FeatureNotSupportedError) as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(0 if passed else 1)
