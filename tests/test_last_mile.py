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


@pytest.mark.parametrize("verb", ["replay", "tune"])
def test_a_bare_number_of_device_bytes_is_read_as_bytes(verb):
    from npumem.cli_sizes import device_memory

    assert device_memory("11198791680") == 11198791680
    assert device_memory("1048576") == 1 << 20
    result = _run(verb, SNAPSHOT, "--memory", "11198791680", *(
        ["--scheduler", "serial"] if verb == "tune" else []))
    assert "give the unit" not in result.output
    assert "Invalid value for --memory" not in result.output


@pytest.mark.parametrize("given, suggested", [("40", "40GiB"), ("16384", "16384MiB"),
                                              ("1.5", "1.5GiB")])
def test_a_small_bare_number_is_refused_with_the_unit_it_lacks(given, suggested):
    result = _run("replay", SNAPSHOT, "--memory", given)
    assert result.exit_code == 2
    assert f"{given} bytes is too small for a device" in result.output
    assert f"did you mean {suggested}?" in result.output
    assert "Traceback" not in result.output


def test_every_verb_takes_bytes_written_with_b(tmp_path):
    from npumem.cli_sizes import device_memory, size_option

    assert device_memory("17179869184B") == device_memory("16GiB") == 16 << 30
    assert device_memory("1048576 B") == 1 << 20
    assert size_option("1048576B", "--sample-bytes") == 1 << 20
    result = _run("demo", "--size", "4096B")            # 1024 float32 elements
    assert result.exit_code == 0, result.output
    assert _run("replay", SNAPSHOT, "--memory", "17179869184B").exit_code == 0


def test_tune_without_memory_on_a_run_that_finished_shows_savings_not_fits():
    result = _run("tune", "tests/data/cpu_recordings/mlp_12_steps.jsonl.gz", "--allocator",
                  "torch", "--scheduler", "serial")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "saving vs recorded" in lines[0] and "headroom" not in lines[0]
    assert "fits [" not in result.output
    # the recommendation once, as the last line, saying what to do
    assert lines[-1] == ("answer: keep the settings the run used: leave "
                         "PYTORCH_CUDA_ALLOC_CONF unset (the defaults)")
    assert "use: export" not in result.output and "recommended:" not in result.output


def test_tune_names_the_setting_once_as_a_line_to_run():
    result = _run("tune", "tests/data/cuda_snapshots/gpt_generate.pickle.gz", "--memory", "1GiB")
    assert result.exit_code == 0, result.output
    last = result.output.splitlines()[-1]
    assert last.startswith('answer: export PYTORCH_ALLOC_CONF="'), last
    assert result.output.count("export ") == 1


def test_a_default_setting_reads_as_what_to_do():
    from npumem.alloc.torch_model import parse_config
    from npumem.whatif.torch_tune import Candidate

    candidate = Candidate(parse_config(""), None, env="PYTORCH_ALLOC_CONF")
    assert candidate.instruction == "leave PYTORCH_ALLOC_CONF unset (the defaults)"
    candidate = Candidate(parse_config("roundup_power2_divisions:[256:1,>:8]"), None,
                          env="PYTORCH_CUDA_ALLOC_CONF")
    assert candidate.instruction == ('export PYTORCH_CUDA_ALLOC_CONF='
                                     '"roundup_power2_divisions:[256:1,>:8]"')


def test_one_rule_names_the_variable_in_tune_replay_and_the_recording():
    """The recordings were made with PyTorch 2.11, which reads PYTORCH_ALLOC_CONF first."""
    from npumem.alloc.torch_model.config import settings_variable
    from npumem.trace.snapshot import load_recording

    assert settings_variable("cuda", "2.10") == "PYTORCH_ALLOC_CONF"
    assert settings_variable("cuda", "2.13") == "PYTORCH_CUDA_ALLOC_CONF"
    assert settings_variable("cuda", "2.8") == "PYTORCH_CUDA_ALLOC_CONF"
    assert settings_variable("npu", "2.10") == "PYTORCH_NPU_ALLOC_CONF"
    assert load_recording(SNAPSHOT).settings_variable == "PYTORCH_ALLOC_CONF"
    replayed = _run("replay", SNAPSHOT, "--set", "expandable_segments=True")
    assert "PYTORCH_ALLOC_CONF=expandable_segments:True" in replayed.output
    assert "PYTORCH_CUDA_ALLOC_CONF" not in replayed.output
    npu = _run("replay", SNAPSHOT, "--allocator", "torch_npu", "--set",
               "expandable_segments=True")
    assert "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True" in npu.output


