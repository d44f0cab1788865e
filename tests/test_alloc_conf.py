"""Allocator settings as PyTorch reads them: each allocator of `npumem replay` takes the keys it
has, every text is checked as PyTorch and torch_npu check it (their errors, their order of
environment variables), combinations that do nothing or that torch_npu refuses are named, and
a snapshot replays through the torch model unless --allocator says otherwise."""

import json
import pathlib
import pickle
import re
import shlex
import subprocess
import sys

import pytest
from click.testing import CliRunner

from npumem.alloc.settings import parse_settings, settings_warnings, split_pairs
from npumem.alloc.torch_model.config import (config_warnings, env_names, from_snapshot,
                                             parse_config, read_env)
from npumem.cli import main
from npumem.errors import InvalidParamError
from npumem.whatif.sweep import split_for, sweep_settings

from .torch_recorder import record

MiB = 1 << 20
ROOT = pathlib.Path(__file__).resolve().parents[1]
PYTORCH_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_NPU_ALLOC_CONF",
                "PYTORCH_HIP_ALLOC_CONF", "NPUMEM_ALLOC_CONF")


@pytest.fixture(autouse=True)
def _no_settings_in_the_environment(monkeypatch):
    for name in PYTORCH_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def trace(tmp_path):
    """A JSONL trace whose sizes vary a little each step (rounding and splits show)."""
    events, t = [], 0
    for step in range(6):
        for i, size in enumerate([3000, 5 * MiB + 7, 700_000, 25 * MiB + step * 4096]):
            t += 1
            events.append({"t_us": t, "action": "alloc", "addr": 100 * step + i + 1, "size": size})
        for i in range(4):
            t += 1
            events.append({"t_us": t, "action": "free", "addr": 100 * step + i + 1, "size": 0})
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in events) + "\n")
    return str(path)


def _snapshot(tmp_path, name="snap.pickle", text=None):
    snapshot = record([("alloc", 0, 5000), ("alloc", 1, 30 * MiB), ("free", 0),
                       ("alloc", 2, 3 * MiB), ("free", 1)])
    if text is not None:
        snapshot["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = text
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snapshot))
    return str(path)


def _replay(*args):
    return CliRunner().invoke(main, ["replay", *args, "--scheduler", "serial"])


