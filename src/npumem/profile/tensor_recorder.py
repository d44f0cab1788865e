"""Every storage a PyTorch program creates and frees, with the Python stack that created it and
what it is for (its category), recorded at the dispatcher: the CPU's memory, which has no
caching allocator to ask, and fake tensors, which have no memory at all.

A `TorchDispatchMode` sees each operator's outputs; a storage not seen before is an allocation,
and a weak reference to it calls back when PyTorch frees it. Module, autograd and optimizer
hooks say what a storage holds (`categories`); `optimizer.step()`, `torch.profiler`'s
`step()` and `npumem.memory.step()` mark steps. Events go into integer columns that keep the
newest `max_events` (a ring); `sample_bytes` keeps one allocation in about that many bytes of
the small ones, for loops too hot to record whole.

`snapshot()` writes PyTorch's snapshot format (what `torch.cuda.memory._snapshot()` returns),
so `npumem report`, `diff`, `replay` and `tune` read a recording like any snapshot: each alloc
entry carries `category`, and each step an external annotation.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
import weakref
from array import array
from functools import partial

from . import categories as cat
from ..trace.step_marks import NPUMEM_STEP as STEP
from .stacks import capture_above, resolve_user

ALLOC, FREE = 0, 1
DEFAULT_STACK_DEPTH = 48
BACKWARD = "<backward>"             # a stack's first item where autograd's thread allocated
FORWARD_KEPT = 1 << 21              # forward stacks kept for their backward (newest)
# PyTorch's wrappers around a dispatch mode's __torch_dispatch__ (its dynamo guard)
_GUARD_FILES = (f"{os.sep}_dynamo{os.sep}eval_frame.py", f"{os.sep}torch{os.sep}_compile.py")


def _frames_to_dispatch(frame) -> int:
    """How many frames from `frame` (counted as 1) up to the code that called the operator:
    through the mode's __torch_dispatch__ and the guards PyTorch wraps it in."""
    count = 1
    while frame is not None and frame.f_code.co_name != "__torch_dispatch__":
        frame, count = frame.f_back, count + 1
    frame, count = frame.f_back, count + 1
    while frame is not None and frame.f_code.co_filename.endswith(_GUARD_FILES):
        frame, count = frame.f_back, count + 1
    return count


