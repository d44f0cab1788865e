"""Garbage is refused with a sentence, never accepted as a result (issue 19, item 8)."""

import pickle

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.trace import TraceEvent, TraceFormatError, write_trace


def _refused(args, *words):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and all(w in result.output for w in words), result.output


def test_a_negative_size_in_a_snapshot(tmp_path):
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 1, "size": -5, "time_us": 1}]]}))
    for command in ("report", "replay", "tune"):
        _refused([command, str(path)], "device_traces[0][0].size", "[0, 2**64)", "got -5")


def test_times_that_are_not_finite(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"t_us": NaN, "action": "alloc", "addr": 1, "size": 10}\n')
    _refused(["convert", str(path), str(tmp_path / "out.jsonl")], "must be finite", "nan")
    _refused(["replay", str(path)], "must be finite")
    with pytest.raises(TraceFormatError, match="finite numbers only"):
        write_trace([TraceEvent(float("inf"), "alloc", 1, 10)], str(tmp_path / "w.jsonl"), "jsonl")


def test_plan_sizes_that_would_overflow_and_text_that_is_not_utf8(tmp_path):
    huge = tmp_path / "huge.csv"
    huge.write_text("id,lower,upper,size\n1,0,10,4611686018427387904\n2,0,10,4611686018427387904\n")
    _refused(["plan", str(huge)], "at most 2**48")
    broken = tmp_path / "broken.csv"
    broken.write_bytes(b"id,lower,upper,size\n1,0,5,\xff\xfe\n")
    _refused(["plan", str(broken)], "not UTF-8 text")
