"""Snapshots as users bring them, from a new user's trial: old pickle protocols, file names no
UTF-8 holds, dicts that are not snapshots, snapshots of several devices or with no trace, runs
with expandable segments, and an out-of-memory said as the trace entry it happened at."""

import gzip
import json
import pathlib
import pickle

from click.testing import CliRunner

from npumem.cli import main
from npumem.trace.snapshot import load_recording
from npumem.whatif.sweep import ReplayJob
from npumem.whatif.torch_tune import tune_recording

from .torch_recorder import record

DATA = pathlib.Path(__file__).parent / "data"
MiB = 1 << 20
WORKLOAD = [("alloc", i, (i % 3 + 1) * MiB) for i in range(6)] + [("free", 0), ("free", 2)]


def _write(tmp_path, name: str, value, protocol: int = 4) -> str:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(value, protocol=protocol))
    return str(path)


def _run(*args):
    result = CliRunner().invoke(main, [*args])
    assert "Traceback" not in result.output, result.output
    return result


def test_pickle_protocols_0_and_1_read_as_the_later_ones(tmp_path):
    snapshot = record(WORKLOAD)
    outputs = []
    for protocol in (0, 1, 4):
        result = _run("report", _write(tmp_path, f"p{protocol}.pickle", snapshot, protocol))
        assert result.exit_code == 0, result.output
        outputs.append(result.output.split("\n", 2)[2])         # (the title names the file)
    assert outputs[0] == outputs[1] == outputs[2]


def test_a_file_name_no_utf8_holds_still_makes_the_page(tmp_path):
    snapshot = record(WORKLOAD)
    for entry in snapshot["device_traces"][0]:
        entry["frames"] = [{"filename": "bad\udcff.py", "line": 1, "name": "f"}]
    page = tmp_path / "page.html"
    result = _run("report", _write(tmp_path, "s.pickle", snapshot), "--html", str(page))
    assert result.exit_code == 0 and page.read_text(encoding="utf-8").count("bad?.py")


def test_a_dict_that_is_not_a_snapshot_is_refused_naming_its_keys(tmp_path):
    path = _write(tmp_path, "foo.pickle", {"foo": 1})
    for args in (("report", path), ("replay", path), ("convert", path, str(tmp_path / "x.pickle"))):
        result = _run(*args)
        assert result.exit_code == 2 and "not a memory snapshot" in result.output
        assert "'foo'" in result.output
    assert not (tmp_path / "x.pickle").exists()
    for protocol in (0, 1, 4):                    # a list, in any protocol: not a snapshot
        result = _run("report", _write(tmp_path, f"l{protocol}.pickle", [1, 2], protocol))
        assert result.exit_code == 2 and "not a memory snapshot" in result.output, result.output


def test_the_other_devices_of_a_snapshot_are_named_when_one_is_replayed(tmp_path):
    snapshot = record(WORKLOAD)
    other = record(WORKLOAD[:3])
    for segment in other["segments"]:
        segment["device"] = 1
    snapshot["segments"] += other["segments"]
    snapshot["device_traces"].append(other["device_traces"][0])
    path = _write(tmp_path, "two.pickle", snapshot)
    assert load_recording(path).read_notes == [
        "device 0 replayed; the snapshot also records device(s) 1 (`npumem report` shows every "
        "device)"]
    assert load_recording(path, device=1).read_notes == []
    assert "also records device(s) 1" in _run("replay", path).output


def test_a_snapshot_without_a_trace_shows_what_is_live_at_the_dump_by_site(tmp_path):
    snapshot = record(WORKLOAD)
    snapshot["device_traces"] = [[]]
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            block["frames"] = [{"filename": "train.py", "line": 7, "name": "build"}]
    output = _run("report", _write(tmp_path, "s.pickle", snapshot)).output
    live = sum(block["requested_size"] for segment in snapshot["segments"]
               for block in segment["blocks"] if block["state"] == "active_allocated")
    assert "Live at the dump" in output and "train.py:7" in output
    assert f"{live / MiB:.2f} MiB in      4 allocation(s)" in output


def test_a_run_with_expandable_segments_is_also_tuned_without_them(tmp_path):
    path = _write(tmp_path, "e.pickle", record(WORKLOAD, "expandable_segments:True"))
    tuning = tune_recording(load_recording(path), workers=1)
    described = [c.config.describe() for c in tuning.candidates]
    assert len(set(described)) == len(described)
    assert tuning.candidates[0].as_recorded and described[0] == "expandable_segments:True"
    assert "" in described                              # PyTorch's defaults
    output = _run("tune", path).output
    assert "expandable_segments:True (as recorded)" in output
    assert "(PyTorch's default settings)" in output


def test_a_pool_replay_of_a_snapshot_says_the_trace_entry_it_ran_out_at(tmp_path):
    path = tmp_path / "gpt_train.pickle"
    path.write_bytes(gzip.decompress((DATA / "cuda_snapshots" / "gpt_train.pickle.gz")
                                     .read_bytes()))
    result = ReplayJob(str(path), "pool", memory=100 * MiB).run()
    entry = load_recording(str(path)).entries[result.oom["index"]]
    assert entry["action"] == "alloc" and entry["size"] == result.oom["requested"]


