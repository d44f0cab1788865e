"""@kernel and its launches: a Python function run as `block_dim` blocks on the AI cores.

    @kernel
    def add_custom(x, y, z, total):
        ...                                   # Ascend C-shaped code, see docs/aicore.md

    launch = add_custom[8, stream](x, y, z, x.numel())    # queued, returns at once
    stream.synchronize()
    print(launch.timeline.summary())

Tensor arguments arrive as GlobalTensors over their device bytes; everything else (tiling data)
as it was passed. Blocks run one after another on the host, each on core `block % cores`, and
the cost model places them in time: a core takes its next block when it finishes the last. A
block that faults (the sanitizer, or an exception in the kernel's code) stops the stream, as a
device fault does: the rest of the launch and the stream's later work are skipped, and
synchronize raises the fault (a KernelFault's code, 507015) naming the core, tile and buffer.
"""

from __future__ import annotations

import abc
import collections
import functools
import inspect
import operator
import threading
import time

import numpy as np

from ..aicore.profile import Profile, current_profile
from ..aicore.timeline import Timeline
from ..device.running import running_stream
from ..dtypes import numpy_dtype
from ..errors import FeatureNotSupportedError, InvalidParamError, KernelFault
from ..observe import OBSERVERS, emit_kernel
from ..runtime.state import RUNTIME
from ..runtime.stream import device_work
from .context import BlockContext, CoreMemory, enter
from .tensors import Argument, GlobalTensor

class DeviceTensor(abc.ABC):
    """A tensor in device memory, as a kernel argument (ops.Tensor registers as one): it has
    `address` and `dtype` (a DataType), `span()` (address, bytes) for the bounds check, and
    `storage` with `check_live(what)` and `used_on(stream)`. Kernels sit below the ops that
    define tensors, so they name only what they use of one."""


KINDS = ("vector", "cube")
RECENT = collections.deque(maxlen=64)     # the last launches (with their timelines), newest last


class Launch:
    """One launch of a kernel: its timeline once it ran (after synchronize), or its fault."""

    def __init__(self, name: str, block_dim: int, kind: str, profile: Profile):
        self.name, self.block_dim, self.kind, self.profile = name, block_dim, kind, profile
        self.cores = min(block_dim, profile.cores(kind))
        self.timeline = Timeline(name, profile, block_dim, self.cores)
        self.done = threading.Event()
        self.start_ns = 0                   # when it began to run (perf_counter_ns)
        self.fault: BaseException | None = None

    def skipped(self) -> None:
        """Its stream had stopped at an earlier fault: it never ran."""
        self.fault = KernelFault(f"kernel {self.name} was skipped: its stream had stopped at "
                                 "an earlier fault")
        self.done.set()

    def __repr__(self) -> str:
        state = "faulted" if self.fault else "done" if self.done.is_set() else "queued"
        return f"<npumem launch {self.name}[{self.block_dim}] on {self.cores} core(s), {state}>"


