"""Step marks in snapshots: `npumem.memory.step()` is recorded in memory_snapshot()'s
"external_annotations", PyTorch's own annotations (torch.profiler's ProfilerStep#N,
record_function scopes) are read as steps with `--steps NAME`, and a predictive replay marks
each step where the program did."""

from __future__ import annotations

import json
import pickle

import pytest
from click.testing import CliRunner

import npumem.memory as mem
from npumem.cli import main
from npumem.trace import TraceFormatError
from npumem.events import TraceEvent
from npumem.trace.snapshot import recording_from_data
from npumem.trace.snapshot import from_events, read_with_steps, save
from npumem.trace.formats import read_with_steps as read_any_with_steps
from npumem.trace.step_marks import step_positions
from npumem.whatif.sweep import ReplayJob

from .test_predictive import STEP

STEPS, PER_STEP = 8, 2 * len(STEP)


def run_marked_program(marked: bool = True) -> dict:
    """STEP twice per step, eight steps, each ended with memory.step() if `marked`, with the
    history on: the snapshot."""
    mem.record_memory_history(max_entries=100_000, stacks=False)
    for _ in range(STEPS):
        due: dict[int, list[int]] = {}
        for index, (size, lifetime) in enumerate(STEP * 2):
            for pointer in due.pop(index, []):
                mem.caching_allocator_delete(pointer)
            due.setdefault(index + lifetime, []).append(mem.caching_allocator_alloc(size))
        for pointers in due.values():
            for pointer in pointers:
                mem.caching_allocator_delete(pointer)
        if marked:
            mem.step()
    snapshot = mem.memory_snapshot()
    mem.record_memory_history(enabled=False)
    return snapshot


def test_memory_step_is_in_the_snapshot_before_the_next_steps_first_entry(rt):
    snapshot = run_marked_program()
    marks = snapshot["external_annotations"]
    assert [mark["name"] for mark in marks] == ["npumem.memory.step"] * STEPS
    assert {mark["stage"] for mark in marks} == {"START"} and {mark["device"] for mark in marks} == {0}
    entries = snapshot["device_traces"][0]
    for number, mark in enumerate(marks, 1):
        before = entries[:mark["npumem_entry"]]
        assert sum(entry["action"] == "alloc" for entry in before) == number * PER_STEP
    assert "external_annotations" not in run_marked_program(marked=False)


def test_a_predictive_replay_marks_the_steps_where_the_program_did(rt, tmp_path):
    marked, plain = tmp_path / "marked.pickle", tmp_path / "plain.pickle"
    marked.write_bytes(pickle.dumps(run_marked_program()))
    plain.write_bytes(pickle.dumps(run_marked_program(marked=False)))
    events, marks, _ = read_with_steps(str(marked))
    allocs = [sum(event.action == "alloc" for event in events[:mark]) for mark in marks]
    assert allocs == [number * PER_STEP for number in range(1, STEPS + 1)]
    results = {path.name: ReplayJob(str(path), "pool", "predictive:True").run()
               for path in (marked, plain)}
    # marked: the whole step between two marks is the template; found: the repeat of STEP
    assert results["marked.pickle"].notes[0] == f"{STEPS} steps marked by the trace's " \
                                                "npumem.memory.step() marks"
    assert f"serving a step of {PER_STEP} planned blocks" in results["marked.pickle"].notes[1]
    assert f"serving a step of {PER_STEP // 2} planned blocks" in results["plain.pickle"].notes[0]
    assert results["marked.pickle"].prediction_hit_rate == 1.0


def profiler_snapshot(steps: int = 4, per_step: int = 3) -> dict:
    """A trace of `steps` steps of `per_step` 1 MiB blocks, 10 µs apart, with torch.profiler's
    ProfilerStep#N scopes around each, a record_function scope inside, and another device."""
    events, annotations, time = [], [], 0
    for step in range(steps):
        annotations.append({"device": 0, "name": f"ProfilerStep#{step}", "stage": "START",
                            "time_us": time + 5})
        annotations.append({"device": 0, "name": "forward", "stage": "START", "time_us": time + 7})
        annotations.append({"device": 1, "name": f"ProfilerStep#{step}", "stage": "START",
                            "time_us": time + 1})
        for block in range(per_step):
            time += 10
            events.append(TraceEvent(time, "alloc", 0x1000 * (step * per_step + block + 1), 1 << 20))
        for block in range(per_step):
            time += 10
            events.append(TraceEvent(time, "free", 0x1000 * (step * per_step + block + 1), 1 << 20))
        annotations.append({"device": 0, "name": f"ProfilerStep#{step}", "stage": "END",
                            "time_us": time + 5})
    data = from_events(events)
    data["external_annotations"] = annotations
    return data


def snapshot_positions(data: dict, name: str | None) -> list[int]:
    recording = recording_from_data(data)
    times = [entry["time_us"] for entry in recording.entries]
    return step_positions("<snapshot>", recording.annotations, name, times)


