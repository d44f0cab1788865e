"""Leaks users actually make (issue 21, part 3): a global list that keeps tensors, reported as
live when the script's code ends and as growth while it runs; warnings that show."""

import subprocess
import sys
import textwrap

import numpy as np

import npumem
import npumem.memory as mem
from npumem import profile

LEAKY = textwrap.dedent('''
    import npumem as nm

    kept = []


    def step(i):
        scratch = nm.empty((1 << 14,), "float32")
        if i % 3 == 0:
            kept.append(nm.empty((1 << 12,), "float32"))


    for i in range(30):
        with nm.profile.range("step"):
            step(i)
''')


def test_a_leak_into_a_global_list_is_reported_with_its_growth(tmp_path):
    script = tmp_path / "leaky.py"
    script.write_text(LEAKY)
    done = subprocess.run([sys.executable, "-m", "npumem", "profile", "--stacks", "--out",
                           str(tmp_path / "prof"), "--", str(script)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "10 leaked allocation(s), 160.00 KiB" in done.stderr, done.stderr
    assert "probable leak, growing: " in done.stderr and "leaky.py:10 in step" in done.stderr
    assert "per step" in done.stderr
    leaks = (tmp_path / "prof" / "leaks.txt").read_text()
    assert "leaky.py:10 in step" in leaks and "Growing while the program ran" in leaks
    summary = (tmp_path / "prof" / "summary.txt").read_text()
    assert "Growing while the program ran (probable leaks):" in summary


def test_growth_is_seen_while_the_program_runs_and_one_time_memory_is_not():
    kept, weights = [], []
    with profile.track(stacks=True) as tracker:
        weights.append(npumem.empty(1 << 16))                        # allocated once, kept
        for step in range(12):
            with profile.range("step"):
                scratch = npumem.empty(1 << 10)
                if step % 2:
                    kept.append(npumem.empty(256))
                del scratch
            if step == 8:
                early = tracker.growth()                            # while it still runs
    assert [g.site.split(" in ")[-1] for g in early] == ["test_growth_is_seen_while_the_program_runs_and_one_time_memory_is_not"]
    found = tracker.growth()
    assert len(found) == 1 and found[0].unit == "step"
    assert found[0].last_bytes - found[0].first_bytes == 6 * 1024     # six odd steps, 1 KiB each
    assert found[0].per_unit > 0 and "per step" in found[0].describe()


def test_step_marks_are_the_checkpoints_of_growth(rt):
    """memory.step() ends each step: growth is measured per step without any range."""
    kept = []
    with profile.track(stacks=True) as tracker:
        for step in range(10):
            scratch = mem.caching_allocator_alloc(4096)
            if step % 2:
                kept.append(mem.caching_allocator_alloc(512))
            mem.caching_allocator_delete(scratch)
            mem.step()
    found = tracker.growth()
    assert len(found) == 1 and found[0].unit == "step" and found[0].intervals == 9
    assert found[0].last_bytes - found[0].first_bytes == 5 * 512      # steps 1, 3, 5, 7, 9
    for pointer in kept:
        mem.caching_allocator_delete(pointer)


def test_without_ranges_the_run_is_cut_into_intervals():
    kept = []
    with profile.track() as tracker:
        for _ in range(40):
            kept.append(npumem.from_numpy(np.zeros(64, np.float32)))
    found = tracker.growth()
    assert len(found) == 1 and found[0].unit == "interval"


def test_live_allocations_at_reset_are_shown_by_default():
    code = ("import npumem\nnpumem.init(); npumem.set_device(0)\np = npumem.malloc(4096)\n"
            "npumem.reset_device(0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "LiveAllocationsWarning" in done.stderr, done.stderr
    assert "1 live allocation(s)" in done.stderr


def test_the_demo_reports_no_leaks_of_its_own(tmp_path):
    out = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "npumem", "demo", "--size", "16K", "--out",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = subprocess.run([sys.executable, "-m", "npumem", "report", str(out / "snapshot.pickle")],
                            capture_output=True, text=True, timeout=120).stdout
    assert "no repeating step found: leaks are not judged" in report
    assert "still live at its end (not leaks" in report and "):\n  none" in report
    assert "demo.py:" in report and "click" not in report
