"""One reading of a trace whose story of an address has a hole (trace/mending.py), the same in
every command: replay through each allocator, report, plan and convert."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from npumem.cli import main
from npumem.events import TraceEvent
from npumem.trace.formats import read_mended, read_trace, read_with_steps
from npumem.trace.mending import mend
from npumem.trace.snapshot import columns

pytestmark = pytest.mark.skipif(columns.native is None, reason="the C reader is not built")


def oracle(events: list[TraceEvent]) -> tuple[list[TraceEvent], dict[str, int]]:
    """The rule of the module's doc, one event at a time."""
    seen, live, before, out = set(), {}, [], []
    counts = dict.fromkeys(("before", "missed", "double", "resized"), 0)
    for e in events:
        if e.action == "alloc":
            if e.addr in live:
                block = live[e.addr]
                out.append(TraceEvent(e.t_us, "free", e.addr, block.size, block.stream))
                counts["missed"] += 1
            live[e.addr] = e
            out.append(e)
        elif e.addr in live:
            block = live.pop(e.addr)
            counts["resized"] += block.size != e.size
            out.append(e._replace(size=block.size))
        elif e.addr not in seen:
            before.append(TraceEvent(events[0].t_us, "alloc", e.addr, e.size, e.stream))
            out.append(e)
            counts["before"] += 1
        else:
            counts["double"] += 1
        seen.add(e.addr)
    return before + out, counts


def mended(events):
    result = mend(columns.from_events(events))
    return list(columns.to_events(result.entries)), result


events_strategy = st.lists(st.builds(
    TraceEvent, st.integers(0, 50).map(float), st.sampled_from(["alloc", "free"]),
    st.sampled_from([4096, 8192, 12288, 1 << 40]), st.sampled_from([512, 1000, 1 << 20]),
    st.integers(0, 2)), max_size=40).map(lambda es: sorted(es, key=lambda e: e.t_us))


@settings(max_examples=300, deadline=None)
@given(events_strategy)
def test_the_columns_follow_the_rule_event_by_event(events):
    out, result = mended(events)
    expected, counts = oracle(events)
    assert out == expected
    said = " ".join(result.notes)
    for kind, word in (("before", "before the trace began"), ("missed", "still live"),
                       ("double", "already freed"), ("resized", "another size")):
        assert (word in said) == bool(counts[kind])
    # the story of every address is whole now: alloc, free, alloc, free, ...
    live = {}
    for e in out:
        if e.action == "alloc":
            assert e.addr not in live
            live[e.addr] = e.size
        else:
            assert live.pop(e.addr) == e.size


def test_many_addresses_grow_the_hash_of_them():
    rng = np.random.default_rng(7)
    events = [TraceEvent(float(t), str(rng.choice(["alloc", "free"], p=[0.6, 0.4])),
                         int(rng.integers(0, 5000)) * 512, int(rng.choice([512, 1024])))
              for t in range(40_000)]
    out, _ = mended(events)
    assert out == oracle(events)[0]


def test_a_whole_trace_is_not_copied():
    events = [TraceEvent(1.0, "alloc", 4096, 10), TraceEvent(2.0, "free", 4096, 10)]
    entries = columns.from_events(events)
    result = mend(entries)
    assert result.entries is entries and result.notes == [] and result.position(1) == 1


def test_notes_name_the_first_event_and_count_the_rest():
    events = [TraceEvent(1.0, "free", 0x10, 7), TraceEvent(2.0, "free", 0x20, 9),
              TraceEvent(3.0, "alloc", 0x30, 5), TraceEvent(4.0, "alloc", 0x30, 6),
              TraceEvent(5.0, "free", 0x30, 1), TraceEvent(6.0, "free", 0x30, 6)]
    out, result = mended(events)
    assert result.notes == [
        "2 frees of an address the trace had not allocated (first: event 1, 7 B at 0x10): read "
        "as block(s) allocated before the trace began, live from its start as PyTorch's memory "
        "viewer shows them",
        "1 alloc at an address whose block was still live (first: event 4, 6 B at 0x30, while "
        "event 3's 5 B block was): the trace misses that block's free; it is freed just before",
        "1 free of an address already freed (first: event 6, 6 B at 0x30): ignored",
        "1 free naming another size than its block's (first: event 5 says 1 B of event 4's 6 B): "
        "the block's size is freed"]
    assert [(e.t_us, e.action, e.addr, e.size) for e in out] == [
        (1.0, "alloc", 0x10, 7), (1.0, "alloc", 0x20, 9), (1.0, "free", 0x10, 7),
        (2.0, "free", 0x20, 9), (3.0, "alloc", 0x30, 5), (4.0, "free", 0x30, 5),
        (4.0, "alloc", 0x30, 6), (5.0, "free", 0x30, 6)]
    # a step mark before an event stays before it, and before what was put in front of it
    assert [result.position(i) for i in range(7)] == [2, 3, 4, 5, 7, 8, 8]


