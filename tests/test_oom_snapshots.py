"""Snapshots of runs that died: every command reads PyTorch's `oom` entry, the device's limit is
inferred from it, and tune judges each setting on the recorded part and on the run played on
from what the recording repeats, recommending only what survives."""

from __future__ import annotations

import os
import pickle

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.whatif.extend import extend
from npumem.trace.snapshot import load_recording, recording_from_data
from npumem.whatif.torch_replay import capacity_bounds, replay_file, replay_recording
from npumem.whatif.torch_tune import tune_recording

from .capped_recordings import capped, truth
from .torch_recorder import record

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
STACK = [{"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py",
          "line": 125, "name": "forward"},
         {"filename": "/home/user/train.py", "line": 42, "name": "train_step"},
         {"filename": "/home/user/train.py", "line": 90, "name": "<module>"}]


def _stranded(tmp_path):
    """Freed space stranded in a partly used segment: 10 MiB asked with 14 MiB cached."""
    steps = [("alloc", 0, 6 * MiB), ("alloc", 1, 6 * MiB), ("alloc", 2, 6 * MiB), ("free", 0),
             ("free", 2), ("alloc", 3, 12 * MiB), ("alloc", 4, 10 * MiB)]
    snapshot = record(steps, capacity=40 * MiB)
    oom = snapshot["device_traces"][0][-1]
    assert oom["action"] == "oom" and "addr" not in oom and oom["device_free"] == 8 * MiB
    oom["frames"] = STACK
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    return path


def _loop(steps: int, temporary, capacity: int, settings: str = "") -> dict:
    """A training loop: 40 MiB of weights, four activations and a temporary per step."""
    workload, key = [("alloc", "weights", 40 * MiB)], 0
    for step in range(steps):
        keys = []
        for layer in range(4):
            workload.append(("alloc", key, (3 + layer) * MiB))
            keys.append(key)
            key += 1
        workload += [("alloc", "tmp", temporary(step)), ("free", "tmp")]
        workload += [("free", k) for k in reversed(keys)]
    return record(workload, settings, capacity=capacity)


def _until_oom(snapshot: dict) -> dict:
    """What an OOM observer dumps: the trace ends at the oom entry."""
    trace = snapshot["device_traces"][0]
    cut = next(i for i, e in enumerate(trace) if e["action"] == "oom")
    return dict(snapshot, device_traces=[trace[:cut + 1]])


@pytest.mark.parametrize("args", [["report"], ["replay"], ["replay", "--allocator", "torch"],
                                  ["tune"], ["tune", "--json"], ["replay", "--check"]])
def test_every_verb_reads_a_real_oom_entry_and_shows_it(tmp_path, args):
    path = _stranded(tmp_path)
    result = CliRunner().invoke(main, [*args, str(path)])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    if "--json" not in args and args != ["replay"]:
        assert "out of memory at" in result.output
    if args[0] in ("report", "tune") and "--json" not in args:
        assert "asked for 10.00 MiB" in result.output and "8.00 MiB free" in result.output
        assert "14.00 MiB reserved but unallocated" in result.output
        assert "largest cached block the request could use was 8.00 MiB" in result.output
        assert "at /home/user/train.py:42 in train_step" in result.output


def test_convert_and_diff_read_an_oom_snapshot(tmp_path):
    path = _stranded(tmp_path)
    for target in ("copy.pickle", "copy.jsonl", "events.jsonl.gz", "log.csv"):
        converted = CliRunner().invoke(main, ["convert", str(path), str(tmp_path / target)])
        assert converted.exit_code == 0, converted.output
        assert "out of memory at trace entry 10" in converted.output
    copy = tmp_path / "copy.pickle"
    assert pickle.loads(copy.read_bytes()) == pickle.loads(path.read_bytes())
    diffed = CliRunner().invoke(main, ["diff", str(path), str(copy)])
    assert diffed.exit_code == 0 and "out of memory at trace entry 10" in diffed.output


def test_a_full_device_gives_the_exact_limit():
    snapshot = record([("alloc", 0, 30 * MiB), ("alloc", 1, 30 * MiB)], capacity=50 * MiB)
    recording = recording_from_data(snapshot)
    bounds = capacity_bounds(recording, 0)
    assert bounds.device_full and bounds.exact and bounds.low == 50 * MiB


