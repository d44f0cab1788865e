"""The tensor recorder: every storage made and freed, its stack and its category, in PyTorch's
snapshot format, bounded, and over fake tensors too."""

from __future__ import annotations

import gc
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from npumem.profile.tensor_recorder import TensorRecorder  # noqa: E402


def train(steps: int, leak: list | None = None, width: int = 32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(width, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        loss = model(torch.randn(16, width)).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if leak is not None:
            leak.append(model(torch.randn(16, width)).sum())     # its graph stays alive
    return model, optimizer


def allocs(snapshot, device: int = 0):
    return [e for e in snapshot["device_traces"][device] if e["action"] == "alloc"]


def test_every_storage_is_an_alloc_and_a_free_with_its_size():
    with TensorRecorder() as recorder:
        a = torch.empty(100)                  # 400 bytes
        b = a.view(10, 10)                    # a view: no new storage
        a.add_(1)                             # in place: none either
        c = a + 1
        del a, b, c
        gc.collect()
    entries = recorder.snapshot()["device_traces"][0]
    assert [(e["action"], e["size"]) for e in entries] == [        # a free as PyTorch's CPU
        ("alloc", 400), ("alloc", 400), ("free_requested", 400), ("free_completed", 400),
        ("free_requested", 400), ("free_completed", 400)]
    assert entries[0]["addr"] != entries[1]["addr"]


def test_the_stack_is_the_users_line():
    with TensorRecorder() as recorder:
        kept = torch.zeros(1000)
    frames = allocs(recorder.snapshot())[0]["frames"]
    assert frames[0]["filename"] == __file__
    assert frames[0]["name"] == "test_the_stack_is_the_users_line"
    assert kept.numel() == 1000


def test_categories_of_a_training_loop():
    with TensorRecorder() as recorder:
        train(steps=3)
    snapshot = recorder.snapshot()
    kinds = Counter(e["category"] for e in allocs(snapshot))
    assert kinds["parameter"] == 4                           # two weights, two biases
    assert kinds["optimizer_state"] == 3 * 4      # AdamW: exp_avg, exp_avg_sq, the step count
    assert kinds["gradient"] >= 4 and kinds["input"] == 3 and kinds["activation"] >= 3
    assert kinds["temporary"] > 0
    assert set(kinds) <= {"parameter", "optimizer_state", "gradient", "input", "activation",
                          "temporary", "other"}
    steps = [a for a in snapshot["external_annotations"] if a["name"] == "npumem.memory.step"]
    assert [a["source"] for a in steps] == ["optimizer.step"] * 3
    entries = snapshot["device_traces"][0]
    assert all(0 < a["npumem_entry"] <= len(entries) for a in steps)


def test_a_leaked_graph_is_other_and_stays_live():
    kept: list = []
    with TensorRecorder() as recorder:
        train(steps=4, leak=kept)
    entries = recorder.snapshot()["device_traces"][0]
    live = Counter()
    for e in entries:
        live[e["addr"]] += {"alloc": 1, "free_completed": -1}.get(e["action"], 0)
    alive = [e for e in entries if e["action"] == "alloc" and live[e["addr"]] > 0]
    assert sum(e["category"] in ("activation", "other") for e in alive) >= 4 * 2
    assert len(kept) == 4


def test_the_ring_keeps_the_newest_events():
    with TensorRecorder(max_events=50) as recorder:
        for _ in range(200):
            torch.ones(8)
    snapshot = recorder.snapshot()
    entries = snapshot["device_traces"][0]
    kept = sum(1 for e in entries if e["action"] != "free_requested")    # one event each
    assert 50 <= kept < 100 and snapshot["npumem"]["dropped_events"] == 400 - kept


def test_sampling_keeps_large_allocations_and_counts_what_it_left_out():
    with TensorRecorder(sample_bytes=1 << 20) as recorder:
        big = torch.empty(1 << 20)           # 4 MiB: always kept
        small = [torch.empty(16) for _ in range(2000)]     # 64 bytes each: about 1 in 16384
    snapshot = recorder.snapshot()
    sizes = [e["size"] for e in allocs(snapshot)]
    assert 4 << 20 in sizes and len(sizes) < 20
    assert snapshot["npumem"]["sampled_out_bytes"] >= 64 * 1900
    assert big.numel() and len(small) == 2000


def test_it_records_fake_tensors_which_have_no_memory():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), TensorRecorder() as recorder:
        x = torch.empty(1024, 1024)
        y = x @ x
        del x, y
    entries = recorder.snapshot()["device_traces"][0]
    assert [(e["action"], e["size"]) for e in entries][:2] == [("alloc", 4 << 20)] * 2


def test_stop_takes_every_hook_down():
    from torch.nn.modules import module as nn_module

    hooks = len(nn_module._global_forward_pre_hooks)
    recorder = TensorRecorder().start()
    recorder.stop()
    assert len(nn_module._global_forward_pre_hooks) == hooks
    torch.ones(4)                              # no longer recorded
    assert recorder.events == 0


def test_categories_and_steps_are_laid_onto_an_allocators_trace():
    from npumem.profile.torch_memory import add_categories

    def entry(action, addr, size=512, category=None):
        e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 0,
             "frames": []}
        if category:
            e["category"] = category
        return e

    recorded = {"npumem": {"devices": ["cpu", "cuda:0"]}, "device_traces": [
        [entry("alloc", 7, category="input")],
        [entry("alloc", 0x100, category="parameter"), entry("alloc", 0x200, category="temporary"),
         entry("free_requested", 0x200, category="temporary"),
         entry("free_completed", 0x200, category="temporary"),
         entry("alloc", 0x200, category="activation")]],
        "external_annotations": [{"name": "npumem.memory.step", "stage": "START", "device": 1,
                                  "time_us": 5.0, "npumem_entry": 4, "source": "optimizer.step"}]}
    allocator = {"segments": [], "device_traces": [[
        entry("segment_alloc", 0x100, 2 << 20), entry("alloc", 0x100), entry("alloc", 0x200),
        entry("free_requested", 0x200), entry("free_completed", 0x200), entry("alloc", 0x200),
        entry("alloc", 0x900)]]}
    add_categories(allocator, recorded, "cuda")
    trace = allocator["device_traces"][0]
    assert [e.get("category") for e in trace] == [
        None, "parameter", "temporary", "temporary", "temporary", "activation", "other"]
    step, = allocator["external_annotations"]
    assert step["device"] == 0 and step["npumem_entry"] == 5     # before the third alloc


