"""The `npumem` command line: thin verbs that parse, call the library and print.

One module per verb; what several verbs share is in `common`. Verb modules import `common`,
never one another, and only this module knows them all."""

from __future__ import annotations

import sys

import click

from .. import __version__
from ..estimate.command import estimate_command
from . import convert, demo, diff, info, plan, profile, replay, report, tune, view
from .errors import CommandError


class _Commands(click.Group):
    """Every command: a `CommandError` a verb raised, an npumem error no command handled (a bad
    NPUMEM_* setting, say) and running out of host memory end in one line and their exit
    status, never a traceback. This is the one place a command's failure is printed."""

    def invoke(self, ctx):
        from ..environment_check import problems
        from ..errors import AclError

        try:
            found = problems()
            for problem in found[:-1]:
                click.echo(f"error: {problem}", err=True)
            if found:
                raise CommandError(found[-1])
            return super().invoke(ctx)
        except CommandError as exc:
            click.echo(f"error: {exc.message}", err=True)
            sys.exit(exc.exit_code)
        except AclError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except ValueError as exc:
            # a damaged file found deep in a verb (the allocator model's start state, a report
            # of a trace it cannot follow): the reader's error names the file and the entry
            from ..planning.problem import ProblemFormatError
            from ..trace import TraceFormatError
            from ..trace.snapshot import SnapshotError
            if not isinstance(exc, (TraceFormatError, SnapshotError, ProblemFormatError)):
                raise
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except MemoryError:
            click.echo("error: out of host memory (RAM); try a smaller input or --size", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="npumem")
def main() -> None:
    """npumem: accelerator device memory, on a simulated NPU or real hardware."""
    # a name from a file that no encoding holds (a lone surrogate in a pickle's frame) is
    # printed escaped, not the end of the command
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


main.add_command(demo.demo)
main.add_command(info.info)
main.add_command(replay.replay)
main.add_command(tune.tune)
main.add_command(convert.convert)
main.add_command(plan.plan)
main.add_command(profile.profile)
main.add_command(report.report)
main.add_command(diff.diff_command)
main.add_command(estimate_command)
main.add_command(view.view)
