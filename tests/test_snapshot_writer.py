"""Writing a snapshot whose traces are columns (trace/snapshot/pickle_writer.py): the pickle
holds what the snapshot read held, for Python's unpickler and for npumem's reader, and the
entries become dicts a chunk at a time."""

import gzip
import pathlib
import pickle

import pytest

from npumem.trace.file_checks import shown
from npumem.trace.snapshot import load_data, pickle_writer, save
from npumem.trace.snapshot.columns import Entries, load_pickle

DATA = pathlib.Path(__file__).parent / "data"


def _frames(*lines):
    return [{"filename": "train.py", "line": line, "name": "step"} for line in lines]


def _two_devices() -> dict:
    shared = _frames(1, 2, 3)
    traces = [[{"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0, "time_us": i,
                "frames": shared if i % 2 else _frames(i), "compile_context": "N/A"}
               for i in range(7)],
              [{"action": "free_requested", "addr": 8, "size": 2**64 - 1, "time_us": 1.5},
               {"action": "oom", "size": 10, "device_free": 3, "frames": shared}]]
    return {"segments": [{"address": 0, "total_size": 1 << 20, "blocks": [],
                          "frames": shared}],
            "device_traces": traces, "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


def _read_back(path) -> dict:
    raw = pathlib.Path(path).read_bytes()
    return pickle.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


@pytest.mark.parametrize("chunk", [1, 3, 1 << 16])
@pytest.mark.parametrize("suffix", [".pickle", ".pickle.gz"])
def test_a_snapshot_read_as_columns_is_written_back_whole(tmp_path, monkeypatch, chunk, suffix):
    monkeypatch.setattr(pickle_writer, "_CHUNK", chunk)
    expected = _two_devices()
    _, devices, _ = load_pickle(pickle.dumps(expected), shown)
    data = {**expected, "device_traces": devices}
    assert pickle_writer.streams(data)
    path = tmp_path / f"out{suffix}"
    assert save(data, str(path)) == 9
    assert _read_back(path) == expected
    again = load_data(str(path))
    assert [list(trace) for trace in again["device_traces"]] == expected["device_traces"]


@pytest.mark.parametrize("folder", ["cuda_snapshots", "cuda_snapshots_h200", "cuda_oom_h200"])
def test_the_projects_recordings_are_written_back_as_pickle_reads_them(tmp_path, folder):
    """PyTorch's own files (the H200 ones carry user_metadata, device_free, segment_map...)."""
    paths = sorted((DATA / folder).rglob("*.pickle.gz"))[:4]
    assert paths
    for path in paths:
        expected = pickle.loads(gzip.decompress(path.read_bytes()))
        out = tmp_path / path.name
        save(load_data(str(path)), str(out))
        assert _read_back(out) == expected, path


def test_entries_become_dicts_a_chunk_at_a_time(tmp_path, monkeypatch):
    """Never the whole trace at once: each walk over entries covers at most a chunk."""
    monkeypatch.setattr(pickle_writer, "_CHUNK", 2)
    walked = []
    iterate = Entries.__iter__

    def counting(self):
        walked.append(len(self))
        return iterate(self)

    monkeypatch.setattr(Entries, "__iter__", counting)
    _, devices, _ = load_pickle(pickle.dumps(_two_devices()), shown)
    save({**_two_devices(), "device_traces": devices}, str(tmp_path / "out.pickle"))
    assert walked and max(walked) <= 2


def test_traces_held_as_dicts_are_pickled_as_they_are(tmp_path):
    expected = _two_devices()
    assert not pickle_writer.streams(expected)
    save(expected, str(tmp_path / "out.pickle"))
    assert _read_back(tmp_path / "out.pickle") == expected


def test_entries_that_share_a_stack_share_it_in_the_file(tmp_path):
    """The chunks find the stacks in the memo (fast mode still looks there): one list."""
    _, devices, _ = load_pickle(pickle.dumps(_two_devices()), shown)
    save({**_two_devices(), "device_traces": devices}, str(tmp_path / "out.pickle"))
    trace = _read_back(tmp_path / "out.pickle")["device_traces"][0]
    assert trace[1]["frames"] is trace[3]["frames"] is trace[5]["frames"]
