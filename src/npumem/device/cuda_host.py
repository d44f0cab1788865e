"""Host memory that a CUDA GPU reads and writes in place (zero copy), through PyTorch.

Under unified virtual addressing (every 64-bit CUDA platform) page-locked host memory has the
same address on the GPU, so a CUDA tensor over that address works on the host bytes across the
bus. malloc_host memory on torch:cuda is already page-locked (PyTorch's pinned allocator); other
host memory, a numpy array imported through DLPack say, is page-locked here with
cudaHostRegister for as long as any view of it lives.
"""

from __future__ import annotations

import weakref

from ..errors import FeatureNotSupportedError

HOST_REGISTER_PORTABLE = 0x01      # cudaHostRegisterPortable: every device may use it
HOST_REGISTER_MAPPED = 0x02        # cudaHostRegisterMapped: give it a device address


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
    """A uint8 CUDA tensor on `device` over the host bytes [address, address + nbytes)."""
    with torch.cuda.device(device):
        try:
            return torch.as_tensor(_HostBytes(address, nbytes, owner), device=device)
        except (RuntimeError, ValueError):
            pass                     # pageable memory: PyTorch refuses it; page-lock it below
        error = int(torch.cuda.cudart().cudaHostRegister(
            address, nbytes, HOST_REGISTER_PORTABLE | HOST_REGISTER_MAPPED))
        if error:
            raise FeatureNotSupportedError(
                f"cannot map {nbytes} bytes of host memory at 0x{address:x} into {device}: "
                f"cudaHostRegister failed with CUDA error {error} (the pages may already be "
                "registered by another library); copy the data with memcpy instead")
        keeper = _HostBytes(address, nbytes, owner)
        weakref.finalize(keeper, torch.cuda.cudart().cudaHostUnregister, address)
        try:
            return torch.as_tensor(keeper, device=device)
        except (RuntimeError, ValueError) as exc:
            raise FeatureNotSupportedError(f"cannot map host memory at 0x{address:x} into "
                                           f"{device}: {exc}") from None
