"""Trace readers and `npumem replay`."""

import gzip
import json
import pathlib

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.trace import TraceFormatError, read_trace
from npumem.whatif.replay import replay

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data not beside the repo")

EVENTS = [
    {"t_us": 0, "action": "alloc", "addr": 1, "size": 3000},
    {"t_us": 1, "action": "alloc", "addr": 2, "size": 5 << 20},
    {"t_us": 2, "action": "free", "addr": 1, "size": 3000},
    {"t_us": 3, "action": "alloc", "addr": 3, "size": 2000, "stream": 1},
    {"t_us": 4, "action": "free", "addr": 99, "size": 10},
    {"t_us": 5, "action": "free", "addr": 2, "size": 5 << 20},
]


def _write_jsonl(path, events, compress=False):
    text = "\n".join(json.dumps(e) for e in events) + "\n"
    if compress:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_jsonl_plain_and_gzip(tmp_path):
    for compress in (False, True):
        path = _write_jsonl(tmp_path / f"t{compress}.jsonl", EVENTS, compress)
        events = list(read_trace(path))
        # the free of address 99, never allocated, frees a block from before the trace began
        assert events[0] == (0.0, "alloc", 99, 10, 0)
        assert [e.action for e in events[1:]] == [e["action"] for e in EVENTS]
        assert events[4].stream == 1 and events[2].size == 5 << 20


def test_chrome_trace_memory_events(tmp_path):
    doc = {"traceEvents": [
        {"ph": "X", "name": "aten::add", "ts": 1},
        {"ph": "i", "name": "[memory]", "ts": 20, "args": {"Addr": 5, "Bytes": -64}},
        {"ph": "i", "name": "[memory]", "ts": 10, "args": {"Addr": 5, "Bytes": 64}},
    ]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    events = list(read_trace(path))
    assert [(e.action, e.size) for e in events] == [("alloc", 64), ("free", 64)]


@pytest.mark.parametrize("lines, where, reason", [
    (['{"action": "alloc", "addr": 1, "size": 8}', "not json"], ":2:", "not JSON"),
    (['{"action": "grow", "addr": 1, "size": 8}'], ":1:", "action must be"),
    (['{"action": "free", "addr": -1, "size": 8}'], ":1:", "address must be"),
    (['[1, 2]'], ":traceEvents:", "no [memory] events"),
])
def test_malformed_traces_name_file_line_and_reason(tmp_path, lines, where, reason):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path))
    assert str(path) in str(info.value) and where in str(info.value) and reason in str(info.value)


