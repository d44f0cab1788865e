"""PyTorch's own memory, recorded while a profiled script runs: what `npumem profile` and
`npumem.profile.track()` see of a plain PyTorch program.

- cuda: the caching allocator's history (`torch.cuda.memory._record_memory_history`, Python
  stacks), then its snapshot: segments, blocks and every alloc, free and segment event.
- npu: the same through torch_npu (`torch.npu.memory`), which mirrors that API.
- cpu (no accelerator): `torch.profiler` memory events with Python stacks. The CPU allocator
  caches nothing, so the recording has allocations and frees only, no segments. The profiler
  names each Python function by its first line, so sites are functions, not lines.

Every recording is kept as a snapshot dict in PyTorch's format, so `npumem report`, leaks, the
timeline, `npumem replay` and `npumem tune` read it like a snapshot a user dumped. Recording
starts when torch is imported (an import hook), so a script that never imports torch pays
nothing, and one that does is recorded from its first tensor.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import re
import sys
import tempfile
import threading

CPU_DEVICE_TYPE = 0                 # "Device Type" of a CPU [memory] event in a profiler trace
_PYTHON_FRAME = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<name>.+)$")
# Frames of what runs the user's script (npumem's runner, click, the profiler), not of the script.
_RUNNER_FILES = ("npumem/", "click/", "torch/profiler/", "runpy", "<")


class TorchMemory:
    """Records PyTorch's memory from `start` to `stop`; `snapshot()` gives what was recorded.

    `cpu`: on a machine without an accelerator, record the CPU through torch.profiler (it traces
    every Python call, which slows the script down; `npumem profile` does, `track()` only when
    asked)."""

    def __init__(self, max_entries: int = 1_000_000, cpu: bool = True):
        self.max_entries, self.cpu = max_entries, cpu
        self.device: str | None = None          # "cuda", "npu" or "cpu" once recording
        self.error: str | None = None           # why nothing could be recorded
        self._lock = threading.Lock()
        self._running = False                   # between start and stop
        self._recording = False                 # PyTorch is recording for us now
        self._hook: _AfterImport | None = None
        self._profiler = None
        self._snapshot: dict | None = None
        self._out_of_memory: dict | None = None   # what c10 told its OOM observers, first time

    def start(self) -> "TorchMemory":
        with self._lock:
            if self._running:
                return self
            self._running = True
        if "torch" in sys.modules:
            self._begin(sys.modules["torch"])
        elif importlib.util.find_spec("torch") is not None:
            self._hook = _AfterImport("torch", self._begin)
            sys.meta_path.insert(0, self._hook)
        return self

    def stop(self) -> "TorchMemory":
        with self._lock:
            if not self._running:
                return self
            self._running = False
        if self._hook is not None and self._hook in sys.meta_path:
            sys.meta_path.remove(self._hook)
        try:
            self._snapshot = self._end()
        except Exception as exc:            # noqa: BLE001 - the script's run still counts
            self.error = f"reading PyTorch's recording failed: {type(exc).__name__}: {exc}"
        return self

    def snapshot(self) -> dict | None:
        """The recording as a PyTorch-format snapshot dict (None: torch was never used)."""
        return self._snapshot

    # --- per device ---------------------------------------------------------------------------

    def _begin(self, torch) -> None:
        if not self._running or self._recording:
            return
        try:
            accelerator = _accelerator(torch)
            if accelerator is not None:
                record = torch.get_device_module(accelerator).memory._record_memory_history
                try:                       # history from before this start is not ours
                    record(max_entries=self.max_entries, stacks="python", clear_history=True)
                except TypeError:          # a PyTorch without clear_history
                    record(max_entries=self.max_entries, stacks="python")
            elif not self.cpu:
                return
            else:
                self._profiler = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                    with_stack=True)
                self._profiler.__enter__()
            self.device, self._recording = accelerator or "cpu", True
            if accelerator == "cuda":
                watch_out_of_memory(torch, self._saw_out_of_memory)
        except Exception as exc:            # noqa: BLE001 - profile the rest all the same
            self.error = f"could not record PyTorch's memory: {type(exc).__name__}: {exc}"

    def _saw_out_of_memory(self, limits: dict) -> None:
        if self._recording and self._out_of_memory is None:
            self._out_of_memory = limits

    def _end(self) -> dict | None:
        if not self._recording:
            return None
        self._recording = False
        torch = sys.modules["torch"]
        if self.device == "cpu":
            snapshot = _cpu_snapshot(self._profiler)
        else:
            module = torch.get_device_module(self.device)
            module.synchronize()
            try:
                snapshot = module.memory._snapshot()
            finally:
                module.memory._record_memory_history(enabled=None)
        if self._out_of_memory is not None:
            from ..trace.snapshot_schema import OOM_KEY
            snapshot[OOM_KEY] = self._out_of_memory
        return snapshot if any(snapshot.get("device_traces") or []) else None   # no tensor made


# --- out of memory: the limit PyTorch was under, which the snapshot itself does not hold ---------

def watch_out_of_memory(torch, callback) -> None:
    """Call `callback(limits)` at each CUDA out-of-memory, `limits` being what c10 hands its
    observers: the device, the segment size it could not get, the memory PyTorch was allowed
    (set_per_process_memory_fraction's limit where one is set, else the device's total) and
    the driver's free bytes, with the device's total beside them."""
    def observer(device, alloc, allowed, device_free):
        total = torch.cuda.get_device_properties(device).total_memory
        callback({"device": int(device), "alloc_size": int(alloc), "allowed": int(allowed),
                  "device_free": int(device_free), "device_total": int(total)})

    torch._C._cuda_attach_out_of_memory_observer(observer)


def dump_snapshot_on_oom(path: str = "oom_snapshot.pickle") -> None:
    """At PyTorch's first CUDA out-of-memory, write the caching allocator's snapshot to `path`
    (what torch.cuda.memory._dump_snapshot writes) with the memory PyTorch was allowed, which
    `npumem tune` then judges every setting on. Call it after
    torch.cuda.memory._record_memory_history()."""
    import pickle

    import torch

    from ..output_files import written_whole
    from ..trace.snapshot_schema import OOM_KEY

    dumped = []

    def dump(limits: dict) -> None:
        if dumped:
            return
        dumped.append(path)
        snapshot = torch.cuda.memory._snapshot()
        snapshot[OOM_KEY] = limits
        with written_whole(path) as partial, open(partial, "wb") as out:
            pickle.dump(snapshot, out)

    watch_out_of_memory(torch, dump)


def _accelerator(torch) -> str | None:
    if torch.cuda.is_available():
        return "cuda"
    npu = getattr(torch, "npu", None)                # registered by import torch_npu
    if npu is not None and npu.is_available():
        return "npu"
    return None


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls `callback(module)` once module `name` has been imported (by anyone)."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback
        self._finding = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        execute, callback = spec.loader.exec_module, self.callback

        def exec_module(module):
            execute(module)
            callback(module)

        spec.loader.exec_module = exec_module
        return spec


# --- cpu: the profiler's memory events, with the Python stack around each -----------------------

def _cpu_snapshot(profiler) -> dict:
    profiler.__exit__(None, None, None)
    handle, path = tempfile.mkstemp(suffix=".json")
    os.close(handle)
    try:
        profiler.export_chrome_trace(path)
        with open(path, encoding="utf-8") as stream:
            trace = json.load(stream)
    finally:
        os.unlink(path)
    return snapshot_from_profiler_trace(trace)


def snapshot_from_profiler_trace(trace: dict) -> dict:
    """A PyTorch-format snapshot of the CPU [memory] events of a torch.profiler chrome trace,
    each alloc with the Python functions running at the time (innermost first)."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else []
    timeline = []
    for event in events:
        if not isinstance(event, dict) or "ts" not in event:
            continue
        if event.get("cat") == "python_function" and "dur" in event:
            frame = _PYTHON_FRAME.match(str(event.get("name", "")))
            if frame:
                timeline.append((float(event["ts"]), 0, event.get("tid"), float(event["dur"]), {
                    "filename": frame["file"], "line": int(frame["line"]), "name": frame["name"]}))
        elif event.get("name") == "[memory]":
            args = event.get("args") or {}
            if args.get("Device Type") == CPU_DEVICE_TYPE and args.get("Bytes"):
                timeline.append((float(event["ts"]), 1, event.get("tid"), 0.0, args))
    timeline.sort(key=lambda item: (item[0], item[1]))
    open_frames: dict = {}                  # thread -> [(end, frame)], outermost first
    entries, live, earlier = [], set(), 0
    for ts, kind, thread, duration, payload in timeline:
        stack = open_frames.setdefault(thread, [])
        while stack and stack[-1][0] <= ts:
            stack.pop()
        if kind == 0:
            if not payload["filename"].startswith(_RUNNER_FILES):
                stack.append((ts + duration, payload))
            continue
        size, addr = int(payload["Bytes"]), int(payload["Addr"])
        if size < 0 and addr not in live:
            earlier += 1                    # allocated before recording began (torch's import)
            continue
        if size > 0:
            live.add(addr)
            entries.append({"action": "alloc", "addr": addr, "size": size, "stream": 0,
                            "time_us": ts, "frames": [frame for _, frame in reversed(stack)]})
            continue
        live.discard(addr)             # a CPU free is done at once: requested and completed
        entries += [{"action": action, "addr": addr, "size": -size, "stream": 0, "time_us": ts,
                     "frames": []} for action in ("free_requested", "free_completed")]
    return {"segments": [], "device_traces": [entries],
            "npumem": {"source": "torch.profiler memory events (cpu)",
                       "frees_of_earlier_allocations": earlier}}
