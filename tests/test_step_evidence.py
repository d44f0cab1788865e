"""Steps from evidence (issue 61): the marks PyTorch writes are read as steps, a compiler's
scopes are not, and a step is inferred only where the recording repeats one and memory comes
back; a forward pass through identical layers has no steps."""

from __future__ import annotations

import pytest

from npumem.profile.leak_analysis import analyze_leaks
from npumem.profile.step_inference import find_steps
from npumem.trace.step_marks import step_kind

MiB = 1 << 20


def entry(action, addr, size, t, line=10):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": float(t),
            "frames": [{"filename": "train.py", "line": line, "name": "step"}]
            if action == "alloc" else []}


def loop(steps: int, leak: int = 0, marks: str | None = None):
    """A loop of `steps` steps, each 3 temporaries and `leak` bytes kept at train.py:20; with
    `marks`, a START annotation of that name at each step's start."""
    trace, notes, t, addr = [], [], 0, 1 << 30
    for step in range(steps):
        t += 10
        if marks:
            notes.append({"name": f"{marks}", "stage": "START", "device": 0, "time_us": t - 1})
        for size in (MiB, 2 * MiB, MiB):
            trace.append(entry("alloc", addr, size, t))
            trace += [entry("free_requested", addr, size, t + 1),
                      entry("free_completed", addr, size, t + 1)]
            addr += 4 * MiB
            t += 2
        if leak:
            trace.append(entry("alloc", addr, leak, t, line=20))
            addr += 4 * MiB
    return {"segments": [], "device_traces": [trace], "external_annotations": notes}


@pytest.mark.parametrize("name, kind", [
    ("Optimizer.step#AdamW.step", "optimizer"), ("ProfilerStep#7", "profiler"),
    ("npumem.memory.step", "npumem"), ("train_step", "user"), ("Training Step", "user"),
    ("pad_mm_benchmark (dynamo_timed)", None), ("Optimizer.zero_grad#SGD.zero_grad", None),
    ("forward", None), ("timestep_embedding", None)])
def test_what_names_a_step(name, kind):
    assert step_kind(name) == kind


def test_torch_optims_step_scope_marks_the_steps():
    steps = find_steps(loop(8, marks="Optimizer.step#SGD.step"), 0)
    assert (steps.source, steps.marker, len(steps.starts)) == ("marked", "Optimizer.step", 8)


def test_a_compilers_scopes_are_not_steps_and_the_step_is_inferred_instead():
    steps = find_steps(loop(8, marks="pad_mm_benchmark (dynamo_timed)"), 0)
    assert steps.source == "inferred" and "repeat" in steps.reason


def test_annotate_entries_that_name_a_step_are_marks():
    snapshot = loop(8)
    trace = snapshot["device_traces"][0]
    at = [i for i, e in enumerate(trace) if e["action"] == "alloc" and e["size"] == MiB][::2]
    for shift, i in enumerate(at):
        trace.insert(i + shift, {"action": "annotate", "addr": 0, "size": 0, "stream": 0,
                                 "time_us": trace[i + shift]["time_us"], "frames": [],
                                 "user_metadata": "train_step"})
    steps = find_steps(snapshot, 0)
    assert (steps.source, steps.marker, len(steps.starts)) == ("marked", "annotate entries", 8)


def test_a_leak_on_marked_steps_and_on_inferred_ones_says_which():
    marked = analyze_leaks(loop(8, leak=4096, marks="ProfilerStep#0"))
    inferred = analyze_leaks(loop(8, leak=4096))
    for analysis, how in ((marked, "marked"), (inferred, "inferred")):
        leak, = analysis.leaks
        assert leak.where == "train.py:20 in step" and leak.per_step == 4096
        assert leak.to_json()["steps_source"] == how
    assert "inferred steps" in inferred.leaks[0].describe()
    assert "inferred steps" not in marked.leaks[0].describe()


def test_a_monotone_rise_through_identical_layers_has_no_steps():
    """One forward pass: each layer allocates the same sizes from the same line and keeps its
    output for the backward pass."""
    trace, addr = [], 1 << 30
    for layer in range(32):
        trace.append(entry("alloc", addr, 8 * MiB, layer * 10))          # kept (saved)
        trace.append(entry("alloc", addr + 8 * MiB, 2 * MiB, layer * 10 + 1))
        trace += [entry("free_requested", addr + 8 * MiB, 2 * MiB, layer * 10 + 2),
                  entry("free_completed", addr + 8 * MiB, 2 * MiB, layer * 10 + 2)]
        trace.append(entry("alloc", addr + 12 * MiB, 8 * MiB, layer * 10 + 3))   # kept
        addr += 32 * MiB
    analysis = analyze_leaks({"segments": [], "device_traces": [trace]})
    assert analysis.leaks == []
    assert analysis.verdict(0).startswith("no repeating step found: leaks are not judged")
    assert "does not come back" in analysis.verdict(0)


