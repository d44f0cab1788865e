"""Every trace format: detection, round trips through `npumem convert`, errors with positions,
and what-if replays (sweeps, tune, parallel schedulers)."""

import gzip
import json
import pathlib
import pickle

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.trace import FORMATS, TraceEvent, TraceFormatError, detect_format, read_trace, write_trace
from npumem.whatif.sweep import ReplayJob, run_jobs, sweep_settings
from npumem.whatif.tune import tune

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data not beside the repo")

EVENTS = [TraceEvent(0.0, "alloc", 0x1000, 3000), TraceEvent(1.0, "alloc", 0x2000, 5 << 20, 7),
          TraceEvent(2.0, "free", 0x1000, 3000), TraceEvent(3.0, "alloc", 0x3000, 2048),
          TraceEvent(4.0, "free", 0x2000, 5 << 20, 7), TraceEvent(5.0, "free", 0x3000, 2048)]
NAMES = {"jsonl": "t.jsonl", "chrome": "t.json", "snapshot": "t.pickle", "rmm": "t.csv",
         "msprof": "operator_memory.csv"}


def _shape(events):
    """What survives every format: order, action and size (msprof renames addresses)."""
    return [(e.action, e.size) for e in events]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("compress", [False, True])
def test_write_detect_read_round_trip(tmp_path, fmt, compress):
    path = tmp_path / (NAMES[fmt] + (".gz" if compress else ""))
    write_trace(EVENTS, path)
    assert detect_format(path) == fmt
    events = list(read_trace(path))
    assert _shape(events) == _shape(EVENTS)
    if fmt != "msprof":
        assert [e.addr for e in events] == [e.addr for e in EVENTS]
    if fmt in ("jsonl", "chrome", "snapshot", "rmm"):
        assert [e.t_us for e in events] == [e.t_us for e in EVENTS]


def test_snapshot_reads_pytorch_entries_and_frees_at_completion(tmp_path):
    entries = [{"action": "segment_alloc", "addr": 0, "size": 2 << 20, "stream": 0, "time_us": 0},
               {"action": "alloc", "addr": 64, "size": 512, "stream": 3, "time_us": 1, "frames": []},
               {"action": "free_requested", "addr": 64, "size": 512, "stream": 3, "time_us": 2},
               {"action": "free_completed", "addr": 64, "size": 512, "stream": 3, "time_us": 9},
               {"action": "oom", "addr": 0, "size": 1 << 40, "stream": 0, "time_us": 10}]
    path = tmp_path / "torch.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[], entries]}))
    events = list(read_trace(path))
    assert [(e.action, e.t_us, e.stream) for e in events] == [("alloc", 1.0, 3), ("free", 9.0, 3)]


def test_rmm_log_from_the_logging_adaptor_reads_back(tmp_path):
    from npumem.alloc.adaptors import LoggingAdaptor
    from npumem.alloc.caching_allocator import CachingAllocator
    from npumem.device import SimBackend, SimConfig

    backend = SimBackend(SimConfig(memory=64 << 20))
    path = tmp_path / "log.csv"
    resource = LoggingAdaptor(CachingAllocator(backend), str(path))
    pointers = [resource.allocate(size) for size in (100, 5000, 1 << 20)]
    for pointer in pointers:
        resource.deallocate(pointer)
    try:
        resource.allocate(1 << 40)
    except Exception:
        pass
    resource.close()
    events = list(read_trace(path))
    assert [e.action for e in events] == ["alloc"] * 3 + ["free"] * 3   # the failure is skipped
    assert [e.addr for e in events[:3]] == pointers
    assert all(b.t_us >= a.t_us for a, b in zip(events, events[1:]))


@pytest.mark.parametrize("name, text, where, reason", [
    ("t.json", '{"traceEvents": [{"name": "[memory]", "args": {"Bytes": "x"}}]}', ":char 17:",
     "without an integer"),
    ("t.json", '{"traceEvents": [{"name": "[memory]", "args": ', ":char 46:", "not valid JSON"),
    ("t.csv", "Thread,Time,Action,Pointer,Size,Stream\n1,00:00:01.5,allocate,0x10,zz,0\n", ":2:",
     "bad field"),
    ("t.csv", "Thread,Time,Action,Pointer,Size,Stream\n1,1,grow,0x10,8,0\n", ":2:", "action must be"),
    ("operator_memory.csv", "Name,Size(KB),Allocation Time(us),Release Time(us)\nop,1,5,2\n", ":2:",
     "release before allocation"),
    ("t.txt", "hello\n", ":1:", "unknown trace format"),
])
def test_malformed_files_name_position_and_reason(tmp_path, name, text, where, reason):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path))
    assert str(path) + where in str(info.value) and reason in str(info.value)