def test_a_leak_warning_at_reset_points_at_the_users_call():
    import warnings

    import npumem.acl as acl
    import npumem.runtime as rt
    from npumem.errors import LiveAllocationsWarning

    for reset in (lambda: rt.reset_device(0), lambda: acl.rt.reset_device(0)):
        rt.init()
        rt.set_device(0)
        rt.malloc(1024)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            reset()
        rt.finalize()
        leaks = [w for w in caught if issubclass(w.category, LiveAllocationsWarning)]
        assert leaks and leaks[0].filename == __file__, leaks[0].filename


def _json_snapshot(tmp_path, data, name="snap.json", indent=None):
    import json

    path = tmp_path / name
    path.write_text(json.dumps(data, indent=indent))
    return str(path)


def _snapshot_as_json_data():
    import gzip
    import pickle

    def plain(value):                      # what json.dump makes of a snapshot (tuples: lists)
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(item) for item in value]
        return value

    with gzip.open(SNAPSHOT, "rb") as handle:
        return plain(pickle.load(handle))


@pytest.mark.parametrize("indent", [None, 1])
def test_a_snapshot_written_as_json_is_read_as_its_pickle_is(tmp_path, indent):
    path = _json_snapshot(tmp_path, _snapshot_as_json_data(), indent=indent)
    as_json = _run("report", path)
    as_pickle = _run("report", SNAPSHOT)
    assert as_json.exit_code == 0, as_json.output
    assert as_json.output.splitlines()[2] == as_pickle.output.splitlines()[2]
    assert _run("replay", "--check", path).exit_code == 0


@pytest.mark.parametrize("data, says", [
    ({"segments": "x", "device_traces": []}, "at segments: must be a list, got 'x'"),
    ({"segments": [], "device_traces": 5}, "at device_traces: must be a list"),
    ({"segments": [], "device_traces": [[{"action": 5}]]}, "at device_traces[0][0]: "),
])
def test_a_json_snapshot_with_wrong_types_says_what_it_is_and_what_is_wrong(tmp_path, data, says):
    path = _json_snapshot(tmp_path, data)
    for verb in (["report", path], ["replay", path], ["tune", path]):
        result = _run(*verb)
        assert result.exit_code == 2, result.output
        assert f"error: {path}: a memory snapshot written as JSON; {says}" in result.output
        assert "action must be 'alloc' or 'free'" not in result.output
        assert "memory_stats() values" not in result.output


def test_an_empty_json_file_is_called_empty_by_every_verb(tmp_path):
    path = tmp_path / "empty.json"
    path.write_text("")
    for verb in (["report", str(path)], ["replay", str(path)], ["tune", str(path)]):
        result = _run(*verb)
        assert result.exit_code == 2
        assert result.output == f"error: {path}:1: the file is empty\n", result.output


def test_the_run_ends_naming_each_group_skipped_and_the_command_that_runs_it():
    from types import SimpleNamespace

    from .skip_summary import CPU_TORCH, summary_lines

    def skipped(reason):
        return SimpleNamespace(longrepr=("tests/x.py", 1, f"Skipped: {reason}"))

    reports = ([skipped("could not import 'torch': No module named 'torch'")] * 3
               + [skipped("../shared is absent"), skipped("../shared/data not beside the repo")]
               + [skipped("no CUDA device"), skipped("fits")])
    lines = summary_lines(reports)
    assert lines[0].startswith("3 skipped, needing PyTorch, which is not installed: " + CPU_TORCH)
    assert lines[1].startswith("2 skipped, reading real users' recordings in ../shared")
    assert any(line.startswith("1 skipped, needing a CUDA GPU") for line in lines)
    assert "1 skipped: fits" in lines
    assert summary_lines([]) == []