def test_times_keep_their_kind():
    events = [TraceEvent(5, "alloc", 1, 2), TraceEvent(6.5, "alloc", 1, 2)]
    out, _ = mended(events)
    assert [(type(e.t_us), e.t_us) for e in out] == [(float, 5.0), (float, 6.5), (float, 6.5)]


def write(tmp_path, name, events):
    path = tmp_path / name
    path.write_text("".join(json.dumps({"t_us": t, "action": a, "addr": addr, "size": size}) + "\n"
                            for t, a, addr, size in events))
    return str(path)


# The new-user trial's files: each command read them its own way (peak live 1000, 1500 or
# 500 B for the first; reserved 2x allocated in the report for the second).
DOUBLE_ALLOC = [(1, "alloc", 4096, 1000), (2, "alloc", 4096, 500), (3, "free", 4096, 1000),
                (4, "free", 4096, 500)]
UNKNOWN_FREE = [(1, "alloc", 4096, 1000), (2, "free", 9999, 1000), (3, "free", 4096, 1000)]


@pytest.mark.parametrize("events, peak, said", [(DOUBLE_ALLOC, 1000, "still live"),
                                                (UNKNOWN_FREE, 2000, "before the trace began")])
def test_every_command_reads_a_broken_story_alike(tmp_path, events, peak, said):
    path = write(tmp_path, "t.jsonl", events)
    runner = CliRunner()
    for allocator in ("pool", "torch", "device"):
        result = runner.invoke(main, ["replay", path, "--allocator", allocator, "--json"])
        assert result.exit_code == 0, result.output
        row = json.loads(result.output)[0]
        assert row["peak_allocated_bytes"] == peak, allocator
        assert any(said in note for note in row["notes"]), allocator
    report = runner.invoke(main, ["report", path])
    assert report.exit_code == 0, report.output
    assert f"peak allocated {peak} B" in report.output.replace("1.95 KiB", "2000 B")
    assert "reserved/allocated 1.000" in report.output and said in report.output
    assert f"device 0: {len(events) + (peak == 2000)} events" in report.output
    plan = runner.invoke(main, ["plan", path, "--json", "--time-limit", "1"])
    assert plan.exit_code == 0, plan.output
    summary = json.loads(plan.output)
    assert summary["load_bytes"] == peak and summary["valid"]
    assert any(said in note for note in summary["notes"])
    for allocator in ("pool", "torch"):
        tune = runner.invoke(main, ["tune", path, "--allocator", allocator, "--scheduler",
                                    "serial"])
        assert tune.exit_code == 0 and said in tune.output, tune.output
    converted = str(tmp_path / "out.jsonl")
    convert = runner.invoke(main, ["convert", path, converted])
    assert convert.exit_code == 0 and said in convert.output
    assert mend(columns.from_events(read_trace(converted))).notes == []   # written whole


