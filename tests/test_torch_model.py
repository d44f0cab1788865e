"""The model of PyTorch's caching allocator: its rules, its settings, and replays that must
reproduce what was recorded, from a trace that starts mid-run."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st

from npumem.alloc.torch_model import (DeviceMemory, ModelOutOfMemory, TorchAllocatorModel,
                                      parse_config, round_size)
from npumem.cli import main
from npumem.errors import InvalidParamError
from npumem.trace.snapshot import load_recording
from npumem.whatif.torch_replay import replay_file, replay_recording

from .torch_recorder import record

MiB = 1 << 20
SNAPSHOTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "snapshots"
needs_snapshots = pytest.mark.skipif(not SNAPSHOTS.is_dir(), reason="../shared is absent")


def test_rounding_follows_pytorch():
    config = parse_config("")
    assert round_size(1, config) == 512 and round_size(513, config) == 1024
    divisions = parse_config("roundup_power2_divisions:4")
    assert round_size(4500, divisions) == 5120 and round_size(4500, config) == 4608
    assert round_size(1200, divisions) == 1536       # at most 512 * divisions: plain rounding
    npu = parse_config("", "npu")
    assert round_size(480, npu) == 512 and round_size(481, npu) == 1024      # +32 padding


def test_pools_segments_and_splits():
    model = TorchAllocatorModel()
    small = model.malloc(1000)
    assert model.stats.events[-1].size == 2 * MiB            # small requests: 2 MiB segments
    mid = model.malloc(3 * MiB)
    assert model.stats.events[-1].size == 20 * MiB           # 1-10 MiB: 20 MiB segments
    big = model.malloc(50 * MiB + 1)
    assert model.stats.events[-1].size == 52 * MiB           # large: rounded to 2 MiB
    again = model.malloc(3 * MiB)
    assert again.addr == mid.addr + 3 * MiB                  # split off the 20 MiB segment
    model.free(mid)
    model.free(again)
    reuse = model.malloc(6 * MiB)
    assert reuse.addr == mid.addr and model.stats.num_device_alloc == 3
    model.free(reuse), model.free(small), model.free(big)
    model.empty_cache()
    assert model.stats.reserved == 0 and model.stats.num_device_free == 3


def test_max_split_size_keeps_big_blocks_whole():
    model = TorchAllocatorModel(parse_config("max_split_size_mb:40"))
    block = model.malloc(60 * MiB)
    model.free(block)
    small = model.malloc(30 * MiB)                            # may not split the 60 MiB block
    assert small.addr != block.addr and model.stats.num_device_alloc == 2
    near = model.malloc(50 * MiB)                             # within 20 MiB: served whole
    assert near.addr == block.addr and near.size == 60 * MiB


def test_expandable_segments_grow_one_range():
    model = TorchAllocatorModel(parse_config("expandable_segments:True"))
    a = model.malloc(30 * MiB)
    b = model.malloc(30 * MiB)
    assert b.addr == a.addr + 30 * MiB                        # the same range, grown
    assert [e.action for e in model.stats.events] == ["segment_map", "segment_map"]
    assert model.stats.reserved == 60 * MiB                   # 20 MiB pages
    model.free(b)
    assert model.stats.reserved == 60 * MiB                   # unmapped only by empty_cache
    model.empty_cache()
    assert model.stats.reserved == 40 * MiB and model.stats.events[-1].action == "segment_unmap"


def test_out_of_memory_frees_the_cache_then_raises():
    model = TorchAllocatorModel(device=DeviceMemory(64 * MiB))
    a = model.malloc(30 * MiB)
    model.free(a)
    b = model.malloc(40 * MiB)                                # frees the cached 30 MiB, retries
    assert [e.action for e in model.stats.events] == ["segment_alloc", "segment_free", "segment_alloc"]
    with pytest.raises(ModelOutOfMemory) as caught:
        model.malloc(30 * MiB)
    assert caught.value.alloc_size == 30 * MiB and caught.value.free == 24 * MiB
    assert b.allocated and model.stats.allocated == 40 * MiB  # nothing lost


def test_settings_errors_name_the_keys():
    with pytest.raises(InvalidParamError, match="unknown key 'segment_size_mb'.*max_split_size_mb"):
        parse_config("segment_size_mb:20")                    # an NPU key, not a CUDA one
    with pytest.raises(InvalidParamError, match="must be >= 20"):
        parse_config("max_split_size_mb:10")
    with pytest.raises(InvalidParamError, match="True or False"):
        parse_config("expandable_segments:true")
    divisions = parse_config("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]").roundup_power2_divisions
    assert divisions[:9] == (1,) * 9 and divisions[9:11] == (2, 4) and divisions[11:] == (8,) * 5
    assert parse_config("large_segment_size_mb:40", "npu").large_segment_size == 40 * MiB


WORKLOAD = [("alloc", i, size) for i, size in enumerate(
    [300, 4 * MiB, 700_000, 25 * MiB, 3 * MiB, 1 * MiB + 5, 90 * MiB, 512, 12 * MiB])]
WORKLOAD += [("free", 1), ("free", 3), ("alloc", 20, 6 * MiB), ("free", 6), ("empty_cache",),
             ("alloc", 21, 40 * MiB), ("free", 0), ("alloc", 22, 8 * MiB), ("free", 4),
             ("alloc", 23, 2 * MiB, 7), ("free", 20), ("alloc", 24, 30 * MiB)]


@pytest.mark.parametrize("settings_text", ["", "expandable_segments:True", "max_split_size_mb:32",
                                           "roundup_power2_divisions:4"])
def test_replay_of_a_mid_run_recording_is_exact(tmp_path, settings_text):
    snapshot = record(WORKLOAD, settings_text, keep=30)
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    result = replay_file(str(path), check=True)
    assert result.divergence is None, result.divergence.describe()
    assert result.faithful
    if "expandable" not in settings_text:      # a new address range is the driver's pick
        assert result.misplaced_blocks == 0
    assert result.start_reserved_bytes > 0                     # the trace began mid-run


@st.composite
def workloads(draw):
    steps, live = [], []
    for key in range(draw(st.integers(5, 60))):
        if live and draw(st.booleans()):
            steps.append(("free", live.pop(draw(st.integers(0, len(live) - 1)))))
        elif draw(st.integers(0, 15)) == 0:
            steps.append(("empty_cache",))
        else:
            size = draw(st.sampled_from([100, 4000, 700_000, 1 << 20, 3 << 20, 11 << 20, 33 << 20]))
            steps.append(("alloc", key, size + draw(st.integers(0, 5000)), draw(st.sampled_from([0, 0, 9]))))
            live.append(key)
    return steps


@settings(max_examples=40, deadline=None)
@given(workloads(), st.sampled_from(["", "expandable_segments:True", "max_split_size_mb:24",
                                   "max_split_size_mb:24,roundup_power2_divisions:4"]),
       st.integers(1, 200), st.sampled_from([None, 160 << 20, 60 << 20]))
def test_any_recording_replays_exactly(tmp_path_factory, steps, settings_text, keep, capacity):
    snapshot = record(steps, settings_text, capacity=capacity, keep=keep)
    if not snapshot["device_traces"][0]:
        return
    path = tmp_path_factory.mktemp("h") / "snap.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    result = replay_file(str(path), check=True)
    assert result.divergence is None, result.divergence.describe()
    assert result.peak_reserved_bytes == result.recorded_peak_reserved_bytes


def test_an_oom_is_explained_and_fixed_by_a_setting(tmp_path):
    steps = [("alloc", 0, 6 * MiB), ("alloc", 1, 6 * MiB), ("alloc", 2, 6 * MiB), ("free", 0),
             ("free", 2), ("alloc", 3, 12 * MiB), ("alloc", 4, 10 * MiB)]   # freed space stranded
    snapshot = record(steps, capacity=40 * MiB)
    assert snapshot["device_traces"][0][-1]["action"] == "oom"
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps(snapshot))
    report = CliRunner().invoke(main, ["report", str(path)])
    assert report.exit_code == 0, report.output
    assert "out of memory at trace entry" in report.output and "reserved but unallocated" in report.output
    assert 'PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"' in report.output
    tuned = CliRunner().invoke(main, ["tune", str(path), "--json"])
    assert tuned.exit_code == 0, tuned.output
    # the run died before it repeated a step: a setting to try, not a recommendation
    assert '"recommended_env": null' in tuned.output
    assert '"worth_trying_env": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"' in tuned.output


def test_bad_snapshots_get_sentences(tmp_path):
    only_segments = record([("alloc", 0, 5000)])
    only_segments["device_traces"] = []
    path = tmp_path / "segments.pickle"
    path.write_bytes(pickle.dumps(only_segments))
    report = CliRunner().invoke(main, ["report", str(path)])
    assert report.exit_code == 0 and "no event history" in report.output
    replayed = CliRunner().invoke(main, ["replay", str(path), "--allocator", "torch"])
    assert replayed.exit_code == 2 and "no trace entries" in replayed.output
    snapshot = record([("alloc", 0, 5000), ("free", 0)])
    snapshot["device_traces"][0].append({"action": "free_completed", "addr": 0xDEAD000, "size": 4,
                                         "stream": 0, "time_us": 99})
    path.write_bytes(pickle.dumps(snapshot))
    result = replay_file(str(path))
    assert result.unmatched_frees == 1 and any("outside every segment" in n for n in result.notes)
    hostile = tmp_path / "hostile.pickle"
    hostile.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]], "x": Path("/")}))
    replayed = CliRunner().invoke(main, ["replay", str(hostile), "--allocator", "torch"])
    assert replayed.exit_code == 2 and "plain data" in replayed.output
    bad = CliRunner().invoke(main, ["replay", str(path), "--allocator", "torch", "--set", "nope=1"])
    assert bad.exit_code == 2 and "expandable_segments" in bad.output


@needs_snapshots
@pytest.mark.parametrize("name, allocs, peak", [
    ("eor_snapshot.pickle", 7, 134217728),
    ("cs336_logs_ctx128_forward.pickle", 178, 17878220800)])
def test_real_snapshots_replay_exactly(name, allocs, peak):
    result = replay_file(str(SNAPSHOTS / name), check=True)
    assert result.divergence is None and result.faithful
    assert (result.device_allocs, result.peak_reserved_bytes) == (allocs, peak)
    assert result.misplaced_blocks == 0
    recording = load_recording(str(SNAPSHOTS / name))
    expandable = replay_recording(recording, parse_config("expandable_segments:True"))
    assert expandable.peak_reserved_bytes < peak                # the setting changes the answer


@needs_snapshots
def test_check_cli_on_real_snapshots():
    result = CliRunner().invoke(main, ["replay", "--check", str(SNAPSHOTS / "eor_snapshot.pickle")])
    assert result.exit_code == 0 and "MATCH" in result.output
    result = CliRunner().invoke(main, ["replay", "--check", "--set", "max_split_size_mb:40",
                                       str(SNAPSHOTS / "cs336_logs_ctx128_forward.pickle")])
    assert result.exit_code == 1 and "first divergence at entry" in result.output


def test_check_needs_a_snapshot(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"t_us": 1, "action": "alloc", "addr": 1, "size": 100}\n')
    result = CliRunner().invoke(main, ["replay", "--check", str(trace)])
    assert result.exit_code == 2 and "needs a memory snapshot;" in result.output


RECORDED_ON_CUDA = sorted((Path(__file__).parent / "data" / "cuda_snapshots").glob("*.pickle.gz"))


@pytest.mark.parametrize("path", RECORDED_ON_CUDA, ids=lambda p: p.name.split(".")[0])
def test_snapshots_recorded_on_a_gpu_replay_exactly(path):
    """bench/record_workloads.py --device cuda on an H100 (torch 2.11): the real allocator's
    decisions, segment by segment, shipped as test data."""
    result = replay_file(str(path), check=True)
    assert result.faithful, result.divergence.describe() if result.divergence else result
    assert result.misplaced_blocks == 0 and result.recorded_device_allocs > 0


def test_a_gpu_recording_reports_the_workload_frames():
    report = CliRunner().invoke(main, ["report", str(RECORDED_ON_CUDA[0])])
    assert report.exit_code == 0, report.output
    assert "record_workloads.py:" in report.output and "unwind" not in report.output


def test_an_expandable_request_larger_than_the_device_is_out_of_memory():
    model = TorchAllocatorModel(parse_config("expandable_segments:True"), DeviceMemory(40 * MiB))
    kept = model.malloc(10 * MiB)
    with pytest.raises(ModelOutOfMemory):
        model.malloc(100 * MiB)
    assert kept.allocated and model.stats.allocated == 10 * MiB      # nothing lost
