"""bench/steady_bound.py: the fewest pages a step's blocks need around the blocks the pool holds."""

import importlib.util
import pathlib

import pytest

pytest.importorskip("scipy")

from scipy.optimize import milp  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "bench" / "steady_bound.py"
MiB = 1 << 20


def _module():
    spec = importlib.util.spec_from_file_location("steady_bound", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Held: [0, 1 MiB) and [3, 4 MiB), touching pages 0 and 1; the gap between them is 2 MiB, all
# on those two pages.
HELD = [(0, MiB), (3 * MiB, 4 * MiB)]


@pytest.mark.parametrize("sizes, least", [
    ([MiB, MiB], 2),                    # both fit in the gap: no page more
    ([3 * MiB // 2, 3 * MiB // 2], 3),  # one fits; the other needs a page above
    ([3 * MiB], 4),                     # fits no gap: two pages above the held ones
    ([], 2),
])
def test_blocks_fill_the_gaps_on_held_pages_before_new_pages(sizes, least):
    assert _module().least_pages(sizes, HELD, milp) == least


def test_a_gap_that_spans_a_whole_page_counts_it():
    # [0, 1 MiB) and [5, 6 MiB): the gap [1, 5) MiB has page 1 untouched, 2 MiB free on pages 0
    # and 2; a 3 MiB block fits there only by mapping page 1
    assert _module().least_pages([3 * MiB], [(0, MiB), (5 * MiB, 6 * MiB)], milp) == 3


def test_the_bench_names_a_missing_trace(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["steady_bound.py", str(tmp_path / "missing.jsonl.gz")])
    with pytest.raises(SystemExit) as exit_:
        _module().main()
    assert "missing.jsonl.gz" in str(exit_.value)


def test_the_resumed_loop_is_at_its_bound_and_the_planner_is_left_as_it_was(capsys, monkeypatch):
    """gpt_resume (tests/data): no holes between long-lived blocks, so its layout's pages are
    the least possible; the bench puts back the planner it wraps."""
    from npumem.alloc import predictive, step_plan

    trace = pathlib.Path(__file__).parent / "data" / "cpu_recordings" / "gpt_resume.jsonl.gz"
    monkeypatch.setattr("sys.argv", ["steady_bound.py", str(trace), "--moments", "5"])
    _module().main()
    row = capsys.readouterr().out.splitlines()[-1].split()
    assert row[0] == "gpt_resume" and row[1] == row[2] == "1.015"
    assert int(row[-2]) == int(row[-1]) == 44
    assert predictive.lay_out is step_plan.lay_out
