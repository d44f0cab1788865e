"""`torch.cuda` (and `torch.npu`) as a script sees them under `npumem estimate`: the device is
there, its properties are the target's, and the memory figures come from npumem's model of the
caching allocator, which follows every allocation of the fake run as it happens.

The model runs with the settings the script would run with (PYTORCH_CUDA_ALLOC_CONF, or
`--set`) and no capacity: the run goes to its end, and the verdicts on the target's memory come
from replays afterwards. Calls with nothing to do on a fake device (synchronize, streams and
events, seeds, IPC) do nothing.
"""

from __future__ import annotations

import types

from ..alloc.torch_model import TorchAllocatorModel
from ..profile.tensor_recorder import ALLOC
from . import streams
from .targets import Target

SMALL_BLOCK = 1 << 20        # c10's kSmallSize: blocks this size or less come from the small pool


class LiveModel:
    """The allocator model fed by the recorder (TensorRecorder.listener), with the counters
    torch.cuda.memory_stats() reports: per pool (small: blocks of 1 MiB or less) the current,
    peak, cumulative allocated and freed figures of allocations and their bytes.

    Events wait in a list and reach the model when the script asks a question (`current()`),
    or when many are waiting: most scripts never ask, and the fake run's operators then pay one
    append per allocation, not a model's malloc."""

    METRICS = ("allocation", "allocated_bytes", "requested_bytes")
    WAITING = 100_000                        # events kept waiting at most

    def __init__(self, config):
        self.model = TorchAllocatorModel(config)
        self.blocks: dict = {}
        self.waiting: list = []
        self.peak_reserved = 0
        # (metric, pool) -> [current, peak, allocated, freed]
        self.counters = {(m, p): [0, 0, 0, 0] for m in self.METRICS
                         for p in ("all", "large_pool", "small_pool")}

    def current(self) -> "LiveModel":
        """This model with every event so far applied."""
        waiting, self.waiting = self.waiting, []
        for action, key, size in waiting:
            self._apply(action, key, size)
        return self

    @property
    def peak_allocated(self) -> int:
        return self.current().counters["allocated_bytes", "all"][1]

    def _count(self, block, size: int, sign: int) -> None:
        pool = "small_pool" if block.size <= SMALL_BLOCK else "large_pool"
        for metric, amount in (("allocation", 1), ("allocated_bytes", block.size),
                               ("requested_bytes", size)):
            for where in ("all", pool):
                counter = self.counters[metric, where]
                counter[0] += sign * amount
                counter[1] = max(counter[1], counter[0])
                counter[2 if sign > 0 else 3] += amount

    def __call__(self, action, key, size, device) -> None:
        self.waiting.append((action, key, size))
        if len(self.waiting) >= self.WAITING:
            self.current()

    def _apply(self, action, key, size) -> None:
        if action == ALLOC:
            block = self.model.malloc(size)
            self.blocks[key] = (block, size)
            self._count(block, size, +1)
        else:
            found = self.blocks.pop(key, None)
            if found is not None:
                self._count(found[0], found[1], -1)
                self.model.free(found[0])
        self.peak_reserved = max(self.peak_reserved, self.model.stats.reserved)

    def reset_peaks(self) -> None:
        self.current()
        self.peak_reserved = self.model.stats.reserved
        for counter in self.counters.values():
            counter[1] = counter[0]

    def stats(self) -> dict:
        """torch.cuda.memory_stats()'s keys (all of those memory_summary() reads). Reserved
        memory and segments are the model's totals (not split by pool); what the model does not
        follow (inactive splits, oversize blocks, stream syncs) is 0."""
        s = self.current().model.stats
        segments = s.num_device_alloc - s.num_device_free
        known = {("reserved_bytes", "all"): [s.reserved, self.peak_reserved, 0, 0],
                 ("segment", "all"): [segments, segments, s.num_device_alloc, s.num_device_free]}
        out = {}
        for metric in ("allocated_bytes", "active_bytes", "requested_bytes", "reserved_bytes",
                       "inactive_split_bytes", "allocation", "active", "segment", "inactive_split"):
            source = {"active_bytes": "allocated_bytes", "active": "allocation"}.get(metric, metric)
            for pool in ("all", "large_pool", "small_pool"):
                values = self.counters.get((source, pool)) or known.get((source, pool)) or [0, 0, 0, 0]
                for field, value in zip(("current", "peak", "allocated", "freed"), values):
                    out[f"{metric}.{pool}.{field}"] = value
        for metric in ("oversize_allocations", "oversize_segments"):
            for field in ("current", "peak", "allocated", "freed"):
                out[f"{metric}.{field}"] = 0
        out.update({"num_alloc_retries": s.num_alloc_retries, "num_ooms": s.num_ooms,
                    "num_sync_all_streams": 0, "num_device_alloc": s.num_device_alloc,
                    "num_device_free": s.num_device_free, "max_split_size": -1})
        return out


