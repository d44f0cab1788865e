"""`npumem diff`: what grew between two snapshots, by allocation site."""

from __future__ import annotations

import os

import click

from .common import echo_recorded_ooms, load_as_snapshot, profile_input


@click.command("diff")
@click.argument("before", type=click.Path())
@click.argument("after", type=click.Path())
@click.option("--top", default=20, show_default=True, type=click.IntRange(min=1),
              help="Sites to list.")
def diff_command(before, after, top):
    """What grew between two snapshots (pickles or profile folders), by allocation site."""
    from ..profile import diff

    def resolve(path):
        """A profile folder's snapshot (torch_snapshot.pickle, else snapshot.pickle), else the
        folder's Ascend profiler operator_memory.csv."""
        from ..profile.folder import SNAPSHOTS

        if not os.path.isdir(path) or any(os.path.isfile(os.path.join(path, name))
                                          for name in SNAPSHOTS):
            return profile_input(path)
        from ..profile.ascend import find_outputs

        operators = [files.operator for files in find_outputs(path) if files.operator]
        return operators[0] if len(operators) == 1 else profile_input(path)

    before, after = resolve(before), resolve(after)
    before_data, after_data = load_as_snapshot(before), load_as_snapshot(after)
    click.echo(diff(before_data, after_data, top))
    echo_recorded_ooms([before, after], {before: before_data, after: after_data})
