"""bench/record_workloads.py writes traces npumem reads back and replays."""

import importlib.util
import pathlib

import pytest

pytest.importorskip("torch")

from npumem.trace import read_trace  # noqa: E402
from npumem.whatif.replay import replay  # noqa: E402

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "bench" / "record_workloads.py"


def _module():
    spec = importlib.util.spec_from_file_location("record_workloads", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_recorded_workload_replays(tmp_path):
    path, count = _module().record("mlp", tmp_path)
    events = list(read_trace(str(path)))
    assert path.name == "mlp.jsonl.gz" and len(events) == count > 100
    allocs = [e for e in events if e.action == "alloc"]
    # the batch of 256 x 784 float32 inputs is among the blocks, and the pool beats PyTorch's policy
    assert 256 * 784 * 4 in {e.size for e in allocs}
    pool, torch_policy = replay(events, "pool"), replay(events, "torch")
    assert pool.peak_allocated_bytes == torch_policy.peak_allocated_bytes > 0
    assert pool.peak_reserved_bytes < torch_policy.peak_reserved_bytes


def test_unknown_workload_names_the_choices(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["record_workloads.py", str(tmp_path), "resnet152"])
    with pytest.raises(SystemExit):
        _module().main()
    err = capsys.readouterr().err
    assert "unknown workload(s) resnet152" in err and "cnn_sgd" in err