def test_step_marks_of_a_chrome_trace_follow_the_events(tmp_path):
    # a free of a block from before the profiler started, then two steps of one alloc and free
    def memory(ts, addr, nbytes):
        return {"ph": "i", "name": "[memory]", "ts": ts, "pid": 1, "tid": 1,
                "args": {"Addr": addr, "Bytes": nbytes, "Device Type": 1, "Device Id": 0}}

    def step(ts, n):
        return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts,
                "dur": 10, "pid": 1, "tid": 1}
    trace = {"traceEvents": [memory(1, 0x10, -64), step(10, 1), memory(11, 0x20, 128),
                             memory(12, 0x20, -128), step(20, 2), memory(21, 0x20, 128),
                             memory(22, 0x20, -128)]}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    events, marks, _ = read_with_steps(str(path), "ProfilerStep")
    events = list(events)
    assert events[0] == TraceEvent(1.0, "alloc", 0x10, 64, 0)
    assert [events[m].t_us for m in marks] == [11.0, 21.0]
    assert np.all(np.diff([e.t_us for e in events]) >= 0)


def test_jsonl_named_json_is_read_as_the_trace_it_is(tmp_path):
    # report took any .json that is not a Chrome trace for a memory_stats() dump
    path = write(tmp_path, "trace.json", [(1, "alloc", 4096, 1000), (2, "free", 4096, 1000)])
    report = CliRunner().invoke(main, ["report", path])
    assert report.exit_code == 0, report.output
    assert "device 0: 2 events, peak allocated 1000 B" in report.output
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"allocated_bytes.all.current": 1}))
    refused = CliRunner().invoke(main, ["report", str(stats)])
    assert refused.exit_code != 0 and "memory_stats()" in refused.output


@settings(max_examples=100, deadline=None)
@given(events_strategy, st.integers(1, 7))
def test_a_trace_read_in_parts_has_the_holes_it_has_whole(events, part):
    entries = columns.from_events(events)
    c = entries.columns
    *expected, _ = columns.native.story_holes(c.action, c.addr, c.size, columns.ALLOC)
    found, stories = [b""] * 6, None
    for start in range(0, len(events), part):
        at = slice(start, start + part)
        *holes, stories = columns.native.story_holes(c.action[at], c.addr[at], c.size[at],
                                                     columns.ALLOC, stories, start)
        found = [so_far + more for so_far, more in zip(found, holes)]
    assert found == expected


def test_a_whole_jsonl_trace_streams_and_a_broken_one_is_mended(tmp_path, monkeypatch):
    from npumem.trace import jsonl
    monkeypatch.setattr(jsonl, "CHUNK", 2)          # parts of two lines
    whole = write(tmp_path, "whole.jsonl", [(1, "alloc", 16, 8), (2, "alloc", 32, 8),
                                            (3, "free", 16, 8), (4, "free", 32, 8)])
    events = read_trace(whole)
    assert events.notes == [] and [e.t_us for e in events] == [1.0, 2.0, 3.0, 4.0]
    broken = write(tmp_path, "broken.jsonl", [(1, "alloc", 16, 8), (2, "alloc", 32, 8),
                                              (3, "free", 16, 8), (4, "free", 48, 8)])
    events = read_trace(broken)
    assert "before the trace began" in events.notes[0]
    assert [(e.t_us, e.action, e.addr) for e in events][:2] == [(1.0, "alloc", 48),
                                                                (1.0, "alloc", 16)]


OPERATOR_HEADER = ("Name,Size(KB),Allocation Time(us),Release Time(us),Active Release Time(us),"
                   "Duration(us),Active Duration(us),Allocation Total Allocated(MB),"
                   "Allocation Total Reserved(MB),Allocation Total Active(MB),Release Total "
                   "Allocated(MB),Release Total Reserved(MB),Release Total Active(MB),Stream Ptr,"
                   "Device Type\n")


def test_an_operator_buffer_of_zero_duration_is_freed_after_it_is_made(tmp_path):
    # its release sorted before its allocation: a free of a block "from before the trace",
    # live from the start (1.5 MiB where 1 MiB is right), in replay, report and plan
    path = tmp_path / "operator_memory.csv"
    path.write_text(OPERATOR_HEADER + "aten::a,1024.0,100.0,100.0,,0.0,,,,,,,,1,NPU:0\n"
                    "aten::b,512.0,200.0,300.0,,100.0,,,,,,,,1,NPU:0\n")
    runner = CliRunner()
    replayed = json.loads(runner.invoke(main, ["replay", str(path), "--allocator", "pool",
                                               "--json"]).output)[0]
    assert replayed["peak_allocated_bytes"] == 1 << 20 and replayed["notes"] == []
    report = runner.invoke(main, ["report", str(path)]).output
    assert "peak allocated 1.00 MiB" in report and "before the trace began" not in report
    assert json.loads(runner.invoke(main, ["plan", str(path), "--json"]).output)[
        "load_bytes"] == 1 << 20


