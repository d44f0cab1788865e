"""Host memory that a CUDA GPU reads and writes in place (zero copy), through PyTorch.

Under unified virtual addressing (every 64-bit CUDA platform) page-locked host memory has the
same address on the GPU, so a CUDA tensor over that address works on the host bytes across the
bus. malloc_host memory on torch:cuda is page-locked by PyTorch's pinned allocator
(`pinned_host_bytes`), and so is a pinned torch tensor imported through DLPack.

Pageable memory (a plain numpy array) is refused rather than page-locked here: PyTorch builds a
CUDA tensor over any address without checking, a kernel that touches pageable memory poisons
the whole CUDA context, and cudaHostRegister pins whole pages, which makes PyTorch take other
buffers on those pages for pinned ones and fail their copies (seen on an H100).
"""

from __future__ import annotations

from ..errors import FeatureNotSupportedError
from .backing import host_bytes


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


def is_page_locked(torch, address: int, nbytes: int) -> bool:
    """Whether CUDA knows [address, address + nbytes) as page-locked host memory (both ends)."""
    return all(torch.from_numpy(host_bytes(at, 1)).is_pinned()
               for at in (address, address + max(nbytes, 1) - 1))


def device_view(torch, address: int, nbytes: int, device, owner):
    """A uint8 CUDA tensor on `device` over the page-locked host bytes
    [address, address + nbytes); FeatureNotSupportedError for pageable memory."""
    if not is_page_locked(torch, address, nbytes):
        raise FeatureNotSupportedError(
            f"host memory 0x{address:x} (+{nbytes} bytes) is pageable, so {device} cannot use it "
            "in place: use page-locked memory (npumem.malloc_host, or a torch tensor after "
            ".pin_memory()), or copy it to the device (ops.from_numpy)")
    with torch.cuda.device(device):
        return torch.as_tensor(_HostBytes(address, nbytes, owner), device=device)