class KernelFunction:
    """A function written against npumem.kernel, launched with kernel[block_dim, stream](...)."""

    def __init__(self, function, kind: str = "vector"):
        if kind not in KINDS:
            raise InvalidParamError(f"@kernel(kind={kind!r}): kind is one of {', '.join(KINDS)}")
        self.function, self.kind = function, kind
        self.name = function.__name__
        self.parameters = list(inspect.signature(function).parameters)
        functools.update_wrapper(self, function)

    def __repr__(self) -> str:
        return f"<npumem kernel {self.name} ({self.kind})>"

    def __getitem__(self, config):
        block_dim, stream = config if isinstance(config, tuple) else (config, None)
        return functools.partial(self.launch, block_dim, stream=stream)

    def __call__(self, *args, **kwargs):
        raise InvalidParamError(f"kernel {self.name} is launched, not called: "
                                f"{self.name}[block_dim, stream](...) or "
                                f"{self.name}.launch(block_dim, ...)")

    def launch(self, block_dim: int, *args, stream=None) -> Launch:
        """Queue `block_dim` blocks of this kernel on `stream` (default: the current stream)."""
        try:
            block_dim = operator.index(block_dim)
        except TypeError:
            block_dim = -1
        if not 1 <= block_dim <= 65535:
            raise InvalidParamError(f"kernel {self.name}: block_dim must be 1..65535, got "
                                    f"{block_dim!r}")
        backend = RUNTIME.require()
        if backend.name != "sim":
            raise FeatureNotSupportedError(
                f"kernel {self.name}: @kernel functions run on the simulated device's AI cores; "
                f"the {backend.name!r} backend has none (NPUMEM_DEVICE=sim)")
        if len(args) != len(self.parameters):
            raise InvalidParamError(f"kernel {self.name} takes {len(self.parameters)} "
                                    f"argument(s) ({', '.join(self.parameters)}), got {len(args)}")
        ranges = {}
        for name, value in zip(self.parameters, args):
            if isinstance(value, DeviceTensor):
                value.storage.check_live(f"kernel {self.name} argument {name}")
                ranges[name] = backend.resolve(*value.span(), f"kernel {self.name} argument "
                                               f"{name}")
        queue = RUNTIME.stream(stream, f"kernel {self.name}")
        launch = Launch(self.name, block_dim, self.kind, current_profile())
        queue.enqueue(device_work(lambda: self._run(launch, args, ranges, queue),
                                  on_skip=launch.skipped),
                      f"kernel {self.name}[{block_dim}]")
        for value in args:
            if isinstance(value, DeviceTensor):
                value.storage.used_on(queue)
        return launch

    def _run(self, launch: Launch, args, ranges, stream) -> None:
        backend = RUNTIME.backend
        values = []
        for name, value in zip(self.parameters, args):
            if isinstance(value, DeviceTensor):
                raw = backend.kernel_view(ranges[name], f"kernel {self.name} argument {name}")
                value = GlobalTensor(None, Argument(name, value.address, raw,
                                                    numpy_dtype(value.dtype)))
            values.append(value)
        self._execute(launch, values, stream)

    def run(self, block_dim: int, *args) -> Launch:
        """Run the blocks now, on the calling thread: for work already running on a stream (the
        built-in ops' tiled kernels). numpy arrays stand for tensor arguments."""
        launch = Launch(self.name, block_dim, self.kind, current_profile())
        values = [GlobalTensor(None, Argument(name, value.__array_interface__["data"][0],
                                              value.reshape(-1).view(np.uint8), value.dtype))
                  if isinstance(value, np.ndarray) else value
                  for name, value in zip(self.parameters, args)]
        self._execute(launch, values, running_stream())
        return launch

    def _execute(self, launch: Launch, values: list, stream) -> None:
        launch.start_ns = time.perf_counter_ns()
        memories = [CoreMemory(launch.profile) for _ in range(launch.cores)]
        core_free = [0.0] * launch.cores
        try:
            for block in range(launch.block_dim):
                core = block % launch.cores
                context = BlockContext(launch, block, core, memories[core], core_free[core])
                outer = enter(context)
                try:
                    self.function(*values)
                except KernelFault:
                    raise
                except Exception as exc:                                 # noqa: BLE001
                    raise context.fault(f"the kernel's code raised {type(exc).__name__}: "
                                        f"{exc}") from exc
                finally:
                    enter(outer)
                core_free[core] = context.finish
        except BaseException as exc:
            launch.fault = exc
            raise
        finally:
            RECENT.append(launch)
            launch.done.set()
            if OBSERVERS.active and stream is not None:
                emit_kernel(launch.timeline, stream.device, stream, launch.start_ns)


def kernel(function=None, *, kind: str = "vector"):
    """Make `function` a kernel: `@kernel` (vector cores) or `@kernel(kind="cube")`."""
    if function is None:
        return lambda f: KernelFunction(f, kind)
    return KernelFunction(function, kind)
