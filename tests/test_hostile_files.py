"""Hostile files against every command that reads one: no code runs, no memory blows up, and
the answer is one line naming the file (issue 19, items 1 and 7)."""

import gzip
import json
import os
import pickle
import subprocess
import sys
import threading

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.trace.snapshot import load_data

from .fuzzing import HOSTILE_PICKLES, snapshot_seed


class _RunsCode:
    """Unpickling this would create the marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _commands(path: str, tmp_path) -> list[list[str]]:
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"allocated_bytes.all.current": 1, "reserved_bytes.all.current": 2}))
    return [["report", path], ["replay", path], ["replay", "--check", path],
            ["convert", path, str(tmp_path / "out.jsonl")], ["plan", path, "--time-limit", "1"],
            ["diff", path, path], ["tune", path], ["report", str(stats), "--snapshot", path]]


def _refused(args: list[str], *words: str) -> str:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, (args, result.output)
    assert "Traceback" not in result.output and result.output.count("\n") <= 2, result.output
    assert all(word in result.output for word in words), (args, result.output)
    return result.output


@pytest.mark.parametrize("name", ["snap.pickle", "trace.jsonl.gz", "lifetimes.csv", "t.json"])
def test_a_pickle_that_runs_code_is_refused_by_every_command(tmp_path, name):
    marker = tmp_path / "ran"
    path = tmp_path / name
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]], "x": _RunsCode(marker)}))
    for args in _commands(str(path), tmp_path):
        _refused(args, str(path))
        assert not marker.exists(), f"{args} ran the pickle's code"


def test_hostile_pickles_are_refused_in_one_line(tmp_path):
    for index, data in enumerate(HOSTILE_PICKLES):
        path = tmp_path / f"h{index}.pickle"
        path.write_bytes(data)
        _refused(["report", str(path)], str(path))


def _memo_bomb(tmp_path):
    path = tmp_path / "bomb.pickle"
    path.write_bytes(b"\x80\x02]r\xff\xff\xff\x7f.")     # memo index 2**31: a 16 GiB table
    return path


def test_a_memo_bomb_is_refused_before_it_costs_memory(tmp_path):
    """The reader sizes its memo by what the pickle has memoized, not by the index asked for:
    refusing the bomb costs no more than reading a small real snapshot."""
    script = ("import sys, resource\n"
              "from npumem.trace.snapshot import load_data\n"
              "try:\n    load_data(sys.argv[1])\n    print('read')\n"
              "except Exception as exc:\n    print(type(exc).__name__, exc)\n"
              "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    small = tmp_path / "small.pickle"
    small.write_bytes(pickle.dumps(snapshot_seed()))
    peaks = []
    for path in (small, _memo_bomb(tmp_path)):
        done = subprocess.run([sys.executable, "-c", script, str(path)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        message, peak_kib = done.stdout.splitlines()
        peaks.append(int(peak_kib))
    assert message.startswith("TraceFormatError") and "memo index 2147483647" in message, message
    assert peaks[1] < peaks[0] + (64 << 10), f"{(peaks[1] - peaks[0]) >> 10} MiB more to refuse 9 bytes"


def test_a_gzip_bomb_stops_at_the_size_limit(tmp_path, monkeypatch):
    path = tmp_path / "bomb.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps({"segments": [], "pad": b"\0" * (8 << 20)})))
    monkeypatch.setenv("NPUMEM_MAX_SNAPSHOT_BYTES", "1MiB")
    _refused(["report", str(path)], "NPUMEM_MAX_SNAPSHOT_BYTES")


def test_deep_nesting_is_refused_or_carried_without_a_traceback(tmp_path):
    data = snapshot_seed()
    data["extra"] = "PLACEHOLDER"
    text = pickle.dumps(data, protocol=2)
    deep = b"(" * 100_000 + b"]" + b"l" * 100_000       # 100k nested lists, built iteratively
    path = tmp_path / "deep.pickle"
    path.write_bytes(text.replace(b"X\x0b\x00\x00\x00PLACEHOLDER", deep))
    assert path.read_bytes() != text
    reported = CliRunner().invoke(main, ["report", str(path)])    # npumem never reads "extra"
    assert reported.exit_code == 0 and "peak allocated" in reported.output, reported.output
    _refused(["convert", str(path), str(tmp_path / "out.jsonl")], "nests too deeply")
    _refused(["convert", str(path), str(tmp_path / "out.pickle")], "nests too deeply")


def test_a_corrupt_gzip_stream_is_a_clear_error(tmp_path):
    """Found by atheris: a gzip header before bytes that are not deflate data (zlib.error)."""
    import base64

    path = tmp_path / "memory_record.csv"
    path.write_bytes(base64.b64decode("H4sIAG9uZW50MDAwMDAwMDAsMTcwMDAwMDAwMDAwMDAwLDguMCwwLjAwMCxULjUNLA0K"))
    for args in (["report", str(path)], ["replay", str(path)], ["convert", str(path),
                                                              str(tmp_path / "o.jsonl")]):
        _refused(args, str(path))