def _holes_by_hand(action, addr, size):
    """trace/mending.py's rule, address by address: the oracle of story_holes."""
    state = {}                                # addr -> ("live", position, size) or ("freed",)
    found = {name: [] for name in ("before", "double", "missed_at", "missed_block",
                                   "freed_at", "freed_block")}
    for i, (code, a, s) in enumerate(zip(action, addr, size)):
        story = state.get(a)
        if code == "alloc":
            if story and story[0] == "live":
                found["missed_at"].append(i)
                found["missed_block"].append(story[1])
            state[a] = ("live", i, s)
        else:
            if story and story[0] == "live" and s != story[2]:
                found["freed_at"].append(i)
                found["freed_block"].append(story[1])
            elif not story or story[0] != "live":
                found["double" if story else "before"].append(i)
            state[a] = ("freed",)
    return found


@pytest.mark.parametrize("seed", range(4))
def test_the_story_of_every_address_survives_its_move_out_of_the_hash(seed):
    """Freed addresses leave story_holes' hash for a sorted list (a trace that never reuses an
    address must not keep them all there): a free, an alloc or a double free long after still
    reads the address's story right."""
    import numpy as np

    from npumem.trace.snapshot.columns import ALLOC, FREE_COMPLETED, native

    if native is None:
        pytest.skip("the C reader is not built")
    rng = np.random.default_rng(seed)
    action, addr, size = [], [], []
    live = []
    for step in range(40_000):
        roll = rng.random()
        if roll < 0.5 or not live:                       # a fresh address, mostly
            a = int(rng.integers(0, 6_000)) * 64 if roll < 0.05 else (step + 10_000) * 64
            action.append("alloc"), addr.append(a), size.append(int(rng.integers(1, 4)))
            live.append((a, size[-1]))
        else:
            a, s = live.pop(int(rng.integers(0, len(live))))
            if rng.random() < 0.02:
                s += 1                                   # a free naming another size
            action.append("free"), addr.append(a), size.append(s)
            if rng.random() < 0.05:                      # freed again, later
                live.append((a, s))
    codes = np.array([ALLOC if x == "alloc" else FREE_COMPLETED for x in action], np.uint8)
    *found, _ = native.story_holes(codes, np.array(addr, np.uint64), np.array(size, np.uint64),
                                   ALLOC)
    got = [np.frombuffer(f, dtype=np.int64).tolist() for f in found]
    want = _holes_by_hand(action, addr, size)
    assert got == [want[k] for k in ("before", "double", "missed_at", "missed_block",
                                     "freed_at", "freed_block")]
    assert got[1] and got[2]                            # the cases were met


def test_a_skip_that_says_its_own_remedy_is_shown_as_it_is():
    from types import SimpleNamespace

    from .skip_summary import summary_lines

    reason = "set NPUMEM_CUDA_TORCH_PYTHON to a Python whose torch is a CUDA build to compare"
    lines = summary_lines([SimpleNamespace(longrepr=("t.py", 1, f"Skipped: {reason}"))] * 2)
    assert lines == [f"2 skipped: {reason}"]
    lines = summary_lines([SimpleNamespace(longrepr=("t.py", 1, "Skipped: needs 4 devices"))])
    assert lines[0].startswith("1 skipped, needing a CUDA GPU")


def test_a_json_snapshot_too_large_to_read_whole_says_to_save_the_pickle(tmp_path, monkeypatch):
    from npumem.trace.snapshot import json_dict

    monkeypatch.setattr(json_dict, "JSON_LIMIT", 1000)
    path = _json_snapshot(tmp_path, _snapshot_as_json_data())
    result = _run("report", path)
    assert result.exit_code == 2
    assert "a memory snapshot written as JSON, of more than 1000 B" in result.output
    assert "torch.cuda.memory._dump_snapshot" in result.output


def test_a_setting_that_reserves_more_reads_as_more_not_a_negative_saving():
    result = _run("tune", "tests/data/cuda_snapshots/lstm.pickle.gz")
    assert result.exit_code == 0, result.output
    assert "2.00 MiB more" in result.output and "-2.00 MiB" not in result.output
