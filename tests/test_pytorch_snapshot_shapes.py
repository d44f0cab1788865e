"""Snapshots in the exact shape each PyTorch version and torch_npu write
(tests/pytorch_snapshots.py, from the table in docs/formats.md), ending in a real out-of-memory:
every command reads them, and PyTorch's own viewer opens them (issue 38, item 1)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.units import format_size

from .pytorch_snapshots import (BASE, NEWEST, VERSIONS, MiB, annotate_entry, block, build,
                                plain_types, scenario, segment, shape, shape_for,
                                workspace_snapshot_entries)

SNAPSHOTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "snapshots"
needs_snapshots = pytest.mark.skipif(not SNAPSHOTS.is_dir(), reason="../shared is absent")


def _write(tmp_path, version, **kw) -> tuple[str, object]:
    made = scenario(version, **kw)
    path = tmp_path / f"snapshot_{version}.pickle"
    path.write_bytes(pickle.dumps(made.snapshot))
    return str(path), made


def _run(args: list[str]):
    result = CliRunner().invoke(main, args)
    assert "Traceback" not in result.output, (args, result.output)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{args} raised {result.exception!r}\n{result.output}")
    return result


def _commands(path: str, tmp_path) -> dict[str, tuple[list[str], tuple[int, ...]]]:
    return {"report": (["report", path], (0,)),
            "replay-torch": (["replay", path, "--allocator", "torch"], (0,)),
            # the model MATCHes every shape: torch_npu's workspace blocks are left out of it
            "replay-check": (["replay", "--check", path], (0,)),
            "tune": (["tune", path], (0,)),
            "convert": (["convert", path, str(tmp_path / "out.jsonl")], (0,)),
            "diff": (["diff", path, path], (0,))}


# -- the builder against what PyTorch wrote -------------------------------------------------------

@pytest.mark.parametrize("version", VERSIONS)
def test_the_builder_writes_only_what_pytorch_writes(version):
    snap = scenario(version).snapshot
    assert plain_types(snap)
    sh = shape(version)
    assert list(snap)[:2] == ["segments", "device_traces"]
    assert ("allocator_settings" in snap) == sh.allocator_settings
    assert ("external_annotations" in snap) == sh.external_annotations
    for seg in snap["segments"]:
        assert type(seg["segment_pool_id"]) is tuple and len(seg["segment_pool_id"]) == 2
        assert seg["total_size"] == sum(b["size"] for b in seg["blocks"])
        assert all(list(b) == ["address", "size", "requested_size", "state", "frames"]
                   for b in seg["blocks"])
    trace = snap["device_traces"][0]
    oom = [e for e in trace if e["action"] == "oom"]
    assert len(oom) == 1 and "addr" not in oom[0] and oom[0]["device_free"] > 0
    assert [e["action"] for e in trace[-3:]] == ["segment_free", "segment_free", "oom"]
    assert all("frames" not in e for e in trace if e["action"] == "snapshot")
    assert all(("time_us" in e) == sh.time_us for e in trace)
    assert all(type(e["pool_id"]) is tuple for e in trace if sh.pool_id)
    if sh.compile_context:
        assert {e["compile_context"] for e in trace} == {"N/A"}
    if sh.user_metadata:
        assert "" in {e["user_metadata"] for e in trace}


def test_an_action_a_version_never_writes_is_refused():
    with pytest.raises(ValueError):
        build("2.12", entries=[annotate_entry(BASE, MiB, "note")])    # 2.14's action
    with pytest.raises(ValueError):
        build(NEWEST, entries=[workspace_snapshot_entries(BASE, MiB, 1)[0]])    # torch_npu's


def test_releases_map_to_shapes():
    assert [shape_for(v) for v in ("2.1", "2.2", "2.4", "2.7", "2.9", "2.11", "2.13", "2.14",
                                   "2.15")] == ["2.1", "2.2", "2.3", "2.5", "2.8", "2.10", "2.12",
                                                "2.14", "2.14"]


def _key_shapes(snap: dict) -> dict:
    """The key order of each kind of dict a snapshot holds."""
    kinds = {"top": tuple(snap)}
    for seg in snap["segments"]:
        where = "segment-frames-last" if seg["frames"] else "segment-no-stack"
        kinds.setdefault(where, tuple(seg))
        for b in seg["blocks"]:
            kinds.setdefault("block", tuple(b))
    for trace in snap["device_traces"]:
        for e in trace:
            kinds.setdefault(f"{e['action']}/{'frames' in e}", tuple(e))
    if "allocator_settings" in snap:
        kinds["allocator_settings"] = tuple(snap["allocator_settings"])
        kinds["roundup"] = tuple(snap["allocator_settings"]["roundup_power2_divisions"])
    for a in snap.get("external_annotations", []):
        kinds.setdefault("annotation", tuple(a))
    return kinds


def _types(snap: dict) -> set:
    seen = set()
    for seg in snap["segments"]:
        seen |= {(k, type(v).__name__) for k, v in seg.items()}
    for trace in snap["device_traces"]:
        for e in trace:
            seen |= {(k, type(v).__name__) for k, v in e.items()}
    return seen


@needs_snapshots
@pytest.mark.parametrize("name,version", [("eor_snapshot.pickle", "2.2"),
                                          ("cs336_logs_ctx128_forward.pickle", "2.5")])
def test_the_builder_matches_real_snapshots(name, version):
    """Two snapshots real users dumped: a 2.2 one (time_us, no allocator_settings) and a 2.5-2.7
    one (allocator_settings, external_annotations, no compile_context): every kind of dict the
    real file holds has the builder's keys, in the builder's order, with the builder's types."""
    real = pickle.loads((SNAPSHOTS / name).read_bytes())
    built = scenario(version).snapshot
    real_kinds, built_kinds = _key_shapes(real), _key_shapes(built)
    for kind, keys in real_kinds.items():
        if kind in built_kinds:
            assert built_kinds[kind] == keys, kind
    assert real_kinds["top"] == built_kinds["top"]
    assert real_kinds["block"] == built_kinds["block"]
    assert {k for k in real_kinds if k.startswith(("alloc/", "free_", "segment_alloc/"))} <= set(
        built_kinds)
    assert _types(real) <= _types(built) | {("frames", "list")}