class _Properties(types.SimpleNamespace):
    def __repr__(self) -> str:
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, "
                f"multi_processor_count={self.multi_processor_count})")


class _Stream:
    """A stand-in for torch.cuda.Stream: its work is not timed, but what is allocated under it
    goes to its own pool (streams.py)."""

    def __init__(self, device=None, priority=0, stream_id=None, **_):
        self.device, self.priority = device, priority
        self.stream_id = streams.new_id() if stream_id is None else stream_id
        self.cuda_stream = self.stream_id
        self._entered: list = []

    def wait_stream(self, stream) -> None: ...
    def wait_event(self, event) -> None: ...
    def record_event(self, event=None): return event or _Event()
    def synchronize(self) -> None: ...
    def query(self) -> bool: return True

    def __enter__(self):
        self._entered.append(streams.current())
        streams.set_current(self.stream_id)
        return self

    def __exit__(self, *exc) -> None:
        streams.set_current(self._entered.pop())

    def __eq__(self, other) -> bool:
        return isinstance(other, _Stream) and other.stream_id == self.stream_id

    def __hash__(self) -> int:
        return hash(self.stream_id)


def _stream_of(stream_id: int) -> _Stream:
    return _Stream(stream_id=stream_id)


class _Event:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = enable_timing

    def record(self, stream=None) -> None: ...
    def wait(self, stream=None) -> None: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool: return True
    def elapsed_time(self, other) -> float: return 0.0


class LiveModels:
    """A LiveModel per device, as PyTorch keeps an allocator per device (made at first use)."""

    def __init__(self, config):
        self.config = config
        self.models: dict[int, LiveModel] = {}

    def of(self, ordinal: int) -> LiveModel:
        model = self.models.get(ordinal)
        if model is None:
            model = self.models[ordinal] = LiveModel(self.config)
        return model