def test_an_operator_buffer_is_named_by_its_line_not_an_address(tmp_path):
    # msprof's rows carry no address: the reader numbers each by its line, and the notes say so
    path = tmp_path / "operator_memory.csv"
    path.write_text(OPERATOR_HEADER + "aten::a,1024.0,100.0,300.0,,200.0,,,,,,,,1,NPU:0\n"
                    "aten::b,-2.0,200.0,,,,,,,,,,,1,NPU:0\n")
    notes = read_mended(str(path)).notes
    assert any("2048 B, the buffer on line 3" in note for note in notes), notes
    assert not any(" at 0x" in note for note in notes), notes


def test_a_snapshot_line_names_its_line_and_a_device_must_be_a_number(tmp_path):
    from npumem.trace.snapshot import load_data
    from npumem.trace import TraceFormatError

    def snapshot(*entries):
        path = tmp_path / "s.jsonl"
        path.write_text('{"npumem_snapshot": 1, "segments": []}\n'
                        + "".join(json.dumps(e) + "\n" for e in entries))
        return str(path)

    alloc = {"device": 0, "action": "alloc", "addr": 16, "size": 8, "time_us": 1}
    with pytest.raises(TraceFormatError, match=r"s\.jsonl:3: a trace entry's device must be a "
                                               r"whole number from 0 to 1023, got True"):
        load_data(snapshot(alloc, {**alloc, "device": True}))
    with pytest.raises(TraceFormatError, match=r"s\.jsonl:4: device_traces\[0\]\[2\]\.addr: "
                                               r"must be an integer"):
        load_data(snapshot(alloc, alloc, {**alloc, "addr": -5}))
    with pytest.raises(TraceFormatError, match=r"s\.jsonl:2: a trace entry must be an object"):
        load_data(snapshot([1, 2]))


def test_the_state_before_each_trace_is_said_for_each(tmp_path):
    import shutil
    from pathlib import Path

    source = Path(__file__).parent / "data" / "cuda_snapshots" / "encoder.pickle.gz"
    copy = tmp_path / "copy.pickle.gz"
    shutil.copy(source, copy)
    out = CliRunner().invoke(main, ["replay", str(source), str(copy)]).output
    assert out.count("was reserved before the trace began") == 2


SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
OTHERS = [SHARED / "traces" / "resnet_train.chrome.json.gz", SHARED / "traces" / "bert_train.jsonl.gz",
          SHARED / "formats" / "operator_memory.csv", SHARED / "formats" / "operator_memory_0.csv",
          SHARED / "formats" / "rmm_failure_midnight.csv", SHARED / "formats" / "rmm_pr341_old.csv",
          SHARED / "formats" / "memory_log.csv.dev0"]


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data not beside the repo")
@pytest.mark.parametrize("path", OTHERS, ids=lambda p: p.name)
def test_files_others_write_read_alike_in_every_command(path):
    """The profiler's Chrome trace, msprof's and torch_npu's operator_memory.csv and RMM's
    logs: replay, report and plan see one peak and say the same notes."""
    from npumem.units import format_size

    runner = CliRunner()
    replayed = json.loads(runner.invoke(main, ["replay", str(path), "--allocator", "pool",
                                               "--json"]).output)[0]
    planned = json.loads(runner.invoke(main, ["plan", str(path), "--json", "--time-limit",
                                              "1"]).output)
    report = runner.invoke(main, ["report", str(path)]).output
    peak = replayed["peak_allocated_bytes"]
    assert planned["load_bytes"] == peak > 0
    assert f"peak allocated {format_size(peak)}" in report
    mended = [n for n in replayed["notes"] if "trace" in n or "freed" in n]
    assert [n for n in planned["notes"] if n in mended] == mended
