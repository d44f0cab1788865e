pytest_plugins = ["pytester"]

import os
import warnings

# The whole suite runs with the pool sanitizer on (it is a mode: it costs time per allocation);
# npumem's pytest plugin imported npumem already, so it is switched on here too.
os.environ.setdefault("NPUMEM_SANITIZE", "1")

import numpy as np
import pytest
from hypothesis import settings

import npumem
from npumem.device import SimBackend, SimConfig, sanitizer
from npumem.units import MiB

if os.environ["NPUMEM_SANITIZE"] not in ("", "0"):
    sanitizer.enable()

# Property tests draw the same examples on every run, CI's included: a failure is one anybody can
# repeat, and a run does not fail by the luck of its draw. HYPOTHESIS_PROFILE=explore draws new
# examples each run, to look for more (a failure found so becomes an example of its own).
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))

SMALL_SIM = SimConfig(devices=2, memory=256 * MiB, huge_memory=128 * MiB)


def torch_cpu_backend(memory: int = 128 * MiB):
    """Two logical torch:cpu devices of `memory` each (skips the test where torch is missing)."""
    pytest.importorskip("torch")
    from npumem.device.torch_backend import TorchBackend
    return TorchBackend("cpu", devices=2, memory=memory)


def torch_cuda_backend(memory: int = 128 * MiB):
    """The GPUs PyTorch sees, `memory` each (skips the test where there is none)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from npumem.device.torch_backend import TorchBackend
    return TorchBackend("cuda", memory=memory)


def need_devices(count: int) -> None:
    """Skip where the backend has fewer devices (a machine with one GPU)."""
    if npumem.get_device_count() < count:
        pytest.skip(f"needs {count} devices")


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Every backend the runtime, resource, op and backend conformance suites run against; torch:cuda
# only where there is a GPU (tests/test_torch_cuda.py reports the skip once elsewhere).
BACKENDS = {"sim": lambda: SimBackend(SMALL_SIM), "torch:cpu": torch_cpu_backend}
if cuda_available():
    BACKENDS["torch:cuda"] = torch_cuda_backend


@pytest.fixture(autouse=True)
def _clean_runtime():
    """Every test starts and ends with the runtime finalized."""
    if npumem.is_initialized():
        npumem.finalize()
    yield
    npumem.RUNTIME.next_backend = None          # a test's set_backend must not outlive it
    if npumem.is_initialized():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            npumem.finalize()


@pytest.fixture
def rt():
    """The runtime on a small two-device simulator, device 0 current."""
    npumem.init(backend=SimBackend(SMALL_SIM))
    npumem.set_device(0)
    yield npumem


@pytest.fixture(params=sorted(BACKENDS))
def any_rt(request):
    """The runtime on each backend in turn, device 0 current. A conformance module uses it as
    its `rt`; tests of simulator-only behaviour there are marked `sim_only`."""
    if request.param != "sim" and request.node.get_closest_marker("sim_only"):
        pytest.skip("simulator-only behaviour (page kinds, virtual memory, exact capacity)")
    npumem.init(backend=BACKENDS[request.param]())
    npumem.set_device(0)
    yield npumem


def read_device(pointer: int, nbytes: int) -> bytes:
    out = bytearray(nbytes)
    npumem.memcpy(out, nbytes, pointer, nbytes, npumem.MemcpyKind.DEVICE_TO_HOST)
    return bytes(out)


def write_device(pointer: int, data: bytes) -> None:
    npumem.memcpy(pointer, len(data), data, len(data), npumem.MemcpyKind.HOST_TO_DEVICE)


def pattern(nbytes: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()


def run_threads(worker, count: int = 8) -> list:
    """Run worker(i) on `count` threads at once; returns the exceptions they raised."""
    import threading

    errors = []

    def guarded(index):
        try:
            worker(index)
        except Exception as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """The end of a run that skipped tests: each group, what it needs and the command that runs
    it (tests/skip_summary.py), so "N skipped" is never all a user is told. A wrapper, outermost:
    printed after -ra's list of skips, where it is seen, just above the counts."""
    from .skip_summary import summary_lines

    yield
    lines = summary_lines(terminalreporter.stats.get("skipped", []))
    if lines:
        terminalreporter.write_sep("-", "skipped, by what they need")
        for line in lines:
            terminalreporter.write_line(line)