def test_without_marks_the_repeated_step_is_learned_and_growth_found():
    from npumem.profile.step_leaks import step_leaks, step_starts

    weights = [torch.ones(64, 96), torch.ones(96, 80), torch.ones(80, 64)]
    kept = []
    with TensorRecorder() as recorder:
        for _ in range(30):                     # no optimizer, no step marks
            x = torch.ones(16, 64)
            for w in weights:
                x = torch.relu(x @ w)
            kept.append(torch.empty(1000))      # the line that leaks
    snapshot = recorder.snapshot()
    starts = step_starts(snapshot, 0)
    assert len(starts) >= 20
    first, *_ = step_leaks(snapshot, 0)
    assert first.where.endswith("in test_without_marks_the_repeated_step_is_learned_and_growth_found")
    assert first.per_step == 4000


def test_torch_compile_runs_under_the_recorder_without_tracing_into_it():
    import warnings

    def f(x):
        return torch.relu(x @ x) + 1

    compiled = torch.compile(f, backend="eager")
    with warnings.catch_warnings(record=True) as caught, TensorRecorder() as recorder:
        warnings.simplefilter("always")
        result = compiled(torch.ones(8, 8))
    assert torch.equal(result, f(torch.ones(8, 8)))
    assert not [w for w in caught if "Dynamo" in str(w.message)]
    assert recorder.events > 0


def sgd_steps(steps: int, keep) -> tuple[dict, list]:
    """A recording of `steps` SGD steps of a small model; `keep(step)` gives a tensor to keep
    at the start of a step (or None)."""
    kept = []
    with TensorRecorder() as recorder:
        model = torch.nn.Linear(8, 8)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(steps):
            tensor = keep(step)
            if tensor is not None:
                kept.append(tensor)
            model(torch.ones(2, 8)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    return recorder.snapshot(), kept


def test_memory_made_now_and_then_over_many_steps_is_no_leak():
    from npumem.profile.step_leaks import step_leaks

    # a cache filled twice in 40 steps
    snapshot, kept = sgd_steps(40, lambda step: torch.empty(100) if step in (5, 20) else None)
    assert step_leaks(snapshot, 0) == [] and len(kept) == 2


def test_inputs_given_by_keyword_are_inputs():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 4)

        def forward(self, x=None, mask=None):
            return self.layer(x) * mask

    net = Net()
    with TensorRecorder() as recorder:
        tokens, mask = torch.ones(3, 4), torch.ones(3, 4)
        net(x=tokens, mask=mask).sum()
    kinds = [e["category"] for e in allocs(recorder.snapshot())[:2]]
    assert kinds == ["input", "input"]


def test_growth_per_step_is_the_rise_over_the_steps_it_grew_in():
    from npumem.profile.step_leaks import step_leaks

    # 1 KiB kept each step, before its boundary
    snapshot, kept = sgd_steps(5, lambda step: torch.empty(256))
    leak, = step_leaks(snapshot, 0)
    assert leak.per_step == 1024 and leak.live == 5 * 1024


def test_a_report_says_when_the_ring_dropped_events():
    from npumem.profile.report import build_report

    with TensorRecorder(max_events=20) as recorder:
        for _ in range(50):
            torch.ones(8)
    notes = build_report(recorder.snapshot(), "ring").notes
    assert any("events fell out of the recorder's ring" in note for note in notes)