def test_a_device_smaller_than_what_the_trace_began_with_is_said(tmp_path):
    snapshot = record(WORKLOAD)
    snapshot["device_traces"][0] = snapshot["device_traces"][0][4:]     # begins mid-run
    result = _run("replay", "--memory", "1MiB", _write(tmp_path, "s.pickle", snapshot))
    assert "smaller than the" in result.output and "had reserved before the trace" in result.output


def test_rows_that_count_events_differently_say_how(tmp_path):
    path = _write(tmp_path, "s.pickle", record(WORKLOAD))
    output = _run("replay", "--allocator", "pool,torch", path).output
    assert output.count("the torch model counts every trace entry") == 1
    rows = [line.split() for line in output.splitlines() if line.startswith("s.pickle")]
    assert [row[1] for row in rows] == ["pool", "torch"] and rows[0][2] != rows[1][2]


def test_an_allocation_no_device_could_hold_is_refused_not_replayed(tmp_path):
    """A 2**63-byte block that succeeded: replay and tune said it fit (the model has no limit
    unless told one); now the file is refused, naming the entry. A refused request may ask for
    anything: a recorded OOM of 2**63 bytes still replays."""
    snapshot = record(WORKLOAD)
    trace = snapshot["device_traces"][0]
    index = next(i for i, e in enumerate(trace) if e["action"] == "alloc")
    addr = trace[index]["addr"]
    for entry in trace:
        if entry["addr"] == addr and not entry["action"].startswith("segment"):
            entry["size"] = 1 << 63
    path = _write(tmp_path, "huge.pickle", snapshot)
    for command in ("replay", "tune", "plan"):
        result = _run(command, path)
        assert result.exit_code == 2, result.output
        assert f"entry {index}: an allocation of" in result.output
        assert "(9223372036854775808 bytes)" in result.output and "damaged" in result.output
    result = _run("report", path)                       # the file as it is, with a warning
    assert result.exit_code == 0 and f"note: device 0, entry {index}: an allocation" in \
        result.output
    asked = record(WORKLOAD)
    asked["device_traces"][0].append({"action": "oom", "addr": 0, "size": 1 << 63, "stream": 0,
                                      "device_free": 0, "time_us": 10**6, "frames": []})
    asked_path = _write(tmp_path, "asked.pickle", asked)
    result = _run("replay", asked_path)
    assert result.exit_code == 0, result.output
    result = _run("tune", asked_path)                   # (expandable segments said 1.13 TiB)
    assert "the run asks for 8.00 EiB live at once, more than any device holds" in \
        result.output, result.output


def test_a_check_under_other_settings_says_its_figures_stop_at_the_divergence(tmp_path):
    path = _write(tmp_path, "s.pickle", record(WORKLOAD))
    result = _run("replay", "--check", path, "--set", "expandable_segments=True")
    assert result.exit_code == 1 and "MISMATCH" in result.output
    assert "(up to entry " in result.output and "--set departs from the recording" in \
        result.output


def test_a_divergence_in_the_pool_alone_names_both_pools(tmp_path):
    snapshot = record(WORKLOAD, entry_pool_ids=True)
    first = next(e for e in snapshot["device_traces"][0] if e["action"] == "segment_alloc")
    first["pool_id"] = (5, 0)                          # the model's segment is the default's
    result = _run("replay", "--check", _write(tmp_path, "s.pickle", snapshot))
    assert result.exit_code == 1
    recorded, model = [line for line in result.output.splitlines()
                       if line.strip().startswith(("recorded:", "model:"))]
    assert recorded.endswith("in pool (5, 0)") and model.endswith("in pool (0, 0)")


def test_a_device_larger_than_the_simulated_one_is_refused_for_the_pool(tmp_path):
    path = _write(tmp_path, "s.pickle", record(WORKLOAD))
    result = _run("replay", path, "--allocator", "torch,pool", "--memory", "100TiB")
    assert result.exit_code == 2 and "at most 8.00 TiB" in result.output
    assert _run("replay", path, "--allocator", "torch", "--memory", "100TiB").exit_code == 0


def test_a_replay_that_ran_out_gives_the_hit_rate_of_what_it_played(tmp_path):
    """The requests after the one refused counted as misses: 0.4% for a run that hit its cache
    93% of the time until it stopped."""
    reuse = [step for key in range(50) for step in (("alloc", key, MiB), ("free", key))]
    after = [step for key in range(100, 300) for step in (("alloc", key, MiB), ("free", key))]
    path = _write(tmp_path, "s.pickle", record(reuse + [("alloc", "big", 100 * MiB)] + after))
    result = _run("replay", path, "--memory", "60MiB", "--json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.output)[0]
    assert row["oom"] is not None and row["cache_hit_rate"] > 0.9


def test_a_real_recording_with_an_impossible_allocation_is_refused(tmp_path):
    """The same on a file PyTorch wrote (an H100 recording), one block's size bent."""
    snapshot = pickle.loads(gzip.decompress((DATA / "cuda_snapshots" / "mlp.pickle.gz")
                                            .read_bytes()))
    trace = snapshot["device_traces"][0]
    index = next(i for i, e in enumerate(trace) if e["action"] == "alloc" and i > 20)
    for entry in trace[index:]:
        if entry["addr"] == trace[index]["addr"] and not entry["action"].startswith("segment"):
            entry["size"] = 1 << 63
    path = _write(tmp_path, "bent.pickle", snapshot)
    result = _run("replay", path)
    assert result.exit_code == 2 and f"entry {index}: an allocation of 8.00 EiB" in result.output
    assert _run("report", path).exit_code == 0
