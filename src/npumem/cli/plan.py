"""`npumem plan`: buffers with known lifetimes placed in one arena, as small as possible."""

from __future__ import annotations


import click

from .errors import CommandError


@click.command()
@click.argument("problem_file", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--algorithm", default="search", show_default=True,
              help="size, breadth, best (of the greedy orders) or search.")
@click.option("--time-limit", default=60.0, show_default=True, type=float,
              help="Seconds to spend after the first plan (a sweep over time, O(n log n)); "
                   "Ctrl-C stops early with the best plan so far.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Write the placement as CSV: id,lower,upper,size,offset.")
def plan(problem_file, algorithm, time_limit, as_json, out_path):
    """Place buffers with known lifetimes in one arena, as small as possible. FILE is an
    id,lower,upper,size CSV or any allocation trace (lifetimes from alloc/free order)."""
    import json

    from ..output_files import OutputPathError, check_output, written_whole
    from ..planning import ALGORITHMS, ProblemFormatError, plan as run_plan
    from ..trace.lifetimes import load_problem
    from ..trace import TraceFormatError
    from ..units import format_size

    if algorithm not in ALGORITHMS:
        raise click.BadParameter(f"choose from {', '.join(ALGORITHMS)}", param_hint="--algorithm")
    if not time_limit > 0:                     # (nan too)
        raise click.BadParameter(f"must be a positive number of seconds, got {time_limit}",
                                 param_hint="--time-limit")
    try:
        if out_path:
            check_output(out_path, problem_file)
        problem = load_problem(problem_file)
    except OutputPathError as exc:
        raise click.BadParameter(str(exc), param_hint="--out") from None
    except (ProblemFormatError, TraceFormatError) as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"cannot read {problem_file}: {exc.strerror}")
    verbose = not as_json                   # a few lines: each better height
    if verbose:
        for note in problem.notes:
            click.echo(f"note: {note}", err=True)

    def say(message: str) -> None:          # each better height, as the search finds it
        if verbose:
            click.echo(f"plan: {message}", err=True)

    result = run_plan(problem, algorithm, time_limit, progress=say)
    if out_path:
        with written_whole(out_path) as partial, open(partial, "w", encoding="utf-8") as out:
            out.write("id,lower,upper,size,offset\n")
            for i in range(len(problem)):
                out.write(f"{problem.ids[i]},{problem.lower[i]},{problem.upper[i]},"
                          f"{problem.size[i]},{result.offsets[i]}\n")
    summary = result.summary()
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    stopped = " (interrupted: the best plan so far)" if result.interrupted else ""
    count = summary["buffers"]
    click.echo(f"{count} buffer{'' if count == 1 else 's'}, load {format_size(summary['load_bytes'])}, "
               f"height {format_size(summary['height_bytes'])} ({summary['height_over_load']:.4f} "
               f"x load) by {summary['algorithm']} in {summary['seconds']:.1f} s; valid{stopped}")
    if out_path:
        click.echo(f"wrote {out_path}")
