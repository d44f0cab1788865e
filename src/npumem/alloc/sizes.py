"""How the pools round request sizes.

`npu` (npumem's pool): every block is a piece carved by the CANN rule, ALIGN_UP(len, 32) + 32,
and starts on a 64-byte boundary, so sizes are multiples of 64. `torch` (the emulation of
PyTorch's CUDA caching allocator): sizes round up to 512 bytes.
Both can first round to one of N steps between powers of two (roundup_power2_divisions).
"""

from __future__ import annotations

from ..units import align_up, carve_size

SMALL_SIZE = 1 << 20            # requests up to this go to the small pool
SMALL_SEGMENT = 2 << 20         # small-pool segments (segment mode)
LARGE_SEGMENT_LIMIT = 10 << 20  # below this, large requests share `segment_size_mb` segments
ROUND_LARGE = 2 << 20           # larger requests get segments rounded to this
LARGE_BUFFER = 20 << 20         # an oversize block may serve a request at most this much smaller
MIN_BLOCK = {"npu": 64, "torch": 512}


def round_request(nbytes: int, flavour: str, divisions: int = 0, alignment: int = 64) -> int:
    """The block size that serves a request of `nbytes`.

    Block sizes are multiples of `alignment`, and segments start page-aligned, so every block
    starts on an `alignment` boundary.
    """
    nbytes = max(nbytes, 1)
    if divisions > 1 and nbytes > 256:
        floor = 1 << (nbytes.bit_length() - 1)
        step = floor // divisions
        if step > 0 and nbytes != floor:
            nbytes = align_up(nbytes, step)
    if flavour == "npu":
        return align_up(carve_size(nbytes), alignment)
    return align_up(nbytes, 512)


def segment_size(size: int, segment_mb: float) -> int:
    """Bytes to ask the device for when no cached block fits `size` (segment mode)."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < LARGE_SEGMENT_LIMIT:
        return max(int(segment_mb * (1 << 20)), align_up(size, ROUND_LARGE))
    return align_up(size, ROUND_LARGE)