@pytest.mark.parametrize("name", ["mlp", "lstm"])
def test_a_memory_fraction_gives_a_range_and_the_run_reproduces(name):
    path = f"tests/data/cuda_snapshots/{name}.pickle.gz"
    full = replay_file(path)
    cap = (full.peak_allocated_bytes + full.peak_reserved_bytes) // 2
    recording = recording_from_data(capped(path, cap, "fraction"), path)
    bounds = capacity_bounds(recording, recording.start_state().reserved)
    assert not bounds.device_full and bounds.low <= cap <= bounds.high
    replayed = replay_recording(recording, check=True)
    assert replayed.oom is not None and replayed.divergence is None
    assert replayed.oom["index"] == len(recording.entries) - 1


def test_a_loop_that_dies_is_played_on_and_only_a_survivor_is_recommended(tmp_path):
    # each step's temporary grows with its step until a cached segment cannot serve it
    def temporary(step):
        return (25 + 15 * step) * MiB

    died = _until_oom(_loop(6, temporary, 150 * MiB))
    recording = recording_from_data(died, "loop")
    extension, _ = extend(recording)
    assert extension is not None and extension.period == 10 and not extension.exact
    tuning = tune_recording(recording)
    assert tuning.memory == 150 * MiB and tuning.died_at == len(recording.entries) - 1
    assert all(c.basis == "extended" for c in tuning.candidates)
    assert not tuning.recorded.finishes
    for candidate in tuning.candidates:      # what the played-on run says holds for the run
        whole = _loop(6, temporary, 150 * MiB, candidate.config.describe())
        dies = any(e["action"] == "oom" for e in whole["device_traces"][0])
        if candidate.finishes:
            assert not dies, candidate.config.describe()
    assert tuning.answer().startswith(("answer: set", "answer: none fits"))
    if tuning.best is None:
        assert "needs about" in tuning.answer() and tuning.batch is not None
        assert tuning.batch.scale < 1


def test_where_no_setting_fits_tune_says_by_how_much(tmp_path):
    died = _until_oom(_loop(5, lambda step: 60 * MiB if step == 4 else 20 * MiB, 100 * MiB))
    path = tmp_path / "died.pickle"
    path.write_bytes(pickle.dumps(died))
    result = CliRunner().invoke(main, ["tune", str(path)])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("answer: none fits on 100.00 MiB: the run, played on, needs about"), last
    assert "short by:" in result.output and "recommended:" not in result.output
    assert "played on for 3 more periods" in result.output


def test_what_a_capped_run_needs_is_never_less_than_the_cap_it_died_under():
    """Under a memory fraction, expandable segments' retry (unmap, then map the request) can
    need more than the run reserves with no cap: the bytes 'needed' were once the uncapped
    peak, 54 MiB on a 57 MiB cap, and tune said both '0 B short' and 'none fits'."""
    recording = load_recording(os.path.join(HERE, "data", "cuda_oom_h200", "snapshots",
                                            "gpt_generate", "57MiB_default.pickle.gz"))
    tuning = tune_recording(recording)
    assert tuning.best is None and tuning.worth_trying is None
    for candidate in tuning.candidates:
        assert candidate.needed is None or candidate.needed > tuning.memory, candidate.name
        assert replay_recording(recording, candidate.config, allowed=candidate.needed).oom \
            is None if candidate.needed else True


def test_a_run_that_died_before_repeating_is_not_recommended_blindly(tmp_path):
    path = _stranded(tmp_path)
    tuning = tune_recording(load_recording(str(path)))
    assert tuning.extension is None and tuning.best is None
    assert tuning.worth_trying is not None and tuning.worth_trying.config.expandable_segments
    assert tuning.answer().startswith("answer: none certain on 40.00 MiB; worth a try: "
                                      "export PYTORCH_CUDA_ALLOC_CONF=\"expandable_segments:True\"")


@pytest.mark.parametrize("name", ["mlp", "lstm", "unet"])
def test_tune_on_a_capped_real_recording_agrees_with_the_whole_run(name):
    path = f"tests/data/cuda_snapshots/{name}.pickle.gz"
    full = replay_file(path)
    cap = (full.peak_allocated_bytes + full.peak_reserved_bytes) // 2 // MiB * MiB
    snapshot = capped(path, cap)
    if snapshot is None:
        pytest.skip("fits")
    tuning = tune_recording(recording_from_data(snapshot, path))
    truths = {c.config.describe(): truth(path, cap, c.config.describe()) for c in tuning.candidates}
    if tuning.best is not None:
        assert truths[tuning.best.config.describe()]          # the advice holds
    elif tuning.extension is not None:
        assert not any(truths.values())                       # none named: none fits
    wrong = [c.config.describe() for c in tuning.candidates
             if c.basis == "extended" and c.finishes != truths[c.config.describe()]]
    assert len(wrong) <= len(tuning.candidates) // 10, wrong


