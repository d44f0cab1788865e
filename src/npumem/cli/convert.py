"""`npumem convert`: an allocation trace from one format to another, written whole or not at
all."""

from __future__ import annotations


import click

from .errors import CommandError

from .common import echo_recorded_ooms


@click.command()
@click.argument("source", type=click.Path(dir_okay=False))
@click.argument("target", type=click.Path(dir_okay=False))
@click.option("--to", "fmt", default=None, help="Output format (default: from TARGET's name): "
              "jsonl, chrome, snapshot, rmm, msprof.")
def convert(source, target, fmt):
    """Convert an allocation trace between formats (any readable format in; .jsonl, .json,
    .pickle, .csv (RMM) or operator_memory.csv out; add .gz to compress). A snapshot going to
    .pickle or .jsonl keeps everything; other formats keep each allocation and free."""
    from ..output_files import OutputPathError, check_output, written_whole
    from ..trace import FORMATS, TraceFormatError, detect_format
    from ..trace.formats import convert as convert_file, format_for_output

    if fmt is not None and fmt not in FORMATS:
        raise click.BadParameter(f"choose from {', '.join(FORMATS)}", param_hint="--to")
    try:
        check_output(target, source)
        fmt = fmt or format_for_output(target)
        source_format = detect_format(source)
        notes: list[str] = []
        loaded: dict = {}
        with written_whole(target) as partial:
            count = convert_file(source, partial, fmt, notes, loaded)
            if count == 0:
                _readable_or_refused(source, partial, fmt)
    except OutputPathError as exc:
        raise CommandError(str(exc)) from None
    except TraceFormatError as exc:
        raise CommandError(str(exc)) from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot write {target}: {exc.strerror}")
    click.echo(f"{source} ({source_format}) -> {target} ({fmt}): {count} events")
    for note in notes:
        click.echo(f"note: {source}: {note}")
    if echo_recorded_ooms([source], loaded) and fmt not in ("snapshot", "jsonl"):
        click.echo(f"note: {target} holds allocations and frees only: the out-of-memory, the "
                   f"segments and the settings stay in {source} (convert to .pickle or .jsonl "
                   "keeps them)")


def _readable_or_refused(source: str, written: str, fmt: str) -> None:
    """A conversion that wrote no event (a header-only input, say) must still give a file
    npumem reads back; otherwise nothing is written and the reason is given."""
    from ..trace import TraceFormatError, read_trace
    from ..trace.snapshot import load_data

    try:
        if fmt in ("snapshot", "jsonl"):
            load_data(written)
        else:
            list(read_trace(written))
    except TraceFormatError:
        raise TraceFormatError(source, "", "holds no allocation or free to convert (a header "
                               "only, or no events); nothing was written") from None
