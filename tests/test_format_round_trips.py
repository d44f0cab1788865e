"""Conversions keep what each format can hold (issue 20, item 3), on real-shaped data: a snapshot
recorded on a GPU (tests/data). A whole snapshot survives JSONL and pickle entire; between any
two formats, every allocation and free keeps its order, size and what else both can hold."""

import itertools
import pickle
from pathlib import Path

import pytest
from click.testing import CliRunner

from npumem.cli import main
from npumem.trace import read_trace, write_trace
from npumem.trace.snapshot import load_data

RECORDED = Path(__file__).parent / "data" / "cuda_snapshots" / "gpt_train.pickle.gz"
SUFFIX = {"jsonl": "t.jsonl", "chrome": "t.json", "snapshot": "t.pickle", "rmm": "t.csv",
          "msprof": "operator_memory.csv"}
HOLDS = {                     # what survives a format, beyond the order of allocs and frees
    "jsonl": {"addr", "size", "stream", "time"}, "chrome": {"addr", "size", "stream", "time"},
    "snapshot": {"addr", "size", "stream", "time"}, "rmm": {"addr", "size", "stream", "time"},
    "msprof": {"size", "stream", "time"},       # no addresses: rows are numbered
}


def test_a_whole_snapshot_survives_jsonl_and_pickle(tmp_path):
    original = load_data(str(RECORDED))
    assert original["segments"] and any(e.get("frames") for e in original["device_traces"][0])
    jsonl, back = tmp_path / "s.jsonl.gz", tmp_path / "s.pickle"
    for source, target in ((RECORDED, jsonl), (jsonl, back)):
        result = CliRunner().invoke(main, ["convert", str(source), str(target)])
        assert result.exit_code == 0, result.output
    assert load_data(str(jsonl)) == original
    with open(back, "rb") as handle:
        assert pickle.load(handle) == original           # segments, frames, actions, settings
    check = CliRunner().invoke(main, ["replay", "--check", str(jsonl)])
    assert check.exit_code == 0 and "MATCH" in check.output


def _comparable(events, keep: set) -> list[tuple]:
    start = events[0].t_us
    return [(e.action,
             e.size,
             e.addr if "addr" in keep else None,
             e.stream if "stream" in keep else None,
             round(e.t_us - start) if "time" in keep else None) for e in events]


@pytest.fixture(scope="module")
def events():
    # whole microseconds within one day, as every format can hold them (RMM writes times of day);
    # three streams, with CUDA-pointer-sized handles (an alloc and its free share theirs)
    streams = [0, 0x7F3A5C000000, 0x7F3A5C100000]
    return [e._replace(t_us=float(int(e.t_us)) % 86_400e6, stream=streams[e.addr // 512 % 3])
            for e in read_trace(str(RECORDED))]


@pytest.mark.parametrize("first, second", list(itertools.permutations(SUFFIX, 2)))
def test_round_trip_between_two_formats(tmp_path, events, first, second):
    a, b, again = tmp_path / f"a_{SUFFIX[first]}", tmp_path / f"b_{SUFFIX[second]}", \
        tmp_path / f"c_{SUFFIX[first]}"
    write_trace(events, str(a), first)
    for source, target in ((a, b), (b, again)):
        result = CliRunner().invoke(main, ["convert", str(source), str(target)])
        assert result.exit_code == 0, result.output
    keep = HOLDS[first] & HOLDS[second]
    before, after = list(read_trace(str(a))), list(read_trace(str(again)))
    assert _comparable(after, keep) == _comparable(before, keep)
