"""Building the stand-in CUDA device (stand_in_device.cpp) against the installed PyTorch.

It is compiled on first use with the system's C++ compiler (about a second), into a cache
folder named after the PyTorch version and the source's hash, and reused after that. The
folder is $NPUMEM_CACHE_DIR, else $XDG_CACHE_HOME/npumem, else ~/.cache/npumem.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stand_in_device.cpp")


class BuildError(RuntimeError):
    """The stand-in device could not be built; the message says what to install or set."""


def cache_dir() -> str:
    folder = os.environ.get("NPUMEM_CACHE_DIR")
    if not folder:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        folder = os.path.join(base, "npumem")
    return folder


def stand_in_library() -> str:
    """The path of the built library, building it if this PyTorch has none yet."""
    import torch
    if torch.cuda.is_available() or torch.version.cuda is not None:
        raise BuildError(f"this PyTorch ({torch.__version__}) is built with CUDA: its own device "
                         f"code would clash with a stand-in; run estimate under a CPU-only PyTorch")
    root = os.path.dirname(torch.__file__)
    include, lib = os.path.join(root, "include"), os.path.join(root, "lib")
    if not os.path.isfile(os.path.join(include, "ATen", "detail", "CUDAHooksInterface.h")):
        raise BuildError(f"PyTorch's C++ headers are missing from {include}; a PyTorch wheel "
                         f"from pip ships them")
    with open(SOURCE, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()[:12]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    name = f"stand_in_device-torch{torch.__version__.replace('+', '_')}-{digest}.so"
    target = os.path.join(cache_dir(), name)
    if os.path.isfile(target):
        return target
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise BuildError("no C++ compiler (g++) on PATH: npumem estimate builds a small native "
                         "stand-in for the GPU once; install g++ (Debian: apt install g++) or set CXX")
    os.makedirs(cache_dir(), exist_ok=True)
    handle, partial = tempfile.mkstemp(suffix=".so", dir=cache_dir())
    os.close(handle)
    command = [compiler, "-O1", "-shared", "-fPIC", "-std=c++17", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
               f"-I{include}", SOURCE, "-o", partial, f"-L{lib}", "-lc10", "-ltorch_cpu",
               f"-Wl,-rpath,{lib}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise BuildError(f"building the stand-in device failed ({compiler}, PyTorch "
                             f"{torch.__version__}):\n{done.stderr[-3000:]}")
        os.replace(partial, target)             # whole or not at all, also with two builds at once
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target
