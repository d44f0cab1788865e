"""The cost model: cycles for each transfer and each compute instruction of an AI core.

A transfer costs its engine's fixed latency plus its bytes over the engine's bandwidth, where the
bytes are counted in whole bursts from the burst boundary below the first byte: a copy that starts
off a burst boundary, or ends inside a burst, pays for the whole burst. That is what makes
alignment visible in a timeline. Vector instructions process 256-byte repeats (a partial repeat
costs a whole one); the Cube multiplies whole fractals, so a dimension that is not a multiple of
the fractal is padded.
"""

from __future__ import annotations

from .profile import Engine, Profile


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def charged_bytes(engine: Engine, nbytes: int, address: int = 0) -> int:
    """The bytes a transfer is charged for: whole bursts covering [address, address + nbytes)."""
    if nbytes <= 0:
        return 0
    head = address % engine.burst_bytes
    return _ceil_div(head + nbytes, engine.burst_bytes) * engine.burst_bytes


def transfer_cycles(engine: Engine, nbytes: int, address: int = 0, rows: int = 1,
                    stride: int = 0) -> int:
    """One transfer of `rows` rows of `nbytes`, `stride` bytes apart from `address`: each row
    pays its own bursts."""
    charged = sum(charged_bytes(engine, nbytes, address + row * stride) for row in range(rows))
    return engine.latency_cycles + _ceil_div(charged, engine.bytes_per_cycle)


def vector_cycles(profile: Profile, nbytes: int) -> int:
    """An elementwise or reduction instruction over `nbytes` of its widest operand."""
    repeats = max(1, _ceil_div(nbytes, profile.vector_bytes_per_cycle))
    return profile.vector_latency_cycles + repeats


def cube_cycles(profile: Profile, m: int, k: int, n: int, itemsize: int) -> int:
    """An m x k by k x n multiply: fractals of `cube_fractal` rows/columns and 32 bytes deep."""
    f = profile.cube_fractal
    depth = max(1, 32 // itemsize)
    macs = _ceil_div(m, f) * f * _ceil_div(k, depth) * depth * _ceil_div(n, f) * f
    rate = profile.cube_macs_per_cycle.get(itemsize, min(profile.cube_macs_per_cycle.values()))
    return profile.cube_latency_cycles + _ceil_div(macs, rate)
