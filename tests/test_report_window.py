"""`npumem report --window START:END` (profile/window.py): a part of a recording, read with what
was live when it began."""

from __future__ import annotations

import gzip
import json
import os
import pickle

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.profile.analysis import analyze_snapshot, start_of
from npumem.profile.window import WindowError, parse_window, windowed

SNAPSHOT = os.path.join(os.path.dirname(__file__), "data", "cuda_snapshots", "cnn_sgd.pickle.gz")


def _snapshot() -> dict:
    with gzip.open(SNAPSHOT) as handle:
        return pickle.load(handle)


def _live_totals(snapshot: dict) -> list[int]:
    """Bytes allocated after each entry of device 0's trace, walked from the trace's start."""
    live = {entry["addr"]: entry["size"] for entry in start_of(snapshot, 0)[0]}
    totals, total = [], sum(live.values())
    for entry in snapshot["device_traces"][0]:
        if entry["action"] == "alloc":
            live[entry["addr"]] = entry["size"]
            total += entry["size"]
        elif entry["action"] == "free_requested" and entry["addr"] in live:
            total -= live.pop(entry["addr"])
        totals.append(total)
    return totals


@pytest.mark.parametrize("text, expected", [
    ("1000:5000", (1000, 5000, False)), ("1000:", (1000, None, False)), (":5", (None, 5, False)),
    ("90s:120s", (90e6, 120e6, True)), ("1500ms:", (1500e3, None, True)),
    (":2.5s", (None, 2.5e6, True)), ("250us:1min", (250.0, 60e6, True)),
])
def test_windows_read(text, expected):
    window = parse_window(text)
    assert (window.start, window.end, window.in_time) == expected


@pytest.mark.parametrize("text, says", [
    ("abc", "is not START:END"), (":", "is not START:END"), ("1:2:3", "is not START:END"),
    ("5:3", "END must be after START"), ("4:4", "END must be after START"),
    ("1.5:", "an entry number is whole"), ("1s:200", "mixes an entry number with a time"),
    ("-1:5", "neither an entry number nor a time"), ("3h:", "neither an entry number"),
])
def test_bad_windows_say_what_is_wrong(text, says):
    with pytest.raises(WindowError, match=says):
        parse_window(text)


@pytest.mark.parametrize("first, last", [(0, 1500), (1500, 3000), (2500, None), (100, 101)])
def test_a_window_peaks_where_the_whole_run_did_in_it(first, last):
    snapshot = _snapshot()
    entries = snapshot["device_traces"][0]
    end = len(entries) if last is None else last
    text = f"{first}:{'' if last is None else last}"
    cut = windowed(snapshot, parse_window(text))
    assert cut["device_traces"][0] == entries[first:end]
    (device,) = analyze_snapshot(cut)
    totals = _live_totals(snapshot)
    before = totals[first - 1] if first else sum(e["size"] for e in start_of(snapshot, 0)[0])
    expected = max([before] + totals[first:end])
    assert device.peak_allocated == expected
    assert sum(site.bytes for site in device.at_peak) == expected    # and who holds it
    assert (cut["segments"] == snapshot["segments"]) == (end == len(entries))


def test_a_time_window_takes_the_entries_of_its_times():
    snapshot = _snapshot()
    entries = snapshot["device_traces"][0]
    origin = entries[0]["time_us"]
    middle = (entries[-1]["time_us"] - origin) / 2
    cut = windowed(snapshot, parse_window(f"{middle / 1e3:.3f}ms:"))
    kept = cut["device_traces"][0]
    assert kept and kept[-1] is entries[-1]
    assert all(e["time_us"] - origin >= middle - 1 for e in kept)
    assert entries[len(entries) - len(kept) - 1]["time_us"] - origin < middle


def test_step_marks_move_with_their_entries():
    trace = [{"action": "alloc", "addr": i, "size": 512, "time_us": float(i), "frames": []}
             for i in range(10)]
    marks = [{"name": "npumem.step", "stage": "START", "device": 0, "time_us": float(i),
              "npumem_entry": i} for i in (2, 5, 8)]
    snapshot = {"segments": [], "device_traces": [trace], "external_annotations": marks}
    cut = windowed(snapshot, parse_window("4:9"))
    assert [m["npumem_entry"] for m in cut["external_annotations"]] == [1, 4]
    state = cut["npumem_start"][0]
    assert [e["addr"] for e in state[0]] == [0, 1, 2, 3] and state[1] == 0


def test_the_command_line(tmp_path):
    runner = CliRunner()
    whole = runner.invoke(main, ["report", SNAPSHOT])
    part = runner.invoke(main, ["report", SNAPSHOT, "--window", "2000:"])
    assert part.exit_code == 0, part.output
    assert "window 2000:" in part.output and "entries 2,000–4,281 of 4,282" in part.output
    assert "2,945 events" in whole.output and "1,527 events" in part.output   # a free once
    bad = runner.invoke(main, ["report", SNAPSHOT, "--window", "5:3"])
    assert bad.exit_code == 2 and "END must be after START" in bad.output
    outside = runner.invoke(main, ["report", SNAPSHOT, "--window", "9000000:"])
    assert outside.exit_code == 2 and "the recording has 4,282 entries over 7.193 s" in outside.output
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"allocated_bytes.all.current": 0}))
    refused = runner.invoke(main, ["report", str(stats), "--window", "0:10"])
    assert refused.exit_code == 2 and "--window reads snapshots and traces" in refused.output
    for result in (bad, outside, refused):
        assert "Traceback" not in result.output


def test_a_window_ending_early_says_fragmentation_is_not_known(tmp_path):
    runner = CliRunner()
    early = runner.invoke(main, ["report", SNAPSHOT, "--window", "0:2000", "--html",
                                 str(tmp_path / "w.html")])
    assert early.exit_code == 0, early.output
    assert "Fragmentation (now):\n  not known for a window that ends before" in early.output
    assert "nothing is reserved" not in early.output
    assert "no segment data" not in early.output          # reserved is known: segments were
    page = (tmp_path / "w.html").read_text()
    assert "Fragmentation: not known for a window" in page and "nothing is reserved" not in page
    late = runner.invoke(main, ["report", SNAPSHOT, "--window", "2000:"])
    assert "fragmentation" in late.output and "not known for a window" not in late.output


def test_choosing_a_device_does_not_move_a_time_window(tmp_path):
    snapshot = _snapshot()
    trace = snapshot["device_traces"][0]
    later = [{**entry, "time_us": entry["time_us"] + 250_000} for entry in trace]
    two = {**snapshot, "device_traces": [later, trace],
           "segments": snapshot["segments"] + [{**s, "device": 1} for s in snapshot["segments"]]}
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(two))
    runner = CliRunner()
    both = runner.invoke(main, ["report", str(path), "--window", "0ms:10ms"])
    one = runner.invoke(main, ["report", str(path), "--device", "1", "--window", "0ms:10ms"])
    assert both.exit_code == one.exit_code == 0, one.output
    assert "device 0: no entries; device 1: entries 0–5 of 4,282" in both.output
    assert "device 0: no entries; device 1: entries 0–5 of 4,282" in one.output
    assert "device 1: 6 events" in one.output
    missing = runner.invoke(main, ["report", str(path), "--device", "3", "--window", "0:10"])
    assert missing.exit_code == 2 and "its devices: 0, 1" in missing.output
