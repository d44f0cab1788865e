"""A faithful model of PyTorch's caching allocator (CUDA, and torch_npu's NPU flavour): what
`npumem replay --allocator torch` and `npumem tune` answer PyTorch users with."""

from .allocator import (DEFAULT_POOL, ModelOutOfMemory, PrivatePool, SegmentEvent,
                        TorchAllocatorModel, round_size)
from .config import TorchAllocatorConfig, from_snapshot, parse_config
from .device import DeviceMemory

__all__ = ["DEFAULT_POOL", "DeviceMemory", "ModelOutOfMemory", "PrivatePool", "SegmentEvent",
           "TorchAllocatorConfig", "TorchAllocatorModel", "from_snapshot", "parse_config",
           "round_size"]