def test_truncated_gzip(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(gzip.compress(("\n".join(json.dumps(e) for e in EVENTS * 200)).encode())[:300])
    with pytest.raises(TraceFormatError, match="truncated or corrupt"):
        list(read_trace(path))


def test_replay_results(tmp_path):
    events = list(read_trace(_write_jsonl(tmp_path / "t.jsonl", EVENTS)))
    result = replay(events, "pool", trace_name="t")
    assert result.events == 7 and result.unmatched_frees == 0
    assert result.peak_allocated_bytes == 10 + 3000 + (5 << 20)   # 10 B from before the trace
    assert result.peak_reserved_bytes >= result.peak_allocated_bytes
    device = replay(events, "device")
    assert device.device_allocs == 4 and device.cache_hit_rate == 0.0
    with pytest.raises(ValueError, match="unknown allocator"):
        replay(events, "magic")


def test_cli_json_fields(tmp_path):
    path = _write_jsonl(tmp_path / "t.jsonl", EVENTS)
    result = CliRunner().invoke(main, ["replay", str(path), "--json", "--set", "max_split_size_mb=64"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["allocator"] for r in rows] == ["pool", "torch", "device"]
    for key in ("trace", "allocator", "events", "peak_allocated_bytes", "peak_reserved_bytes",
                "reserved_over_allocated", "device_allocs", "cache_hit_rate", "mean_alloc_us"):
        assert key in rows[0]


def test_cli_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"action": "alloc"}\n')
    result = CliRunner().invoke(main, ["replay", str(bad)])
    assert result.exit_code == 2 and "bad.jsonl:1:" in result.output
    good = _write_jsonl(tmp_path / "t.jsonl", EVENTS)
    assert CliRunner().invoke(main, ["replay", str(good), "--allocator", "magic"]).exit_code == 2
    assert CliRunner().invoke(main, ["replay", str(good), "--set", "nonsense=1"]).exit_code == 2
    assert CliRunner().invoke(main, ["replay", str(tmp_path / "missing.jsonl")]).exit_code == 2


def test_cli_replays_the_pool_with_the_programs_settings_under_set(tmp_path, monkeypatch):
    """NPUMEM_ALLOC_CONF is what the program ran with: the pool replays with it, and --set goes
    on top; a bad value in it is an error that names it."""
    path = _write_jsonl(tmp_path / "t.jsonl", EVENTS)

    def pool_settings(*extra):
        result = CliRunner().invoke(main, ["replay", str(path), "--allocator", "pool", "--json",
                                           *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)[0]["settings"]

    monkeypatch.delenv("NPUMEM_ALLOC_CONF", raising=False)
    assert pool_settings() == "defaults"
    monkeypatch.setenv("NPUMEM_ALLOC_CONF", "max_split_size_mb:64")
    assert "max_split_size_mb:64" in pool_settings()
    both = pool_settings("--set", "predictive=True")
    assert "max_split_size_mb:64" in both and "predictive" in both
    assert "max_split_size_mb:128" in pool_settings("--set", "max_split_size_mb=128")
    monkeypatch.setenv("NPUMEM_ALLOC_CONF", "max_split_size_mb:lots")
    result = CliRunner().invoke(main, ["replay", str(path), "--allocator", "pool"])
    assert result.exit_code == 2 and "NPUMEM_ALLOC_CONF" in result.output


def test_cli_planner_lag_hands_plans_over_later(monkeypatch):
    """--planner-lag N: a predictive plan is handed over N requests after it was asked for,
    as a program's planner thread would; so it takes over later. A negative N, or a lag
    with no predictive pool to apply to, is an error that says so."""
    monkeypatch.delenv("NPUMEM_ALLOC_CONF", raising=False)
    path = str(pathlib.Path(__file__).parent / "data" / "cpu_recordings" / "mlp_12_steps.jsonl.gz")

    def took_over_at(lag):
        result = CliRunner().invoke(main, ["replay", path, "--allocator", "pool", "--json",
                                           "--set", "predictive=True", "--planner-lag", lag])
        assert result.exit_code == 0, result.output
        row = json.loads(result.output)[0]
        assert row["prediction_hit_rate"] == 1.0, row["notes"]
        return int(row["notes"][0].split("took over at request ")[1].split(";")[0])

    assert took_over_at("0") < took_over_at("250")
    result = CliRunner().invoke(main, ["replay", path, "--planner-lag", "-1"])
    assert result.exit_code == 2 and "0 or more" in result.output
    result = CliRunner().invoke(main, ["replay", path, "--allocator", "pool", "--planner-lag", "9"])
    assert result.exit_code == 2 and "predictive" in result.output


@needs_shared
def test_real_traces_pool_beats_torch_emulation():
    for name in ("resnet_train.jsonl.gz", "opt_generate.jsonl.gz"):
        events = list(read_trace(SHARED / name))
        pool, torch = replay(events, "pool"), replay(events, "torch")
        assert pool.peak_reserved_bytes < torch.peak_reserved_bytes
        assert pool.unmatched_frees == 0 and pool.events == len(events)


def test_a_null_time_or_stream_is_one_not_given(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"t_us": null, "action": "alloc", "addr": 1, "size": 2, "stream": null}\n'
                    '{"action": "free", "addr": 1, "size": 2}\n')
    assert [tuple(e) for e in read_trace(path)] == [(0.0, "alloc", 1, 2, 0), (0.0, "free", 1, 2, 0)]


def test_a_damaged_gzip_names_no_position_it_does_not_know(tmp_path):
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path))
    assert str(info.value).startswith(f"{path}: the file is truncated or corrupt")


def test_a_missing_size_and_a_memory_stats_file_are_named(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"action": "alloc", "addr": 1, "size": 2}\n{"action": "free", "addr": 1}\n')
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: the size is missing"):
        list(read_trace(path))
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"allocated_bytes.all.current": 5, "num_ooms": 0}))
    result = CliRunner().invoke(main, ["replay", str(stats)])
    assert result.exit_code == 2 and "`npumem report` reads it" in result.output
