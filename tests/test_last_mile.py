"""Issue 63, the last mile: each message a new user meets reads as a person would write it,
and an option that would do nothing is refused rather than ignored."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from npumem.cli import main

SNAPSHOT = "tests/data/cuda_snapshots/mlp.pickle.gz"


def _run(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("extra, named", [
    (["--sweep", "expandable_segments=True,False", "--plot", "OUT"], "--sweep and --plot do"),
    (["--plot", "OUT"], "--plot does"),
    (["--allocator", "pool"], "--allocator does"),
    (["--scheduler", "dask"], "--scheduler/--workers does"),
    (["--workers", "2"], "--scheduler/--workers does"),
])
def test_replay_check_refuses_the_options_it_would_ignore(tmp_path, extra, named):
    plot = tmp_path / "out.svg"
    result = _run("replay", "--check", SNAPSHOT, *[str(plot) if a == "OUT" else a for a in extra])
    assert result.exit_code == 2
    assert f"{named} nothing with --check" in result.output
    assert "Traceback" not in result.output
    assert not plot.exists()


def test_replay_check_takes_the_options_it_honours():
    result = _run("replay", "--check", SNAPSHOT, "--scheduler", "serial", "--allocator", "torch")
    assert result.exit_code == 0, result.output
    assert "MATCH" in result.output