def test_unknown_actions_and_truncated_files_get_one_line_errors(tmp_path):
    snapshot = record([("alloc", 0, 5000)])
    snapshot["device_traces"][0].append({"action": "segment_teleport", "addr": 1, "size": 2})
    path = tmp_path / "odd.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    for verb in ("report", "replay", "tune", "convert"):
        args = [verb, str(path)] + ([str(tmp_path / "out.jsonl")] if verb == "convert" else [])
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert "device_traces[0][2].action: unknown action 'segment_teleport'" in result.output
    whole = pickle.dumps(_until_oom(_loop(3, lambda step: 5 * MiB, 60 * MiB)))
    cut = tmp_path / "cut.pickle"
    cut.write_bytes(whole[: len(whole) // 2])
    for verb in ("report", "replay", "tune"):
        result = CliRunner().invoke(main, [verb, str(cut)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1 and str(cut) in result.output


def test_a_trace_that_begins_mid_run_says_so():
    result = replay_file("tests/data/cuda_snapshots/mlp.pickle.gz")
    assert any("begins mid-run" in note for note in result.notes)


def test_candidates_replayed_in_worker_processes_give_the_same_verdicts(monkeypatch):
    from npumem.whatif import torch_tune

    path = "tests/data/cuda_snapshots/mlp.pickle.gz"
    full = replay_file(path)
    cap = (full.peak_allocated_bytes + full.peak_reserved_bytes) // 2 // MiB * MiB
    recording = recording_from_data(capped(path, cap), path)
    serial = tune_recording(recording, workers=1)
    monkeypatch.setattr(torch_tune, "PARALLEL_ENTRIES", 0)
    forked = tune_recording(recording, workers=2)
    assert forked.as_dict() == serial.as_dict()


def test_the_limit_an_oom_observer_was_told_makes_the_cap_exact(tmp_path):
    path = "tests/data/cuda_snapshots/lstm.pickle.gz"
    full = replay_file(path)
    cap = (full.peak_allocated_bytes + full.peak_reserved_bytes) // 2 // MiB * MiB
    snapshot = capped(path, cap, "fraction")
    guessed = tune_recording(recording_from_data(snapshot, path))
    snapshot["npumem_oom"] = {"device": 0, "alloc_size": 2 * MiB, "allowed": cap,
                              "device_free": 70 << 30, "device_total": 80 << 30}
    told = tune_recording(recording_from_data(snapshot, path))
    assert told.memory == cap and told.bounds.exact and guessed.memory <= cap
    judged = [c for c in told.candidates if c.basis == "extended"]
    assert [c.finishes for c in judged] == [
        truth(path, cap, c.config.describe(), "fraction") for c in judged]
    snapshot["npumem_oom"] = dict(snapshot["npumem_oom"], allowed="lots")
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(pickle.dumps(snapshot))
    result = CliRunner().invoke(main, ["tune", str(bad)])
    assert result.exit_code == 2 and "npumem_oom.allowed: must be an integer" in result.output


def test_dump_snapshot_on_oom_keeps_what_the_observer_was_told(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from npumem.profile.torch_memory import dump_snapshot_on_oom

    observers = []
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", observers.append,
                        raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: type("Props", (), {"total_memory": 80 << 30}))
    monkeypatch.setattr(torch.cuda.memory, "_snapshot",
                        lambda: record([("alloc", 0, 30 * MiB), ("alloc", 1, 30 * MiB)],
                                       capacity=50 * MiB))
    path = tmp_path / "oom_snapshot.pickle"
    dump_snapshot_on_oom(str(path))
    observers[0](0, 20 * MiB, 48 << 30, 31 << 30)          # as c10 calls it: a fraction's limit
    observers[0](0, 20 * MiB, 48 << 30, 31 << 30)          # a second OOM keeps the first dump
    kept = pickle.loads(path.read_bytes())
    assert kept["npumem_oom"] == {"device": 0, "alloc_size": 20 * MiB, "allowed": 48 << 30,
                                  "device_free": 31 << 30, "device_total": 80 << 30}
    assert load_recording(str(path)).limits["allowed"] == 48 << 30


def test_a_malformed_pool_id_is_refused_naming_it(tmp_path):
    snapshot = record([("alloc", 0, 5000)])
    snapshot["segments"][0]["segment_pool_id"] = (0, "graph")
    path = tmp_path / "pool.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    result = CliRunner().invoke(main, ["replay", "--check", str(path)])
    assert result.exit_code == 2 and "segments[0].segment_pool_id: must be a pair" in result.output
    snapshot["segments"][0]["segment_pool_id"] = (0, 0)
    snapshot["device_traces"][0][-1]["pool_id"] = [1]
    path.write_bytes(pickle.dumps(snapshot))
    result = CliRunner().invoke(main, ["tune", str(path)])
    assert result.exit_code == 2 and "device_traces[0][1].pool_id: must be a pair" in result.output


def test_the_html_report_opens_with_the_oom(tmp_path):
    path = _stranded(tmp_path)
    page = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", str(path), "--html", str(page)])
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert html.index("Out of memory</h2>") < html.index("allocated and reserved over time")
    assert "asked for 10.00 MiB" in html and "answer: none certain" in html


def test_the_line_to_set_names_the_variable_the_recording_pytorch_reads_first(tmp_path):
    snapshot = _until_oom(_loop(6, lambda step: (25 + 15 * step) * MiB, 150 * MiB))
    for entry in snapshot["device_traces"][0]:
        entry["user_metadata"] = ""             # as PyTorch 2.10 and 2.11 write every entry
    tuning = tune_recording(recording_from_data(snapshot, "loop"))
    assert all(c.line.startswith("PYTORCH_ALLOC_CONF") for c in tuning.candidates)
    for entry in snapshot["device_traces"][0]:
        entry["pool_id"] = (0, 0)               # 2.12 on: the CUDA name again, without a warning
    tuning = tune_recording(recording_from_data(snapshot, "loop"))
    assert all(c.line.startswith("PYTORCH_CUDA_ALLOC_CONF") for c in tuning.candidates)


def test_the_played_on_run_keeps_a_steady_loop_steady():
    # each step frees the gradient the step before it made: a block that outlives its step
    workload, previous = [("alloc", "weights", 30 * MiB)], None
    for step in range(6):
        workload += [("alloc", f"act{step}", 8 * MiB), ("alloc", f"tmp{step}", 3 * MiB),
                     ("free", f"tmp{step}")]
        if previous is not None:
            workload.append(("free", previous))
        workload += [("alloc", f"grad{step}", 5 * MiB), ("free", f"act{step}")]
        previous = f"grad{step}"
    workload.append(("alloc", "big", 500 * MiB))           # the request that fails
    died = _until_oom(record(workload, capacity=100 * MiB))
    recording = recording_from_data(died, "steady")
    extension, _ = extend(recording, steps=5)
    # the failed request takes the place of the step's first allocation, so each played-on
    # step asks for it again: the largest size that position had
    assert extension is not None and extension.period == 6 and not extension.exact
    played = extension.recording.entries[extension.played_from:]
    allocs = sum(e["action"] == "alloc" for e in played)
    frees = sum(e["action"] == "free_completed" for e in played)
    assert frees >= allocs - 2            # a step's allocations are freed a step later at most
    # every played-on free releases a live block, and the loop's live bytes stay bounded:
    # the model with no limit reserves no more than the recording plus the failed request
    whole = replay_recording(extension.recording, capacity=-1)
    assert whole.unmatched_frees == 0
    assert whole.peak_allocated_bytes <= 30 * MiB + 8 * MiB + 3 * MiB + 2 * 5 * MiB + 500 * MiB


def test_tune_questions_that_make_no_sense_get_sentences(tmp_path):
    path = str(_stranded(tmp_path))
    for memory in ("0", "-5GiB", "abc"):
        result = CliRunner().invoke(main, ["tune", path, "--memory", memory])
        assert result.exit_code == 2 and "--memory" in result.output, result.output
    mid_run = "tests/data/cuda_snapshots/mlp.pickle.gz"           # 66 MiB reserved before it
    result = CliRunner().invoke(main, ["tune", mid_run, "--memory", "10MiB"])
    assert result.exit_code == 2 and "less than the 66.00 MiB PyTorch had reserved" in result.output
    result = CliRunner().invoke(main, ["tune", path, "--allocator", "pool", "--memory", "1GiB"])
    assert result.exit_code == 2 and "npumem's pool is tuned on 64 GiB" in result.output
    result = CliRunner().invoke(main, ["tune", path, "--steps", "1000"])
    assert result.exit_code == 2 and "--steps" in result.output


def test_a_plain_trace_with_memory_is_tuned_on_that_device(tmp_path):
    trace = tmp_path / "run.jsonl"
    trace.write_text("".join(f'{{"t_us": {i}, "action": "alloc", "addr": {4096 * (i + 1)}, '
                             f'"size": {30 * MiB}}}\n' for i in range(4)))
    result = CliRunner().invoke(main, ["tune", str(trace), "--memory", "100MiB", "--json"])
    assert result.exit_code == 0, result.output
    import json
    answer = json.loads(result.output)
    assert answer["memory_bytes"] == 100 * MiB and answer["recommended"] is None
    assert answer["answer"].startswith("answer: none fits on 100.00 MiB")
    assert "at least 120.00 MiB for its live tensors" in answer["answer"]


def test_convert_says_what_a_lossy_format_leaves_behind(tmp_path):
    path = _stranded(tmp_path)
    result = CliRunner().invoke(main, ["convert", str(path), str(tmp_path / "log.csv")])
    assert result.exit_code == 0 and "holds allocations and frees only" in result.output
    result = CliRunner().invoke(main, ["convert", str(path), str(tmp_path / "all.jsonl")])
    assert result.exit_code == 0 and "holds allocations and frees only" not in result.output


def test_why_a_run_that_died_was_not_played_on(tmp_path):
    died = _until_oom(_loop(6, lambda step: (25 + 15 * step) * MiB, 150 * MiB))
    recording = recording_from_data(died, "loop")
    assert extend(recording, steps=0) == (None, "--steps 0: the run was not played on")
    tuning = tune_recording(recording, steps=0)
    assert any("not played on: --steps 0" in line for line in tuning.answer_lines())
    rows = tuning.as_dict()["candidates"]
    assert {row["verdict"] for row in rows} == {"recorded"}
    # a forward pass that dies: its layers repeat, but they only allocate, so the step is
    # played on for one more of them only
    layers = [("alloc", "weights", 10 * MiB)] + [("alloc", f"a{i}", 4 * MiB) for i in range(40)]
    grows = recording_from_data(_until_oom(record(layers, capacity=100 * MiB)), "forward")
    extension, _ = extend(grows)
    assert extension.growing and extension.steps == 1 and extension.period == 4
    assert "free little of what they take" in extension.describe()


def test_an_oom_the_program_caught_is_judged_on_the_whole_run():
    snapshot = _loop(7, lambda step: (25 + 15 * step) * MiB, 150 * MiB)   # goes on after it
    tuning = tune_recording(recording_from_data(snapshot, "caught"))
    assert tuning.died_at is None and tuning.caught_at is not None and tuning.extension is None
    assert any("went on (the program caught it)" in line for line in tuning.answer_lines())


def test_the_device_that_ran_out_is_the_one_read(tmp_path):
    quiet = record([("alloc", 0, 5 * MiB)])["device_traces"][0]
    died = _until_oom(_loop(3, lambda step: 60 * MiB, 100 * MiB))
    snapshot = dict(died, device_traces=[quiet, died["device_traces"][0]],
                    segments=[dict(s, device=1) for s in died["segments"]])
    path = tmp_path / "two.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    assert load_recording(str(path)).device == 1
    result = CliRunner().invoke(main, ["replay", str(path)])
    assert result.exit_code == 0 and "out of memory at trace entry" in result.output


def test_a_cap_met_before_anything_was_held_is_not_called_exact():
    snapshot = {"segments": [], "device_traces": [[
        {"action": "oom", "device_free": 30 * MiB, "size": 4 * MiB, "stream": 0, "time_us": 1}]]}
    bounds = capacity_bounds(recording_from_data(snapshot), 0)
    assert not bounds.exact and "failed before holding anything" in bounds.caveat()


def test_a_setting_past_a_memory_fraction_by_its_pages_is_not_said_to_spare_negative_bytes():
    """Expandable segments under a memory fraction map whole pages for the bytes the fraction
    counted: a setting can finish a few MiB over the cap, and the answer says so in words
    (it said "with -7.00 MiB to spare")."""
    died = "tests/data/cuda_oom_h200/snapshots/cnn_sgd/153MiB_default.pickle.gz"
    tuning = tune_recording(load_recording(died), workers=1)
    assert tuning.worth_trying is not None and tuning.worth_trying.headroom < 0
    answer = tuning.answer()
    assert "over the limit in whole pages mapped" in answer and "-7.00 MiB" not in answer
    table = CliRunner().invoke(main, ["tune", died]).output      # its column says why, once
    assert "-7.00 MiB" in table and table.count("a negative headroom is a fit under a memory "
                                                "fraction") == 1