# -- every command reads every version ------------------------------------------------------------

VERBS = ("report", "replay-torch", "replay-check", "tune", "convert", "diff")


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("version", VERSIONS)
def test_every_command_reads_every_version(tmp_path, version, verb):
    path, _ = _write(tmp_path, version)
    args, codes = _commands(path, tmp_path)[verb]
    result = _run(args)
    assert result.exit_code in codes, (args, result.output)


@pytest.mark.parametrize("version", VERSIONS)
def test_report_names_the_oom(tmp_path, version):
    path, made = _write(tmp_path, version)
    result = _run(["report", path])
    assert result.exit_code == 0, result.output
    out = result.output
    assert format_size(made.oom_size) in out or str(made.oom_size) in out, out
    assert format_size(made.device_free) in out or str(made.device_free) in out, out


@pytest.mark.parametrize("context,stacks", [(None, "python"), ("state", "python"),
                                            ("alloc", "python"), ("all", "all")])
@pytest.mark.parametrize("version", [NEWEST, "2.2", "torch_npu"])
def test_every_command_reads_every_recording_mode(tmp_path, version, context, stacks):
    """_record_memory_history(context=None) leaves no frames anywhere, "state" frames on blocks
    only, "alloc" the allocation's frames on frees too; stacks="all" adds C++ frames and a
    Python line of 2**64 - 1."""
    path, _ = _write(tmp_path, version, context=context, stacks=stacks)
    for verb, (args, codes) in _commands(path, tmp_path).items():
        result = _run(args)
        assert result.exit_code in codes, (verb, result.output)


@pytest.mark.parametrize("version", [NEWEST, "2.1"])
def test_every_command_reads_a_two_device_snapshot(tmp_path, version):
    """device_traces has a list per device the allocator knows, empty for idle devices."""
    path, _ = _write(tmp_path, version, devices=2)
    for verb, (args, codes) in _commands(path, tmp_path).items():
        result = _run(args)
        assert result.exit_code in codes, (verb, result.output)


def test_a_snapshot_with_no_trace_is_read(tmp_path):
    """History never enabled: segments with blocks, frames [], device_traces [[]]."""
    snap = build(NEWEST, segments=[segment(BASE, [block(8 * MiB), block(12 * MiB, "inactive")])])
    path = tmp_path / "quiet.pickle"
    path.write_bytes(pickle.dumps(snap))
    result = _run(["report", str(path)])
    assert result.exit_code == 0, result.output


# -- PyTorch's own viewer -------------------------------------------------------------------------

_VIEWER = """
import runpy, sys
path, out = sys.argv[1], sys.argv[2]
for args in (["trace_plot", path, "-o", out], ["stats", path], ["trace", path],
             ["segment_plot", path, "-o", out + ".segments.html"]):
    sys.argv = ["_memory_viz", *args]
    runpy.run_module("torch.cuda._memory_viz", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("version", VERSIONS)
def test_pytorch_viewer_opens_it(tmp_path, version):
    """`python -m torch.cuda._memory_viz trace_plot X -o out.html` (and stats, trace,
    segment_plot), which runs without a GPU; stats checks that blocks fill their segments."""
    pytest.importorskip("torch")
    path, made = _write(tmp_path, version)
    out = tmp_path / "viz.html"
    run = subprocess.run([sys.executable, "-c", _VIEWER, path, str(out)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert out.stat().st_size > 0
    assert "total_reserved" in run.stdout
    assert "raise OutOfMemoryError" in run.stdout