def test_snapshot_errors(tmp_path):
    path = tmp_path / "list.pickle"
    path.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(TraceFormatError, match="device_traces"):
        list(read_trace(path))
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}))
    with pytest.raises(TraceFormatError, match="every device trace is empty"):
        list(read_trace(path))


def test_chrome_reader_streams_across_chunks(tmp_path, monkeypatch):
    from npumem.trace import chrome
    monkeypatch.setattr(chrome, "CHUNK", 64)          # force many refills mid-object
    path = tmp_path / "big.json"
    many = [TraceEvent(float(i), "alloc" if i % 2 == 0 else "free", 100 + i // 2, 512 + i // 2)
            for i in range(400)]
    write_trace(many, path)
    assert list(read_trace(path)) == [e._replace(stream=0) for e in many]


def test_convert_cli_every_direction(tmp_path):
    source = tmp_path / "source.jsonl"
    write_trace(EVENTS, source)
    previous = source
    for fmt in ("snapshot", "rmm", "msprof", "chrome", "jsonl"):
        target = tmp_path / ("x_" + NAMES[fmt])
        result = CliRunner().invoke(main, ["convert", str(previous), str(target)])
        assert result.exit_code == 0, result.output
        assert f"({fmt})" in result.output
        assert _shape(read_trace(target)) == _shape(EVENTS)
        previous = target
    result = CliRunner().invoke(main, ["convert", str(source), str(tmp_path / "x.bin")])
    assert result.exit_code == 2 and "cannot tell the format" in result.output
    result = CliRunner().invoke(main, ["convert", str(tmp_path / "missing.jsonl"), str(tmp_path / "o.json")])
    assert result.exit_code == 2 and "no such file" in result.output


def test_reading_a_folder_as_a_trace_says_it_is_a_folder(tmp_path):
    with pytest.raises(TraceFormatError, match="is a folder, not a file"):
        read_trace(tmp_path)
    with pytest.raises(TraceFormatError, match="no such file"):
        read_trace(tmp_path / "missing.jsonl")


def test_sweep_settings_product_and_validation():
    assert sweep_settings("", ["expandable_segments=True,False", "roundup_power2_divisions=0,4"]) == [
        "expandable_segments:True,roundup_power2_divisions:0",
        "expandable_segments:True,roundup_power2_divisions:4",
        "expandable_segments:False,roundup_power2_divisions:0",
        "expandable_segments:False,roundup_power2_divisions:4"]
    from npumem.errors import InvalidParamError
    with pytest.raises(InvalidParamError, match="unknown key"):
        sweep_settings("", ["max_split=1,2"])
    with pytest.raises(InvalidParamError, match="greater than 20"):
        sweep_settings("expandable_segments:False", ["max_split_size_mb=10,64"])


def test_process_pool_gives_the_same_results_as_serial(tmp_path):
    path = tmp_path / "t.jsonl"
    write_trace(EVENTS * 3, path)
    jobs = [ReplayJob(str(path), "pool", s) for s in sweep_settings("", ["expandable_segments=True,False"])]
    jobs.append(ReplayJob(str(path), "torch"))
    seen = []
    parallel = run_jobs(jobs, "processes", 2, lambda done, total: seen.append((done, total)))
    serial = run_jobs(jobs, "serial")
    strip = [(r.allocator, r.settings, r.peak_reserved_bytes, r.device_allocs) for r in parallel]
    assert strip == [(r.allocator, r.settings, r.peak_reserved_bytes, r.device_allocs) for r in serial]
    assert seen[-1] == (3, 3)
    with pytest.raises(ValueError, match="unknown scheduler"):
        run_jobs(jobs, "gpu-farm")


def test_dask_scheduler_runs_the_jobs(tmp_path):
    pytest.importorskip("dask.distributed")
    path = tmp_path / "t.jsonl"
    write_trace(EVENTS, path)
    jobs = [ReplayJob(str(path), "pool", s) for s in ("", "expandable_segments:False")]
    results = run_jobs(jobs, "dask", 2)
    assert [r.settings for r in results] == ["defaults", "expandable_segments:False"]
    assert all(r.peak_allocated_bytes == 3000 + (5 << 20) for r in results)


@needs_shared
def test_replay_sweep_cli_table_json_and_plot(tmp_path):
    trace = str(SHARED / "resnet_train.jsonl.gz")
    plot = tmp_path / "sweep.svg"
    result = CliRunner().invoke(main, ["replay", trace, "--allocator", "pool,torch", "--sweep",
                                       "expandable_segments=True,False", "--json", "--plot", str(plot),
                                       "--workers", "2"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [(r["allocator"], r["settings"]) for r in rows] == [
        ("pool", "defaults"), ("pool", "expandable_segments:False"),
        ("torch", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"), ("torch", "defaults")]
    assert rows[0]["peak_reserved_bytes"] < rows[3]["peak_reserved_bytes"]
    svg = plot.read_text()
    assert svg.startswith("<svg") and svg.count("<rect") == 4 and "expandable_segments:False" in svg
    result = CliRunner().invoke(main, ["replay", trace, "--allocator", "torch", "--sweep", "x=1"])
    assert result.exit_code == 2 and "unknown key 'x'" in result.output
    assert "max_split_size_mb" in result.output         # it names the keys PyTorch has
    result = CliRunner().invoke(main, ["replay", trace, "--allocator", "device", "--sweep", "x=1"])
    assert result.exit_code == 2 and "add pool or torch" in result.output


@needs_shared
def test_tune_recommends_the_lowest_peak(tmp_path):
    trace = str(SHARED / "resnet_train.jsonl.gz")
    recommendation = tune(trace, scheduler="serial")
    peaks = [c.peak_reserved_bytes for c in recommendation.candidates]
    assert recommendation.predicted_peak_reserved_bytes == min(peaks)
    assert recommendation.predicted_peak_reserved_bytes <= recommendation.torch_peak_reserved_bytes
    assert "peak live" in recommendation.reason
    result = CliRunner().invoke(main, ["tune", trace, "--json", "--scheduler", "serial"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["predicted_peak_reserved_bytes"] == min(peaks)


def test_tune_says_why_a_setting_that_ties_the_defaults_wins(tmp_path):
    """Equal peaks: fewer device allocations decide, and the reason says so (it used to say
    the defaults reserve the least, and name the defaults as the best alternative)."""
    sizes = [("alloc", 1, 1_500_000), ("alloc", 2, 2_300_000), ("alloc", 3, 700_000),
             ("alloc", 4, 700_000), ("free", 1, 1_500_000), ("alloc", 5, 1_100_000),
             ("free", 5, 1_100_000), ("alloc", 6, 1_100_000)]
    path = tmp_path / "t.jsonl"
    write_trace([TraceEvent(float(i), action, addr << 12, size)
                 for i, (action, addr, size) in enumerate(sizes)], path)
    recommendation = tune(str(path), ("", "roundup_power2_divisions:4"), scheduler="serial")
    default, rounded = recommendation.candidates
    assert default.peak_reserved_bytes == rounded.peak_reserved_bytes
    assert rounded.device_allocs < default.device_allocs
    assert recommendation.settings == "roundup_power2_divisions:4"
    assert recommendation.reason.startswith(
        f"roundup_power2_divisions:4 reserves as little at peak as the defaults (6.00 MiB) with "
        f"fewer device allocations ({rounded.device_allocs} vs {default.device_allocs})")


def test_replay_cli_reports_bad_trace(tmp_path):
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"action": "alloc", "addr": 1, "size": 8}\n{"action": "grow"}\n'))
    result = CliRunner().invoke(main, ["replay", str(bad), "--allocator", "pool", "--scheduler", "serial"])
    assert result.exit_code == 2 and f"{bad}:2:" in result.output and "action must be" in result.output


def test_chrome_output_gives_each_stream_a_small_named_track(tmp_path):
    streams = (0, 0x7F3A5C000000, 0x7F3A5C100000)          # CUDA stream pointers are this big
    events = [TraceEvent(float(i), "alloc", 4096 * i, 512, streams[i % 3]) for i in range(6)]
    path = tmp_path / "t.json"
    write_trace(events, str(path), "chrome")
    trace = json.loads(path.read_text())["traceEvents"]
    memory = [e for e in trace if e["name"] == "[memory]"]
    names = {e["tid"]: e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    assert {e["tid"] for e in memory} == set(names) == {1, 2, 3}
    assert sorted(names.values()) == ["default stream", "stream 0x7f3a5c000000",
                                      "stream 0x7f3a5c100000"]