def test_profiler_steps_mark_the_entry_after_their_start():
    data = profiler_snapshot()
    per_step = 3 * 3          # alloc; free_requested and free_completed per block
    assert snapshot_positions(data, "ProfilerStep") == [step * per_step for step in range(4)]
    assert snapshot_positions(data, "forward") == [step * per_step for step in range(4)]
    assert snapshot_positions(data, None) == []          # npumem's own marks: none


def test_annotations_that_cannot_mark_steps_say_what_the_snapshot_has():
    data = profiler_snapshot()
    with pytest.raises(TraceFormatError, match=r"no START annotation named 'train'.*"
                                               r"'ProfilerStep' \(4\), 'forward' \(4\)"):
        snapshot_positions(data, "train")
    for when in ("soon", float("nan"), None):
        data["external_annotations"][0]["time_us"] = when
        with pytest.raises(TraceFormatError, match="'ProfilerStep#0' has no time_us number"):
            snapshot_positions(data, "ProfilerStep")
    bare = from_events([TraceEvent(1, "alloc", 16, 512)])
    with pytest.raises(TraceFormatError, match="no annotations"):
        snapshot_positions(bare, "ProfilerStep")


def test_a_chrome_traces_profiler_steps_mark_the_event_after_their_start(tmp_path):
    """The profiler's Chrome trace: ProfilerStep#N spans ("X", user_annotation) and [memory]
    events, written out of time order as the profiler does."""
    trace, events, time = [], [], 0
    for step in range(3):
        trace.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                      "ts": time + 1, "dur": 50})
        for block in range(2):
            time += 10
            trace.append({"ph": "i", "name": "[memory]", "ts": time,
                          "args": {"Addr": 64 * (block + 1), "Bytes": 512}})
            events.append(time)
        for block in range(2):
            time += 10
            trace.append({"ph": "i", "name": "[memory]", "ts": time,
                          "args": {"Addr": 64 * (block + 1), "Bytes": -512}})
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"traceEvents": trace[::-1]}))
    events, marks, note = read_any_with_steps(path, "ProfilerStep")
    events = list(events)
    assert marks == [0, 4, 8] and note is None
    assert [event.action for event in events[4:8]] == ["alloc", "alloc", "free", "free"]
    assert read_any_with_steps(path)[1:] == ([], "the trace has 3 torch.profiler steps "
                                                 "(ProfilerStep#N annotations); --steps "
                                                 "ProfilerStep marks a step at each, as "
                                                 "npumem.memory.step() would")


def test_npumem_replay_steps_option(tmp_path):
    path = tmp_path / "profiled.pickle"
    save(profiler_snapshot(steps=6), str(path))
    runner = CliRunner()
    base = ["replay", str(path), "--allocator", "pool", "--set", "predictive=True",
            "--scheduler", "serial"]
    hinted = runner.invoke(main, base)
    assert hinted.exit_code == 0, hinted.output
    assert "--steps ProfilerStep marks a step at each" in hinted.output
    marked = runner.invoke(main, base + ["--steps", "ProfilerStep"])
    assert marked.exit_code == 0, marked.output
    assert "6 steps marked by the trace's 'ProfilerStep' annotations" in marked.output
    wrong_name = runner.invoke(main, base + ["--steps", "train"])
    assert wrong_name.exit_code == 2 and "no START annotation named 'train'" in wrong_name.output
    not_predictive = runner.invoke(main, base[:4] + ["--steps", "ProfilerStep"])
    assert not_predictive.exit_code == 2 and "predictive:True" in not_predictive.output
    jsonl = tmp_path / "trace.jsonl"
    jsonl.write_text('{"action": "alloc", "addr": 16, "size": 512, "t_us": 1}\n')
    not_a_snapshot = runner.invoke(main, ["replay", str(jsonl), "--allocator", "pool", "--set",
                                          "predictive=True", "--steps", "ProfilerStep"])
    assert not_a_snapshot.exit_code == 2 and "only memory snapshots" in not_a_snapshot.output
    for result in (wrong_name, not_predictive, not_a_snapshot):
        assert "Traceback" not in result.output


def test_a_real_profiler_trace_replays_with_its_steps_marked(tmp_path):
    """torch.profiler on the CPU, with a schedule (what gives ProfilerStep#N spans), exporting
    a Chrome trace with memory events: `npumem replay --steps ProfilerStep` marks each."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile, schedule

    path = tmp_path / "profile.json"
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True,
                 schedule=schedule(wait=0, warmup=1, active=6, repeat=1),
                 on_trace_ready=lambda done: done.export_chrome_trace(str(path))) as profiler:
        for _ in range(8):
            model(torch.randn(32, 64)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            profiler.step()
    spans = [event for event in json.loads(path.read_text())["traceEvents"]
             if str(event.get("name", "")).startswith("ProfilerStep#")]
    assert len(spans) >= 2
    result = CliRunner().invoke(main, ["replay", str(path), "--allocator", "pool", "--set",
                                       "predictive=True", "--steps", "ProfilerStep"])
    assert result.exit_code == 0, result.output
    assert f"{len(spans)} steps marked by the trace's 'ProfilerStep' annotations" in result.output
