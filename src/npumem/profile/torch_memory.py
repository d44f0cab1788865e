"""PyTorch's own memory, recorded while a profiled script runs: what `npumem profile` and
`npumem.profile.track()` see of a plain PyTorch program.

- cuda: the caching allocator's history (`torch.cuda.memory._record_memory_history`, Python
  stacks), then its snapshot: segments, blocks and every alloc, free and segment event.
- npu: the same through torch_npu (`torch.npu.memory`), which mirrors that API.
- cpu (no accelerator): the tensor recorder (`tensor_recorder`): every storage made and freed,
  with its Python stack and category. The CPU allocator caches nothing, so the recording has
  allocations and frees only, no segments.

On every device the tensor recorder tells each allocation's category (parameter, gradient,
optimizer state, activation, ...) and marks the program's steps (`optimizer.step()`, ...); on
cuda and npu it runs without stacks (the allocator's history has them) and its categories and
steps are laid onto the allocator's trace (`add_categories`).

Every recording is kept as a snapshot dict in PyTorch's format, so `npumem report`, leaks, the
timeline, `npumem replay` and `npumem tune` read it like a snapshot a user dumped. Recording
starts when torch is imported (an import hook), so a script that never imports torch pays
nothing, and one that does is recorded from its first tensor.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading


class TorchMemory:
    """Records PyTorch's memory from `start` to `stop`; `snapshot()` gives what was recorded.

    `cpu`: on a machine without an accelerator, record the CPU with the tensor recorder
    (`npumem profile` does, `track()` only when asked)."""

    def __init__(self, max_entries: int = 1_000_000, cpu: bool = True, sample_bytes: int = 0):
        self.max_entries, self.cpu = max_entries, cpu
        self.sample_bytes = sample_bytes        # the recorder's sampling (0: every storage)
        self.device: str | None = None          # "cuda", "npu" or "cpu" once recording
        self.error: str | None = None           # why nothing could be recorded
        self._lock = threading.Lock()
        self._running = False                   # between start and stop
        self._recording = False                 # PyTorch is recording for us now
        self._hook: _AfterImport | None = None
        self._recorder = None
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
            from .tensor_recorder import TensorRecorder
            self._recorder = TensorRecorder(self.max_entries, stacks=accelerator is None,
                                            sample_bytes=self.sample_bytes,
                                            addresses=True).start()
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
        self._recorder.stop()
        if self.device == "cpu":
            snapshot = self._recorder.snapshot()
        else:
            module = torch.get_device_module(self.device)
            module.synchronize()
            try:
                snapshot = module.memory._snapshot()
            finally:
                module.memory._record_memory_history(enabled=None)
            add_categories(snapshot, self._recorder.snapshot(), self.device)
        if self._out_of_memory is not None:
            from ..trace.snapshot.schema import OOM_KEY
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
    from ..trace.snapshot.schema import OOM_KEY

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


# --- categories and steps onto an allocator's trace -----------------------------------------

def add_categories(snapshot: dict, recorded: dict, device_type: str) -> None:
    """Lay the tensor recorder's categories and steps onto the caching allocator's trace: the
    n-th allocation at an address in the recorder is the n-th alloc entry there (a storage is
    one block). Entries the recorder did not see (made outside the dispatcher) get "other"."""
    names = recorded.get("npumem", {}).get("devices", [])
    for index, name in enumerate(names):
        kind, _, ordinal = name.partition(":")
        traces = snapshot.get("device_traces") or []
        if kind != device_type or not ordinal.isdigit() or int(ordinal) >= len(traces):
            continue
        mine, theirs = recorded["device_traces"][index], traces[int(ordinal)]
        queues: dict = {}
        allocs_before = []                      # recorder entry position -> allocs before it
        count = 0
        for entry in mine:
            allocs_before.append(count)
            if entry["action"] == "alloc":
                queues.setdefault(entry["addr"], []).append(entry["category"])
                count += 1
        allocs_before.append(count)
        positions, count = [], 0                # allocator position of each alloc
        categories = {}
        for position, entry in enumerate(theirs):
            action = entry.get("action")
            if action == "alloc":
                positions.append(position)
                queue = queues.get(entry.get("addr"))
                entry["category"] = categories[entry.get("addr")] = (
                    queue.pop(0) if queue else "other")
            elif action in ("free_requested", "free_completed"):
                entry["category"] = categories.get(entry.get("addr"), "other")
        notes = snapshot.setdefault("external_annotations", [])
        for note in recorded.get("external_annotations") or []:
            if note.get("device") != index:
                continue
            before = allocs_before[min(note["npumem_entry"], len(allocs_before) - 1)]
            at = positions[before] if before < len(positions) else len(theirs)
            notes.append(dict(note, device=int(ordinal), npumem_entry=at))