def install(torch, target: Target, capacity: int, live: LiveModels, devices: int, on_empty_cache,
            on_dump, npu_strings: bool = False) -> None:
    """Replace torch.cuda's device calls (and add torch.npu) for this process; `capacity` is
    what the script may use (the target's, or --memory), which mem_get_info reports. Memory
    questions are answered for the device asked about (default: the current one)."""
    state = {"device": 0, "fraction": 1.0}

    def ordinal(device=None) -> int:
        if device is None:
            return state["device"]
        if isinstance(device, int):
            return device
        index = torch.device(device).index
        return state["device"] if index is None else index

    def on(device=None) -> LiveModel:
        return live.of(ordinal(device)).current()

    def exchange_device(device: int) -> int:
        """torch.cuda.device(...)'s switch: the previous device (a negative one: no switch)."""
        previous = state["device"]
        if device >= 0:
            state["device"] = device
        return previous
    properties = _Properties(name=target.name, major=target.major, minor=target.minor,
                             total_memory=target.total_memory, multi_processor_count=target.sm_count,
                             is_integrated=False, is_multi_gpu_board=False, L2_cache_size=50 * 2**20,
                             max_threads_per_multi_processor=2048, warp_size=32,
                             uuid="npumem-estimate", gcnArchName="")

    def set_device(device) -> None:
        index = device if isinstance(device, int) else (torch.device(device).index or 0)
        state["device"] = index

    def empty_cache() -> None:
        for model in live.models.values():          # every device's cache, as PyTorch's does
            model.current().model.empty_cache()
        on_empty_cache()

    def mem_get_info(device=None):
        usable = int(capacity * state["fraction"])
        return max(0, usable - on(device).model.stats.reserved), target.total_memory

    def set_fraction(fraction, device=None) -> None:
        if not 0 <= fraction <= 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        state["fraction"] = fraction

    def record_history(enabled="all", *args, **kwargs) -> None: ...

    api = {
        "is_available": lambda: True, "device_count": lambda: devices,
        "is_initialized": lambda: True, "init": lambda: None, "_lazy_init": lambda: None,
        "current_device": lambda: state["device"], "set_device": set_device,
        "get_device_name": lambda device=None: target.name,
        "get_device_properties": lambda device=None: properties,
        "get_device_capability": lambda device=None: (target.major, target.minor),
        "is_bf16_supported": lambda including_emulation=True: target.major >= 8,
        "synchronize": lambda device=None: None, "empty_cache": empty_cache,
        "ipc_collect": lambda: None,
        "memory_allocated": lambda device=None: on(device).counters["allocated_bytes", "all"][0],
        "max_memory_allocated": lambda device=None: on(device).peak_allocated,
        "memory_reserved": lambda device=None: on(device).model.stats.reserved,
        "max_memory_reserved": lambda device=None: on(device).peak_reserved,
        "memory_cached": lambda device=None: on(device).model.stats.reserved,
        "reset_peak_memory_stats": lambda device=None: on(device).reset_peaks(),
        "reset_max_memory_allocated": lambda device=None: on(device).reset_peaks(),
        "memory_stats": lambda device=None: on(device).stats(),
        "_exchange_device": exchange_device, "_maybe_exchange_device": exchange_device,
        "get_rng_state": lambda device="cuda": torch.get_rng_state(),
        "set_rng_state": lambda new_state, device="cuda": None,
        "get_rng_state_all": lambda: [torch.get_rng_state() for _ in range(devices)],
        "set_rng_state_all": lambda new_states: None,
        "mem_get_info": mem_get_info, "set_per_process_memory_fraction": set_fraction,
        "manual_seed": lambda seed: None, "manual_seed_all": lambda seed: None,
        "seed": lambda: None, "seed_all": lambda: None, "initial_seed": lambda: 0,
        "Stream": _Stream, "Event": _Event,
        "current_stream": lambda device=None: _stream_of(streams.current()),
        "default_stream": lambda device=None: _stream_of(0),
        "stream": lambda s=None: streams.using(getattr(s, "stream_id", None)),
        "set_stream": lambda s: streams.set_current(getattr(s, "stream_id", 0)),
        "_is_in_bad_fork": lambda: False,
        # optimizers ask it on a CUDA build (_cuda_graph_capture_health_check); the real one
        # calls the CUDA runtime
        "is_current_stream_capturing": lambda: False,
    }
    for name, value in api.items():
        setattr(torch.cuda, name, value)
    torch.cuda.memory._record_memory_history = record_history
    torch.cuda.memory._dump_snapshot = on_dump
    torch.cuda.memory._snapshot = lambda device=None: on_dump(None)
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                 "memory_stats", "reset_peak_memory_stats", "empty_cache", "mem_get_info",
                 "set_per_process_memory_fraction"):
        setattr(torch.cuda.memory, name, api[name])
    # torch.npu for scripts written for an NPU (torch_npu's API mirrors torch.cuda's)
    npu = types.ModuleType("torch.npu")
    for name, value in api.items():
        setattr(npu, name, value)
    npu.memory = torch.cuda.memory
    if npu_strings:
        _npu_backend(torch, npu)
    else:
        torch.npu = npu


def _npu_backend(torch, npu) -> None:
    """"npu" as a device (PyTorch's PrivateUse1, renamed as torch_npu does; the stand-in
    library holds its guard and hooks), and a torch_npu module, for scripts written for an NPU:
    `import torch_npu`, `from torch_npu.contrib import transfer_to_npu`, `.to("npu")`."""
    import sys
    torch.utils.rename_privateuse1_backend("npu")
    torch._register_device_module("npu", npu)
    torch.utils.generate_methods_for_privateuse1_backend()
    package = types.ModuleType("torch_npu")
    package.__path__ = []
    package.npu, package.__version__ = npu, "0+npumem.estimate"
    contrib = types.ModuleType("torch_npu.contrib")
    contrib.__path__ = []
    contrib.transfer_to_npu = types.ModuleType("torch_npu.contrib.transfer_to_npu")
    package.contrib = contrib
    sys.modules.update({"torch_npu": package, "torch_npu.npu": npu, "torch_npu.contrib": contrib,
                        "torch_npu.contrib.transfer_to_npu": contrib.transfer_to_npu})
