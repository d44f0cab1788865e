"""Host memory that a CUDA GPU reads and writes in place (zero copy), through PyTorch.

Under unified virtual addressing (every 64-bit CUDA platform) page-locked host memory has the
same address on the GPU, so a CUDA tensor over that address works on the host bytes across the
bus. PyTorch builds such a tensor from any address without checking it, and a kernel that then
touches pageable memory faults and poisons the whole CUDA context; so every range is known to be
page-locked before a view is made:

- malloc_host memory on torch:cuda comes from PyTorch's pinned allocator (`pinned_host_bytes`);
- other host memory (a numpy array imported through DLPack, say) is page-locked here with
  cudaHostRegister, whole pages, for as long as any view of it lives; views on the same
  pages share registrations. Pages that their owner page-locked (a pinned torch tensor) are
  used as they are.
"""

from __future__ import annotations

import threading
import weakref

from ..errors import FeatureNotSupportedError
from .backing import host_bytes

HOST_REGISTER_PORTABLE = 0x01      # cudaHostRegisterPortable: every device may use it
HOST_REGISTER_MAPPED = 0x02        # cudaHostRegisterMapped: give it a device address
ALREADY_REGISTERED = 712           # cudaErrorHostMemoryAlreadyRegistered
PAGE = 4096

_lock = threading.Lock()
_units: dict[int, list[int]] = {}     # our registrations: first page -> [end, views using it]


class _HostBytes:
    """`nbytes` at `address` in the form torch.as_tensor adopts as CUDA memory, without a copy.

    The tensor keeps this object, and so `owner` (what keeps the host bytes allocated), alive."""

    def __init__(self, address: int, nbytes: int, owner):
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (address, False), "version": 3}


def pinned_host_bytes(torch, nbytes: int):
    """`nbytes` of page-locked host memory as a writable uint8 numpy array (it keeps the
    pinned tensor alive)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy()


def device_view(torch, address: int, nbytes: int, device, owner):
    """A uint8 CUDA tensor on `device` over the host bytes [address, address + nbytes).

    Pageable bytes have their pages registered until the view, and every tensor made from
    it, are gone."""
    keeper = _HostBytes(address, nbytes, owner)
    with torch.cuda.device(device):
        units = _register(torch, address, nbytes, device)
        if units:
            weakref.finalize(keeper, _release, torch, units)
        return torch.as_tensor(keeper, device=device)


def _register(torch, address: int, nbytes: int, device) -> list[int]:
    """Page-lock the pages of the range that are not yet; the registrations it now holds.

    Registrations never overlap: a range over pages of earlier ones shares those and registers
    only the gaps between them."""
    first, end = address - address % PAGE, -(-(address + nbytes) // PAGE) * PAGE
    with _lock:
        shared = sorted(start for start, (stop, _) in _units.items() if start < end and first < stop)
        if not shared and torch.from_numpy(host_bytes(address, 1)).is_pinned():
            return []                    # page-locked by its owner (malloc_host, a pinned tensor)
        gaps, cursor = [], first
        for start in shared:
            if start > cursor:
                gaps.append((cursor, start))
            cursor = max(cursor, _units[start][0])
        if cursor < end:
            gaps.append((cursor, end))
        made = []
        for start, stop in gaps:
            error = int(torch.cuda.cudart().cudaHostRegister(
                start, stop - start, HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED))
            if error == ALREADY_REGISTERED:
                continue                 # its owner page-locked these pages and keeps them so
            if error:
                for undo in made:
                    torch.cuda.cudart().cudaHostUnregister(undo)
                    del _units[undo]
                raise FeatureNotSupportedError(
                    f"cannot map host memory 0x{address:x} (+{nbytes} bytes) into {device}: "
                    f"cudaHostRegister failed with CUDA error {error}; copy the data with memcpy")
            _units[start] = [stop, 0]
            made.append(start)
        held = shared + made
        for start in held:
            _units[start][1] += 1
        return held


def _release(torch, units: list[int]) -> None:
    with _lock:
        done = []
        for start in units:
            _units[start][1] -= 1
            if not _units[start][1]:
                del _units[start]
                done.append(start)
    for start in done:
        torch.cuda.cudart().cudaHostUnregister(start)
