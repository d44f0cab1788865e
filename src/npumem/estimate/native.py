"""Building the stand-in CUDA device (stand_in_device.cpp) against the installed PyTorch, and
putting it in place in the fake run's process (claim(), from run.BOOT).

It is compiled on first use with the system's C++ compiler (about 10 s), into a cache folder
named after the PyTorch version and the sources' hash, and reused after that. The folder is
$NPUMEM_CACHE_DIR, else $XDG_CACHE_HOME/npumem, else ~/.cache/npumem.

Two kinds of PyTorch, one answer:
- a CPU-only build has no CUDA device code: the library is loaded before `import torch` and its
  static registrations are CUDA's device (stand_in_device.cpp);
- a CUDA build (pip's default wheel) registers its own device guard, hooks and kernels while
  `import torch` loads libc10_cuda and libtorch_cuda: the library (stand_in_over_cuda.cpp) is
  loaded first as well, and claim() puts its pieces over PyTorch's once torch is imported. Before
  that, claim() loads a stand-in NVIDIA driver (no_cuda_driver.cpp) under the driver's and NVML's
  names, so the real driver cannot enter the process: with a GPU or without, the run never
  touches one and sees the same thing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "stand_in_device.cpp")
OVER_CUDA = os.path.join(HERE, "stand_in_over_cuda.cpp")       # includes SOURCE
NO_DRIVER = os.path.join(HERE, "no_cuda_driver.cpp")
DRIVER_NAMES = ("libcuda.so.1", "libnvidia-ml.so.1")           # what the stand-in driver answers to
OLDEST = (2, 11)                                                 # the oldest PyTorch it is built for


class BuildError(RuntimeError):
    """The stand-in device could not be built; the message says what to install or set."""


def cache_dir() -> str:
    folder = os.environ.get("NPUMEM_CACHE_DIR")
    if not folder:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "npumem")
    return folder


def stand_in_library() -> str:
    """The path of the built library, building it if this PyTorch has none yet. Asks nothing of
    CUDA (torch.cuda.is_available() would start the CUDA runtime of a CUDA build)."""
    import torch
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if version < OLDEST:
        raise BuildError(f"npumem estimate needs PyTorch {OLDEST[0]}.{OLDEST[1]} or newer (this is "
                         f"{torch.__version__}): pip install -U torch")
    if torch.version.hip is not None:
        raise BuildError(f"this PyTorch ({torch.__version__}) is a ROCm build; run estimate under "
                         f"a CPU-only or a CUDA build of PyTorch")
    root = os.path.dirname(torch.__file__)
    include, lib = os.path.join(root, "include"), os.path.join(root, "lib")
    if not os.path.isfile(os.path.join(include, "ATen", "detail", "CUDAHooksInterface.h")):
        raise BuildError(f"PyTorch's C++ headers are missing from {include}; reinstall PyTorch "
                         f"from pip (its wheels ship them): pip install --force-reinstall torch")
    over_cuda = torch.version.cuda is not None
    digest = hashlib.sha256()
    for path in (SOURCE, OVER_CUDA, NO_DRIVER):
        with open(path, "rb") as handle:
            digest.update(handle.read())
    name = f"stand_in_device-torch{torch.__version__.replace('+', '_')}-{digest.hexdigest()[:12]}"
    target = os.path.join(cache_dir(), name + ".so")
    if over_cuda:
        _build(_no_driver_dir(target), _no_driver_commands)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)

    standard = "c++20" if version >= (2, 14) else "c++17"       # what its headers ask for

    def commands(compiler: str, out: str) -> list[list[str]]:
        return [[compiler, "-O1", "-shared", "-fPIC", f"-std={standard}",
                 f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{include}",
                 OVER_CUDA if over_cuda else SOURCE, "-o", out, f"-L{lib}", "-lc10",
                 "-ltorch_cpu", f"-Wl,-rpath,{lib}"]]

    return _build(target, commands)


def _no_driver_dir(library: str) -> str:
    """The folder of the stand-in driver built beside `library`, one file per name."""
    return library[:-len(".so")] + "-no-driver"


def _no_driver_commands(compiler: str, out: str) -> list[list[str]]:
    os.makedirs(out)
    return [[compiler, "-O1", "-shared", "-fPIC", "-std=c++17", NO_DRIVER, f"-Wl,-soname,{name}",
             "-o", os.path.join(out, name)] for name in DRIVER_NAMES]


def _build(target: str, commands) -> str:
    """Run `commands(compiler, partial)` and move their output (a file or a folder) to
    `target`: whole or not at all, also with two builds at once."""
    if os.path.exists(target):
        return target
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise BuildError("no C++ compiler (g++) on PATH: npumem estimate builds a small native "
                         "stand-in for the GPU once; install g++ (Debian: apt install g++) or set CXX")
    os.makedirs(cache_dir(), exist_ok=True)
    scratch = tempfile.mkdtemp(dir=cache_dir())
    partial = os.path.join(scratch, "out")
    try:
        for command in commands(compiler, partial):
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                log = target + ".log"
                with open(log, "w") as handle:
                    handle.write(" ".join(command) + "\n" + done.stderr)
                raise BuildError(f"building the stand-in device with {compiler} failed (PyTorch "
                                 f"{_torch_version()}); the compiler's messages are in {log}")
        if os.path.exists(target + ".log"):      # an earlier failure's
            os.unlink(target + ".log")
        try:
            os.rename(partial, target)
        except OSError:
            if not os.path.exists(target):          # another build got there first: theirs
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _torch_version() -> str:
    import torch
    return torch.__version__


def claim(library) -> None:
    """In the fake run's process (run.BOOT), with `library` loaded (ctypes) before `import
    torch`: for a CUDA build, keep the real driver out, import torch and put the stand-in over
    PyTorch's CUDA device. A CPU build's library has done its part on loading."""
    if not hasattr(library, "npumem_stand_in_claim_cuda"):
        return
    import ctypes
    drivers = [ctypes.CDLL(os.path.join(_no_driver_dir(library._name), name))
               for name in DRIVER_NAMES]
    with _stderr_without(SKIPPED_HOOKS):
        import torch  # noqa: F401  (libc10_cuda and libtorch_cuda register theirs now)
    if library.npumem_stand_in_claim_cuda() != 0:
        sys.exit(f"npumem estimate: the stand-in device could not take the place of PyTorch "
                 f"{torch.__version__}'s CUDA hooks; run estimate under a CPU-only PyTorch "
                 f"(pip install torch --index-url https://download.pytorch.org/whl/cpu)")
    report = os.environ.get("NPUMEM_ESTIMATE_DRIVER_CALLS")
    if report:                                  # the tests' check that the run never asked
        import atexit

        def write() -> None:
            with open(report, "w") as handle:
                handle.write(str(sum(driver.npumem_driver_calls() for driver in drivers)))
        atexit.register(write)


# what c10's Registry prints when libtorch_cuda's CUDAHooks meet the stand-in's, registered first
SKIPPED_HOOKS = b"Higher priority item already registered, skipping registration of CUDAHooks\n"


class _stderr_without:
    """Within it, file descriptor 2 goes to a file; on leaving, what was written is passed on to
    the real stderr less the line `dropped` (a static initializer's fprintf, not Python's)."""

    def __init__(self, dropped: bytes):
        self.dropped = dropped

    def __enter__(self):
        sys.stderr.flush()
        self.saved = os.dup(2)
        self.file = tempfile.TemporaryFile()
        os.dup2(self.file.fileno(), 2)

    def __exit__(self, *exc) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)
        self.file.seek(0)
        text = self.file.read().replace(self.dropped, b"", 1)
        self.file.close()
        if text:
            os.write(2, text)
