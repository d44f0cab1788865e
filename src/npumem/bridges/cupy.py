"""CuPy's allocations served by npumem's caching pool, on the torch:cuda backend.

    npumem.init(backend="torch:cuda"); npumem.set_device(0)
    npumem.bridges.cupy.use_npumem_pool()         # cupy.cuda.set_allocator(...)
    x = cupy.ones(1 << 20)                        # a block of npumem's pool

Each CuPy allocation is one pool block handed to CuPy as `UnownedMemory` at its real device
address; the block goes back to the pool when CuPy drops the memory. CuPy queues kernels on its
own streams, which npumem's pool cannot see, so a block is returned only after CuPy's current
stream has finished its work (a stream synchronize per free: correct first, then fast).
"""

from __future__ import annotations

from ..device.backend import DLPACK_CUDA
from ..errors import FeatureNotSupportedError
from ..runtime.state import RUNTIME


def _cupy():
    try:
        import cupy
    except ImportError:
        raise FeatureNotSupportedError("the CuPy hook needs CuPy (pip install cupy-cuda12x)") from None
    return cupy


class _PoolBlock:
    """Owns one pool block for as long as CuPy holds the memory."""

    def __init__(self, pool, pointer: int, cupy):
        self.pool, self.pointer, self.cupy = pool, pointer, cupy

    def __del__(self):
        if self.pool.owns(self.pointer):               # not already released with its device
            self.cupy.cuda.get_current_stream().synchronize()
            self.pool.deallocate_soon(self.pointer)      # a finalizer never waits for the pool


def allocator(device: int | None = None):
    """A function for `cupy.cuda.set_allocator`: size -> MemoryPointer into npumem's pool."""
    from .. import memory

    cupy = _cupy()
    backend = RUNTIME.require()
    pool = memory.get_allocator(device)
    kind, cuda_index = backend.dlpack_device(pool.device)
    if kind != DLPACK_CUDA:
        raise FeatureNotSupportedError(
            f"CuPy needs real CUDA memory; npumem runs on {backend.name}: init with "
            "backend='torch:cuda' (or NPUMEM_DEVICE=torch:cuda)")

    def allocate(size: int):
        pointer = pool.allocate(size)
        owner = _PoolBlock(pool, pointer, cupy)
        memory_ = cupy.cuda.UnownedMemory(backend.native_pointer(pointer), size, owner, cuda_index)
        return cupy.cuda.MemoryPointer(memory_, 0)

    return allocate


def use_npumem_pool(device: int | None = None) -> None:
    """Make npumem's pool CuPy's allocator (undo with cupy.cuda.set_allocator(None))."""
    _cupy().cuda.set_allocator(allocator(device))