class TensorRecorder:
    """Record from `start()` to `stop()`; `snapshot()` returns what was recorded."""

    def __init__(self, max_events: int = 1_000_000, stacks: bool = True,
                 stack_depth: int = DEFAULT_STACK_DEPTH, sample_bytes: int = 0,
                 addresses: bool = False):
        if max_events < 1:
            raise ValueError(f"max_events must be at least 1, got {max_events}")
        self.max_events, self.stacks, self.stack_depth = max_events, stacks, stack_depth
        self.sample_bytes = sample_bytes
        self.addresses = addresses          # entries carry data_ptr (real tensors only)
        self._lock = threading.RLock()     # a free can arrive while an alloc is recorded
        # the event columns (one row per event; the oldest are dropped past 2 x max_events)
        self._action, self._time, self._key = array("b"), array("q"), array("q")
        self._size, self._stack, self._device = array("q"), array("q"), array("h")
        self._stream = array("q")
        self._first = 0                     # the number of events dropped from the front
        self._stacks: list = []             # stack id -> raw stack (stacks.capture_above)
        self._stack_ids: dict = {}
        # storage key -> [event number, size, category, weak ref, device, address]
        self._live: dict = {}
        self._category_of: dict = {}        # alloc event number -> category, once known
        self._steps: list = []              # (event number, time ns, source)
        self._devices: dict = {}            # device (str) -> index
        self._mode = None
        self._undo: list = []               # what stop() takes down
        self._skipped_bytes = 0             # allocations sampling left out
        self._random = random.Random(0)
        self.started_ns = 0
        self._skip = None                   # frames of the recorder above an op's caller
        self._labels: dict = {}             # alloc event number -> what made it (record_extra)
        # intercept(func, args, kwargs, outputs) replaces the call of each operator: it calls
        # func (or answers for it) and hands the result to outputs (npumem estimate)
        self.intercept = None
        self.listener = None                # listener(action, key, size, device) on each event
        self.stream = None                  # stream() -> the current stream's id (default: 0)
        # backward_owners: an allocation with no Python stack (autograd's device threads) is
        # owned by the autograd node that made it, at its forward's stack (npumem estimate)
        self.backward_owners = False
        self._forward_of: dict = {}         # autograd sequence number -> its forward's raw stack
        self._last_sequence = -1

    # --- start and stop --------------------------------------------------------------------------

    def start(self) -> "TensorRecorder":
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        outputs, intercept = self._outputs, self.intercept
        self._sequence_nr = torch._C._autograd._get_sequence_nr
        self._current_node = torch._C._current_autograd_node

        class _Mode(TorchDispatchMode):
            # PyTorch wraps this in a dynamo-disabling guard (about 4 us an op): without it,
            # torch.compile would trace into the recorder and break its graphs there. An
            # intercepting caller (npumem estimate) runs torch.compile eagerly: no guard then
            @classmethod
            def _should_skip_dynamo(cls):
                return intercept is None

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if intercept is not None:
                    return intercept(func, args, kwargs or {}, outputs)
                out = func(*args, **(kwargs or {}))
                outputs(out)
                return out

        self._tensor_type = torch.Tensor
        self.started_ns = time.perf_counter_ns()
        self._mode = _Mode()
        self._mode.__enter__()
        self._undo.append(lambda: self._mode.__exit__(None, None, None))
        self._undo += cat.install(torch, self)
        return self

    def stop(self) -> "TensorRecorder":
        while self._undo:
            self._undo.pop()()
        return self

    def __enter__(self) -> "TensorRecorder":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- what the dispatcher hands out -----------------------------------------------------------

    def _outputs(self, out) -> None:
        tensor_type = self._tensor_type
        if isinstance(out, tensor_type):
            self._tensor(out)
        elif isinstance(out, (tuple, list)):
            for item in out:
                if isinstance(item, tensor_type):
                    self._tensor(item)

    def _tensor(self, tensor) -> None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):   # sparse and other storage-less tensors
            return
        key = storage._cdata
        size = storage.nbytes()
        seen = self._live.get(key)
        if seen is not None:
            if seen[1] == size:
                return                       # a view, or an op in place
            self._freed(key, None)           # resized: PyTorch allocated anew
        if size == 0:
            return
        if self.sample_bytes and size < self.sample_bytes:
            if self._random.random() * self.sample_bytes >= size:
                self._skipped_bytes += size
                return
        raw = capture_above(self._own_frames(), self.stack_depth) if self.stacks else ()
        if self.backward_owners and self.stacks:
            raw = self._owned(raw)
        with self._lock:
            stack = self._stack_ids.get(raw)
            if stack is None:
                stack = self._stack_ids[raw] = len(self._stacks)
                self._stacks.append(raw)
            device = self._device_index(tensor.device)
            stream = self.stream() if self.stream is not None else 0
            number = self._append(ALLOC, storage.data_ptr() if self.addresses else key, size,
                                  stack, device, stream)
            self._live[key] = [number, size, None, weakref.ref(storage, partial(self._freed, key)),
                               device, self._key[-1], stream]
        if self.listener is not None:
            self.listener(ALLOC, key, size, device)

    def _owned(self, raw: tuple) -> tuple:
        """A Python stack is kept as the forward of the autograd node its operator made, if it
        made one (the sequence number moved: autograd numbers a node before dispatching its
        operator); an allocation without one, on autograd's thread, gets (BACKWARD, the node,
        its forward's stack)."""
        if raw:
            sequence = self._sequence_nr()
            if sequence != self._last_sequence:
                self._last_sequence = sequence
                forward = self._forward_of
                forward[sequence - 1] = raw
                if len(forward) > FORWARD_KEPT:
                    for key in list(forward)[:FORWARD_KEPT // 2]:
                        del forward[key]
            return raw
        node = self._current_node()
        if node is None:                     # another C++ thread: no owner to name
            return raw
        return (BACKWARD, node.name(), self._forward_of.get(node._sequence_nr(), ()))

    def _own_frames(self) -> int:
        """Frames between _tensor and the code that called the op: _outputs, the mode's
        __torch_dispatch__ and the guards PyTorch wraps it in (counted once)."""
        if self._skip is None:
            self._skip = _frames_to_dispatch(sys._getframe(2))   # 0: this, 1: _tensor
        return self._skip

    def _freed(self, key: int, _ref) -> None:
        with self._lock:
            seen = self._live.pop(key, None)
            if seen is None:
                return
            number, size, category, _, device, address, stream = seen
            if category is not None:
                self._category_of[number] = category
            self._append(FREE, address, size, -1, device, stream)   # to its stream's pool
        if self.listener is not None:
            self.listener(FREE, key, size, device)

    def record_extra(self, size: int, device, label: str, temporary: bool) -> None:
        """An allocation no tensor shows: a kernel's workspace (`label` says which), made at the
        current operator's stack; `temporary` frees it at once, else it lives to the end."""
        raw = capture_above(_frames_to_dispatch(sys._getframe(1)), self.stack_depth) \
            if self.stacks else ()
        if self.backward_owners and self.stacks and not raw:
            raw = self._owned(raw)
        with self._lock:
            stack = self._stack_ids.get(raw)
            if stack is None:
                stack = self._stack_ids[raw] = len(self._stacks)
                self._stacks.append(raw)
            index = self._device_index(device)
            key = -(len(self._labels) + 1)        # no storage has a negative key
            stream = self.stream() if self.stream is not None else 0
            number = self._append(ALLOC, key, size, stack, index, stream)
            self._labels[number] = label
            self._category_of[number] = cat.TEMPORARY if temporary else cat.OTHER
            if temporary:
                self._append(FREE, key, size, -1, index, stream)
        if self.listener is not None:
            self.listener(ALLOC, key, size, index)
            if temporary:
                self.listener(FREE, key, size, index)

    def _append(self, action: int, key: int, size: int, stack: int, device: int,
                stream: int = 0) -> int:
        self._action.append(action)
        self._time.append(time.perf_counter_ns())
        self._key.append(key)
        self._size.append(size)
        self._stack.append(stack)
        self._device.append(device)
        self._stream.append(stream)
        if len(self._action) >= 2 * self.max_events:       # keep the newest max_events
            drop = len(self._action) - self.max_events
            for column in (self._action, self._time, self._key, self._size, self._stack,
                           self._device, self._stream):
                del column[:drop]
            self._first += drop
            first = self._first                  # categories of dropped allocations go too
            self._category_of = {n: c for n, c in self._category_of.items() if n >= first}
        return self._first + len(self._action) - 1

    def _device_index(self, device) -> int:
        name = str(device)
        index = self._devices.get(name)
        if index is None:
            index = self._devices[name] = len(self._devices)
        return index

    # --- what the hooks learn --------------------------------------------------------------------

    def categorize(self, tensor, category: str) -> None:
        """`tensor`'s storage holds `category` (the strongest category it was given wins)."""
        try:
            key = tensor.untyped_storage()._cdata
        except (AttributeError, RuntimeError, NotImplementedError):
            return
        with self._lock:
            seen = self._live.get(key)
            if seen is not None and cat.stronger(category, seen[2]):
                seen[2] = category

    def mark_step(self, source: str) -> None:
        with self._lock:
            self._steps.append((self._first + len(self._action), time.perf_counter_ns(), source))

    # --- the recording ---------------------------------------------------------------------------

    @property
    def events(self) -> int:
        return len(self._action)

    @property
    def devices(self) -> list[str]:
        """The devices seen, in the order of their index in events and listener calls."""
        return list(self._devices)

    def snapshot(self) -> dict:
        """PyTorch's snapshot format: one device trace per device seen (in order of first use),
        alloc and free_completed entries with frames and category, steps as annotations."""
        with self._lock:
            categories = dict(self._category_of)
            for number, _, category, *_ in self._live.values():
                if category is not None:
                    categories[number] = category
            devices = list(self._devices) or ["cpu"]
            traces: list[list] = [[] for _ in devices]
            resolved: dict = {}
            first = self._first
            alloc_of: dict = {}              # key -> category of its live allocation
            steps = [step for step in self._steps if step[0] >= first]
            annotations, next_step = [], 0
            for row in range(len(self._action)):
                number = first + row
                while next_step < len(steps) and steps[next_step][0] <= number:
                    annotations += self._step_annotations(steps[next_step], traces)
                    next_step += 1
                action, key, size = self._action[row], self._key[row], self._size[row]
                when = (self._time[row] - self.started_ns) / 1000.0
                entry = {"action": "alloc" if action == ALLOC else "free_completed",
                         "addr": key, "size": size, "stream": self._stream[row], "time_us": when}
                if action == ALLOC:
                    stack = self._stack[row]
                    frames = resolved.get(stack)
                    if frames is None:
                        frames = resolved[stack] = _frames(self._stacks[stack])
                    entry["frames"] = frames
                    entry["category"] = alloc_of[key] = categories.get(number, cat.UNSET)
                    label = self._labels.get(number)
                    if label is not None:            # PyTorch's field for a user's tag
                        entry["user_metadata"] = label
                else:
                    entry["frames"] = []
                    entry["category"] = alloc_of.pop(key, cat.UNSET)
                    traces[self._device[row]].append(dict(entry, action="free_requested"))
                traces[self._device[row]].append(entry)
            for step in steps[next_step:]:
                annotations += self._step_annotations(step, traces)
        snapshot = {"segments": [], "device_traces": traces, "external_annotations": annotations,
                    "npumem": {"source": "npumem tensor recorder", "devices": devices,
                               "dropped_events": first,
                               "sampled_out_bytes": self._skipped_bytes}}
        cat.name_unset(snapshot)
        return snapshot

    def _step_annotations(self, step: tuple, traces: list) -> list[dict]:
        """A step's START on every device, before the entries that follow it there."""
        _, ns, source = step
        return [{"name": STEP, "stage": "START", "device": device,
                 "time_us": (ns - self.started_ns) / 1000.0, "npumem_entry": len(entries),
                 "source": source} for device, entries in enumerate(traces)]


def _frames(raw: tuple) -> list[dict]:
    """A raw stack as snapshot frames. An allocation by autograd's thread shows the node (a
    frame reports pass over: not a .py file), then its forward's frames, named "(backward)";
    without a forward stack, the node itself is the site."""
    if not raw or raw[0] != BACKWARD:
        return [f.as_dict() for f in resolve_user(raw)]
    _, owner, forward = raw
    frames = [f.as_dict() for f in resolve_user(forward)]
    if frames:
        return [{"filename": "<autograd>", "line": 0, "name": owner}] + \
            [dict(f, name=f"{f['name']} (backward)") for f in frames]
    return [{"filename": "<operator>", "line": 0, "name": f"{owner} (autograd's backward)"}]