def _rows(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _refused(result, *words):
    """Exit 2 with one error line that says what a person needs; never a traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    for word in words:
        assert word in errors[0], errors[0]
    return errors[0]


# --- each allocator takes the keys it has ------------------------------------------------

def test_pytorch_list_value_goes_to_torch_and_the_pool_says_it_went_without(trace):
    """Issue 38 item 4.1: the per-size list is PyTorch's; the pool has one count for all."""
    rows = _rows(_replay(trace, "--json", "--set",
                         "roundup_power2_divisions=[256:1,512:2,1024:4,>:8]"))
    pool, torch = rows[0], rows[1]
    assert [r["allocator"] for r in rows] == ["pool", "torch", "device"]
    assert pool["settings"] == "defaults"
    assert any("pool ignores roundup_power2_divisions" in note for note in pool["notes"])
    assert torch["settings"].startswith("PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:[")
    result = _replay(trace, "--set", "roundup_power2_divisions=[256:1,512:2,1024:4,>:8]")
    assert result.exit_code == 0 and "note: pool ignores roundup_power2_divisions" in result.output


def test_a_key_one_allocator_has_applies_to_it_with_a_note_for_the_other(trace):
    rows = _rows(_replay(trace, "--json", "--set", "predictive=True",
                         "--set", "release_lock_on_cudamalloc=True"))
    assert "predictive:True" in rows[0]["settings"]
    assert "release_lock_on_cudamalloc" in rows[1]["settings"]
    assert "torch ignores predictive=True: not one of PyTorch's settings" in rows[1]["notes"]
    assert "pool ignores release_lock_on_cudamalloc=True: not one of its settings" in rows[0]["notes"]
    assert rows[2]["notes"] == []                 # the device has no settings to go without


def test_a_key_no_allocator_has_is_one_line_naming_the_keys(trace):
    line = _refused(_replay(trace, "--set", "expandable_segmets=True"),
                    "unknown key 'expandable_segmets'", "did you mean 'expandable_segments'",
                    "pool's keys:", "torch's keys:", "max_split_size_mb")
    assert "PyTorch stops at startup" in line
    _refused(_replay(trace, "--allocator", "torch", "--sweep", "x=1,2"), "unknown key 'x'",
             "roundup_power2_divisions")
    # a key of an allocator that is not replayed says which one to add
    _refused(_replay(_snapshot_path(trace), "--set", "predictive=True"),
             "predictive=True is for pool: add pool to --allocator")
    _refused(_replay(trace, "--allocator", "pool", "--set", "roundup_power2_divisions=[>:4]"),
             "one rounding count for every size", "add torch to --allocator")


def _snapshot_path(trace):
    return _snapshot(pathlib.Path(trace).parent)


def test_a_bad_value_for_a_key_an_allocator_has_is_an_error(trace):
    _refused(_replay(trace, "--set", "max_split_size_mb=10"), "pool", "greater than 20")
    _refused(_replay(trace, "--allocator", "torch", "--set", "max_split_size_mb=10"),
             "max_split_size_mb must be >= 20", "got 10")
    _refused(_replay(trace, "--allocator", "torch", "--set", "expandable_segments=true"),
             "True or False", "'true'", "PyTorch stops on it too")
    # PyTorch refuses 0 in the single-number form; the pool takes it (0: off)
    _refused(_replay(trace, "--sweep", "roundup_power2_divisions=0,4"),
             "torch:", "must be a power of 2", "got '0'")
    assert _replay(trace, "--allocator", "pool", "--sweep",
                   "roundup_power2_divisions=0,4").exit_code == 0


def test_sweeps_keep_pytorch_lists_whole(trace):
    rows = _rows(_replay(trace, "--json", "--allocator", "torch", "--sweep",
                         "roundup_power2_divisions=4,[256:1,>:8]"))
    assert [r["settings"].split("=", 1)[1] for r in rows] == [
        "roundup_power2_divisions:4", "roundup_power2_divisions:[256:1,>:8]"]
    assert split_pairs("a:[1:2,>:4],b=3") == [("a", "[1:2,>:4]"), ("b", "3")]
    assert sweep_settings("", ["roundup_power2_divisions=1,4"]) == [
        "roundup_power2_divisions:1", "roundup_power2_divisions:4"]
    texts, axes, notes = split_for(["pool", "torch"], ["expandable_segments=False"],
                                   ["roundup_power2_divisions=4,[>:8]"])
    assert texts == {"pool": "expandable_segments:False", "torch": "expandable_segments:False"}
    assert axes == {"pool": [], "torch": ["roundup_power2_divisions=4,[>:8]"]}
    assert [name for name, _ in notes] == ["pool"]


# --- a snapshot replays through the torch model --------------------------------------------

def test_a_snapshot_replays_through_the_torch_model_unless_asked(tmp_path, trace):
    snapshot = _snapshot(tmp_path)
    result = _replay(snapshot)
    assert result.exit_code == 0, result.output
    rows = [line.split()[1] for line in result.output.splitlines()[1:] if "snap.pickle " in line]
    assert rows == ["torch"]
    assert result.output.count("--allocator torch,pool,device") == 1
    everything = _rows(_replay(snapshot, "--json", "--allocator", "torch,pool,device"))
    assert [r["allocator"] for r in everything] == ["torch", "pool", "device"]
    assert not any("--allocator torch,pool,device" in n for r in everything for n in r["notes"])
    mixed = _rows(_replay(snapshot, trace, "--json"))       # other traces keep the default
    assert [(pathlib.Path(r["trace"]).name, r["allocator"]) for r in mixed] == [
        ("snap.pickle", "torch"), ("run.jsonl", "pool"), ("run.jsonl", "torch"),
        ("run.jsonl", "device")]


# --- checked as PyTorch checks it ------------------------------------------------------------

@pytest.mark.parametrize("text, words", [
    ("expandable_segmets:True", ["unknown key 'expandable_segmets'",
                                 "did you mean 'expandable_segments'", "max_split_size_mb"]),
    ("segment_size_mb:64", ["unknown key 'segment_size_mb'", "PYTORCH_NPU_ALLOC_CONF key"]),
    ("max_split_size_mb:19", ["max_split_size_mb must be >= 20", "got 19"]),
    ("large_segment_size_mb:40,max_split_size_mb:30", ["must be >= 40", "got 30"]),
    ("garbage_collection_threshold:1", ["must be in (0, 1)"]),
    ("per_process_memory_fraction:1.5", ["must be in [0, 1]"]),
    ("expandable_segments:yes", ["True or False"]),
    ("roundup_power2_divisions:3", ["power of 2"]),
    ("roundup_power2_divisions:[256:3]", ["0 or a power of 2", "got 3"]),
    ("roundup_power2_divisions:[3:1]", ["interval starts must be powers of 2"]),
    ("roundup_power2_divisions:[256:1", ["expected ']'"]),
    ("backend:magic", ["native or cudaMallocAsync"]),
    ("pinned_num_register_threads:3", ["power of 2 up to 128"]),
])
def test_cuda_settings_errors_say_what_pytorch_says(text, words):
    with pytest.raises(InvalidParamError) as caught:
        parse_config(text)
    for word in words:
        assert word in caught.value.message
    assert "\n" not in caught.value.message


def test_what_pytorch_2_13_takes_is_taken():
    for text in ("large_segment_size_mb:40,max_split_size_mb:40", "per_process_memory_fraction:0.5",
                 "pinned_max_round_threshold_mb:1,pinned_max_cached_size_mb:8",
                 "throw_on_cudamalloc_oom:True,pinned_free_catch_all:False",
                 "expandable_segments:True,", "roundup_power2_divisions:[>:0]"):
        parse_config(text)
    assert parse_config("large_segment_size_mb:40").large_segment_size == 40 * MiB
    assert parse_config("per_process_memory_fraction:0.5").per_process_memory_fraction == 0.5


def test_npu_flavour_raises_where_torch_npu_raises_and_notes_what_it_warns():
    with pytest.raises(InvalidParamError, match="torch_npu refuses max_split_size_mb"):
        parse_config("expandable_segments:True,max_split_size_mb:64", "npu")
    with pytest.raises(InvalidParamError, match="torch_npu refuses"):
        parse_config("garbage_collection_threshold:0.6,expandable_segments:True", "npu")
    base = parse_config("expandable_segments:True", "npu")       # the recording's, then --set
    with pytest.raises(InvalidParamError, match="torch_npu refuses"):
        parse_config("max_split_size_mb:64", base=base)
    with pytest.raises(InvalidParamError, match="unknown key 'backend'.*torch_npu stops"):
        parse_config("backend:native", "npu")
    with pytest.raises(InvalidParamError, match=r"base_addr_aligned_kb must be in \[0, 16\]"):
        parse_config("base_addr_aligned_kb:17", "npu")
    notes = config_warnings(parse_config("segment_size_mb:40,pinned_max_cached_size_mb:4", "npu"))
    assert any("segment_size_mb is deprecated" in n for n in notes)
    # torch_npu 2.13 (master) takes the pinned-memory keys as c10 does, without a word
    assert not any("pinned_max_cached_size_mb" in n for n in notes)
    assert config_warnings(parse_config("base_addr_aligned_kb:0", "npu")) == [
        "base_addr_aligned_kb acts only with expandable_segments:True"]


def test_combinations_with_known_bad_effects_are_notes():
    gc = config_warnings(parse_config("garbage_collection_threshold:0.6"))
    assert len(gc) == 1 and "no effect" in gc[0] and "set_per_process_memory_fraction" in gc[0]
    assert config_warnings(parse_config("garbage_collection_threshold:0.6,"
                                        "per_process_memory_fraction:0.9")) == []
    assert "torch_npu refuses" in config_warnings(
        parse_config("expandable_segments:True,max_split_size_mb:64"))[0]
    assert "every allocation fails" in config_warnings(
        parse_config("per_process_memory_fraction:0"))[0]
    assert config_warnings(parse_config("expandable_segments:True")) == []
    pool = settings_warnings(parse_settings("max_split_size_mb:64,segment_size_mb:30"))
    assert pool == ["max_split_size_mb and segment_size_mb have no effect with "
                    "expandable_segments:True (the pool's default): they act on cached "
                    "segments; add expandable_segments:False"]
    assert settings_warnings(parse_settings("expandable_segments:False,max_split_size_mb:64")) == []


def test_the_cli_shows_the_notes_once(trace):
    result = _replay(trace, "--sweep", "garbage_collection_threshold=0.5,0.7", "--set",
                     "max_split_size_mb=64")
    assert result.exit_code == 0, result.output
    assert result.output.count("[pool]: max_split_size_mb and garbage_collection_threshold have "
                               "no effect") == 1
    assert result.output.count("garbage_collection_threshold:0.5 has no effect") == 1
    assert result.output.count("garbage_collection_threshold:0.7 has no effect") == 1


def test_pool_settings_take_pytorch_syntax_or_say_why_not():
    assert parse_settings("expandable_segments=False,roundup_power2_divisions:4") == \
        parse_settings("expandable_segments:False,roundup_power2_divisions=4")
    with pytest.raises(InvalidParamError, match="one count for every size"):
        parse_settings("roundup_power2_divisions:[256:1,>:4]")


@pytest.mark.skipif(sys.platform == "win32", reason="a torch subprocess")
def test_the_checks_agree_with_the_installed_pytorch():
    """c10's own parser (the device-generic part a CPU build has) against parse_config, on
    texts with only the keys that part checks."""
    pytest.importorskip("torch")
    texts = ["max_split_size_mb:20", "max_split_size_mb:19", "max_non_split_rounding_mb:64",
             "garbage_collection_threshold:0.5", "garbage_collection_threshold:1.0",
             "garbage_collection_threshold:0", "expandable_segments:True",
             "expandable_segments:true", "roundup_power2_divisions:4",
             "roundup_power2_divisions:0", "roundup_power2_divisions:6",
             "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
             "roundup_power2_divisions:[256:3]", "roundup_power2_divisions:[3:1]",
             "roundup_power2_divisions:[>:0]", "large_segment_size_mb:10",
             "large_segment_size_mb:11", "large_segment_size_mb:40,max_split_size_mb:30",
             "pinned_use_background_threads:False", "pinned_use_background_threads:1"]
    code = ("import json, sys, torch\nout = []\nfor text in json.loads(sys.argv[1]):\n"
            "    try:\n        torch._C._accelerator_setAllocatorSettings(text); out.append(True)\n"
            "    except Exception:\n        out.append(False)\nprint(json.dumps(out))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(texts)], capture_output=True,
                          text=True, timeout=300)
    if done.returncode != 0 or not hasattr(__import__("torch")._C,
                                           "_accelerator_setAllocatorSettings"):
        pytest.skip(f"this PyTorch has no generic allocator settings: {done.stderr[-300:]}")
    taken_by_pytorch = json.loads(done.stdout.splitlines()[-1])

    def taken(text):
        try:
            parse_config(text)
            return True
        except InvalidParamError:
            return False

    assert {t: taken(t) for t in texts} == dict(zip(texts, taken_by_pytorch))


# --- the environment, in PyTorch's order --------------------------------------------------------

def test_which_variable_pytorch_reads():
    assert env_names("cuda", "2.13.0+cpu") == ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    assert env_names("cuda", "2.12.1") == ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    assert env_names("cuda", "2.10.0+cu128") == ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
    assert env_names("cuda", "2.8.0") == ("PYTORCH_CUDA_ALLOC_CONF",)
    assert env_names("cuda") == ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    assert env_names("npu") == ("PYTORCH_NPU_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
    both = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:30", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:40"}
    name, text, notes = read_env("cuda", both, "2.13.0")
    assert (name, text) == ("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:40")
    assert notes == ["PYTORCH_ALLOC_CONF is set too, but PyTorch reads PYTORCH_CUDA_ALLOC_CONF first"]
    assert read_env("cuda", both, "2.11.0")[:2] == ("PYTORCH_ALLOC_CONF", "max_split_size_mb:30")
    set_but_empty = {"PYTORCH_CUDA_ALLOC_CONF": "", "PYTORCH_ALLOC_CONF": "max_split_size_mb:30"}
    assert read_env("cuda", set_but_empty, "2.13.0")[:2] == ("PYTORCH_CUDA_ALLOC_CONF", "")
    assert read_env("npu", {"PYTORCH_ALLOC_CONF": "expandable_segments:True"})[:2] == (
        "PYTORCH_ALLOC_CONF", "expandable_segments:True")
    assert read_env("cuda", {}) == ("", "", [])
    with pytest.raises(InvalidParamError, match="environment's PYTORCH_CUDA_ALLOC_CONF.*did you mean"):
        read_env("cuda", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segmets:True"})


def test_the_torch_model_replays_traces_with_the_environment(trace, tmp_path, monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segmets:True")
    _refused(_replay(trace, "--allocator", "torch"), "PYTORCH_CUDA_ALLOC_CONF",
             "unknown key 'expandable_segmets'", "did you mean 'expandable_segments'")
    assert _replay(trace, "--allocator", "pool").exit_code == 0     # not the pool's variable
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:30")
    snapshot = _snapshot(tmp_path)
    rows = _rows(_replay(trace, snapshot, "--json", "--allocator", "torch"))
    assert rows[0]["settings"] == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert any("from the environment, as the program ran" in n for n in rows[0]["notes"])
    assert rows[1]["settings"] == "defaults"                  # a snapshot keeps its own
    assert any("is not applied to" in n for n in rows[1]["notes"])
    # --set goes on top, and the pair is checked as the program would meet it
    rows = _rows(_replay(trace, "--json", "--allocator", "torch", "--set", "max_split_size_mb=64"))
    assert rows[0]["settings"] == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:64"
    monkeypatch.setenv("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True")
    _refused(_replay(trace, "--allocator", "torch_npu", "--set", "max_split_size_mb=64"),
             "torch_npu refuses")


# --- a snapshot's recorded text --------------------------------------------------------------

def test_a_snapshots_recorded_text_that_does_not_parse_is_a_note(tmp_path):
    config = from_snapshot({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segmets:True",
                            "expandable_segments": True})
    assert config.expandable_segments                         # the recorded values are used
    assert len(config.notes) == 1 and "unknown key 'expandable_segmets'" in config.notes[0]
    assert "the keys are" not in config.notes[0]              # the list is for typing, not here
    assert from_snapshot({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}).notes == ()
    path = _snapshot(tmp_path, "typo.pickle", "expandable_segmets:True")
    result = _replay(path)
    assert result.exit_code == 0, result.output
    assert "[torch]: the snapshot's PYTORCH_CUDA_ALLOC_CONF='expandable_segmets:True'" in result.output
    check = CliRunner().invoke(main, ["replay", "--check", path])
    assert check.exit_code == 0 and "note: the snapshot's PYTORCH_CUDA_ALLOC_CONF" in check.output


# --- the README's examples run as written ------------------------------------------------------

def _readme_replays():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    commands = []
    for block in blocks:
        for command in block.replace("\\\n", " ").splitlines():
            command = command.split("#")[0].strip()
            if command.startswith("npumem replay") and "--check" not in command:
                commands.append(command)
    return commands


def test_the_readmes_replay_examples_run(trace, tmp_path, monkeypatch):
    commands = _readme_replays()
    assert len(commands) >= 2 and any("--sweep" in c for c in commands)
    monkeypatch.chdir(tmp_path)
    for command in commands:
        args = [trace if arg.endswith((".jsonl.gz", ".pickle")) else arg
                for arg in shlex.split(command)[2:]]
        result = CliRunner().invoke(main, ["replay", *args, "--workers", "2"])
        assert result.exit_code == 0, (command, result.output)
        assert "Traceback" not in result.output