def test_too_few_steps_are_not_judged():
    analysis = analyze_leaks(loop(4, leak=4096, marks="ProfilerStep#0"))
    assert analysis.leaks == [] and "too few to judge" in analysis.verdict(0)


REAL = __import__("pathlib").Path(__file__).resolve().parents[2] / "shared" / "data" / "snapshots"
OWN = __import__("pathlib").Path(__file__).resolve().parent / "data"


@pytest.mark.skipif(not REAL.is_dir(), reason="../shared/data/snapshots not beside the repo")
def test_real_recordings_that_do_not_leak_get_no_leak():
    """PyTorch users' CUDA snapshots: a compiled transformer's forward pass (memory rises
    layer over layer: no steps) and a CNN's training run (steps inferred: nothing grows)."""
    from npumem.cli.common import load_as_snapshot

    files = sorted(REAL.glob("*.pickle"))
    assert files
    for path in files:
        analysis = analyze_leaks(load_as_snapshot(str(path)))
        assert analysis.leaks == [], (path.name, analysis.lines())


def test_the_projects_oom_recordings_get_no_leak():
    """Runs that died on an H200 (the default setting's snapshots): cut in their first steps,
    or in the middle of a generation whose KV cache grows by design."""
    from npumem.cli.common import load_as_snapshot

    files = sorted((OWN / "cuda_oom_h200" / "snapshots").glob("*/*_default.pickle.gz"))
    files += sorted((OWN / "cuda_snapshots").glob("*.pickle.gz"))
    assert len(files) >= 30
    for path in files:
        assert analyze_leaks(load_as_snapshot(str(path))).leaks == [], path


def batches(sizes: list[int], leak: int = 0):
    """Marked steps whose batch is `size` KiB: the input (train.py:30) stays live until the
    next step's replaces it, temporaries of 4x its size; `leak` bytes kept each step."""
    trace, notes, t, addr, last = [], [], 0, 1 << 30, None
    for size in sizes:
        t += 10
        notes.append({"name": "ProfilerStep#1", "stage": "START", "device": 0, "time_us": t - 1})
        trace.append(entry("alloc", addr, size << 10, t, line=30))
        if last is not None:
            trace += [entry("free_requested", *last, t), entry("free_completed", *last, t)]
        last, addr = (addr, size << 10), addr + (64 << 20)
        trace.append(entry("alloc", addr, 4 * size << 10, t + 1))
        trace += [entry("free_requested", addr, 4 * size << 10, t + 2),
                  entry("free_completed", addr, 4 * size << 10, t + 2)]
        addr += 64 << 20
        if leak:
            trace.append(entry("alloc", addr, leak, t + 3, line=20))
            addr += 1 << 20
        t += 5
    return {"segments": [], "device_traces": [trace], "external_annotations": notes}


@pytest.mark.parametrize("sizes", [
    [8, 9, 11, 10, 12, 14, 13, 15, 16, 18, 17, 20],        # lengths that happen to rise
    [8, 31, 4, 16, 9, 2, 27, 12, 5, 20, 7, 24]])           # a varying batch
def test_a_tensor_that_follows_the_batch_size_is_no_leak(sizes):
    analysis = analyze_leaks(batches(sizes))
    assert analysis.any_judged and analysis.leaks == [], analysis.lines()


def test_a_leak_under_a_varying_batch_is_still_found():
    leak, = analyze_leaks(batches([8, 31, 4, 16, 9, 2, 27, 12, 5, 20, 7, 24], leak=4096)).leaks
    assert leak.where == "train.py:20 in step" and leak.per_step == 4096


def test_steps_looked_for_in_part_of_a_long_run_say_so(monkeypatch):
    import npumem.profile.step_inference as inference

    monkeypatch.setattr(inference, "MAX_ALLOCATIONS", 30)
    steps = find_steps(loop(20), 0)                 # 60 allocations, half of them looked at
    assert steps.source == "inferred"
    assert "looked for in the first 30 of 60 allocations only" in steps.reason
