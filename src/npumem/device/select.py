"""Choosing a backend by name: `sim`, `torch:cpu`, `torch:cuda`, `torch:npu`, or `torch` (the best
device PyTorch sees: npu, then cuda, then cpu). NPUMEM_DEVICE names the default."""

from __future__ import annotations

import os

from ..errors import InvalidParamError
from .backend import DeviceBackend

ENV = "NPUMEM_DEVICE"
NAMES = ("sim", "torch", "torch:cpu", "torch:cuda", "torch:npu")


def default_spec() -> str:
    return os.environ.get(ENV, "").strip() or "sim"


def check_spec(spec: str) -> str:
    """`spec`, normalized, or InvalidParamError listing the names npumem knows."""
    normal = spec.strip().lower() if isinstance(spec, str) else spec
    if normal not in NAMES:
        raise InvalidParamError(f"unknown device backend {spec!r}; npumem knows {', '.join(NAMES)}"
                                f" (set with {ENV} or npumem.set_backend)")
    return normal


def make_backend(spec: str, **sim_config) -> DeviceBackend:
    """A new backend for `spec`; `sim_config` (SimConfig fields) applies to `sim` only."""
    spec = check_spec(spec)
    if spec == "sim":
        import dataclasses

        from .sim import SimBackend, SimConfig
        return SimBackend(dataclasses.replace(SimConfig.from_env(), **sim_config))
    from .torch_backend import TorchBackend
    if spec == "torch":
        return TorchBackend(best_torch_device())
    return TorchBackend(spec.split(":", 1)[1])


def device_count_of(spec) -> int:
    """How many devices a backend made from `spec` (a name or an instance) would drive,
    without making it."""
    if isinstance(spec, DeviceBackend):
        return spec.device_count
    if check_spec(spec) == "sim":
        from .sim import SimConfig
        return SimConfig.from_env().devices
    from .torch_backend import TorchBackend
    return TorchBackend(best_torch_device() if spec == "torch" else spec.split(":", 1)[1]).device_count


def best_torch_device() -> str:
    from .torch_backend import import_torch
    torch = import_torch()
    try:
        import torch_npu  # noqa: F401
        if torch.npu.is_available():
            return "npu"
    except ImportError:
        pass
    return "cuda" if torch.cuda.is_available() else "cpu"
