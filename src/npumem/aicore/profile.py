"""Device profiles: every constant of the AI core model, each with where it comes from.

One profile describes one chip: how many cube (AIC) and vector (AIV) cores it has, the on-chip
buffers of each core with their sizes and alignment, and the speed of the transfer engines and
compute units the cost model charges. `NPUMEM_SIM_PROFILE` picks the profile (default
ascend910b) and `NPUMEM_SIM_CORES` overrides its number of cube cores (the vector cores follow
the profile's ratio).

Sources are named per figure. "seed 000 §2.2" and "seed 004 §1.2" are the articles this project
implements (`../shared/seeds/`); "CANN TPosition table" is the Ascend C API reference page on
logical positions and alignment (hiascend.com, atlasascendc_api_07_0004); "catlass arch.hpp" is
hicann/catlass include/acot/arch/arch.hpp (the buffer sizes of Atlas A2 / 910B). Figures marked
"model choice" are not published; they are the model's assumptions, and kept here so a person
with better numbers changes one line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from ..errors import InvalidParamError

KIB = 1024


@dataclass(frozen=True)
class Engine:
    """A transfer path: bytes per cycle, a fixed start-up latency, and its burst (a partial
    burst is charged whole, so misaligned or odd-sized copies cost more)."""

    bytes_per_cycle: int
    latency_cycles: int
    burst_bytes: int


@dataclass(frozen=True)
class Profile:
    name: str
    cube_cores: int
    vector_per_cube: int             # AIV cores per AIC (2 on the split 910B, 1 on 910)
    clock_ghz: float
    buffers: dict                    # physical buffer -> bytes per core
    alignment: dict                  # physical buffer -> start alignment in bytes
    engines: dict                    # MTE2 / MTE1 / MTE3 -> Engine
    vector_bytes_per_cycle: int
    vector_latency_cycles: int
    cube_macs_per_cycle: dict        # operand itemsize -> multiply-adds per cycle
    cube_fractal: int                # the Cube works on fractal x fractal blocks
    cube_latency_cycles: int
    sources: dict = field(default_factory=dict, compare=False)

    @property
    def vector_cores(self) -> int:
        return self.cube_cores * self.vector_per_cube

    def cores(self, kind: str) -> int:
        """How many cores a kernel of `kind` ("vector" or "cube") can run on at once."""
        return self.vector_cores if kind == "vector" else self.cube_cores

    def microseconds(self, cycles: float) -> float:
        return cycles / (self.clock_ghz * 1e3)


_COMMON_SOURCES = {
    "alignment": "CANN TPosition table: UB and L1 32-byte, L0A/L0B 512-byte, L0C 64-byte aligned",
    "MTE2.latency_cycles": "seed 000 §2.2: global memory (DDR/HBM) access takes 200-300 cycles",
    "MTE2.burst_bytes": "seed 004 §1.2: 256-byte aligned transfers lift bandwidth use from 68% to "
                        "94%, i.e. memory moves in 256-byte bursts",
    "MTE2.bytes_per_cycle": "model choice: HBM (about 1.6 TB/s on 910B) shared by the cores and "
                            "helped by the L2, about 64 bytes per cycle per core",
    "MTE3": "model choice: the same path as MTE2, written back",
    "MTE1.bytes_per_cycle": "CANN tuning platform table (hicann/ge platform_util_stub.h): L1 to "
                            "L0A 512 bytes per cycle (L0B 256; the model uses the L0A figure)",
    "MTE1.latency_cycles": "seed 000 §2.2: L1 answers in 1-5 cycles",
    "vector_bytes_per_cycle": "hicann/ge platform_util_stub.h: vector_size 256 bytes per cycle",
    "vector_latency_cycles": "seed 000 §2.2: the Unified Buffer answers in 10-20 cycles",
    "cube_macs_per_cycle": "the DaVinci Cube: a 16x16x16 half-precision matrix multiply per cycle "
                           "(4096 MACs); float32 at a quarter and int8 at twice that rate is a "
                           "model choice",
    "cube_fractal": "Ascend C matrix layout: 16x16 fractals (NZ format)",
}

_910B_SOURCES = {
    **_COMMON_SOURCES,
    "cube_cores": "Ascend 910B (B1/B2): 24 AI cube cores, each paired with 2 vector cores (48 AIV)",
    "buffers": "catlass arch.hpp (AtlasA2): UB 192 KiB, L1 512 KiB, L0A 64 KiB, L0B 64 KiB, "
               "L0C 128 KiB",
    "clock_ghz": "model choice: 1.8 GHz",
}

_910_SOURCES = {
    **_COMMON_SOURCES,
    "cube_cores": "Ascend 910 (first generation): 32 DaVinci AI cores, cube and vector in one core",
    "buffers": "hicann/ge platform_util_stub.h (EVB1910): UB 256 KiB, L1 1 MiB, L0A 64 KiB, "
               "L0B 64 KiB, L0C 256 KiB",
    "clock_ghz": "model choice: 1.0 GHz",
}

_ALIGNMENT = {"UB": 32, "L1": 32, "L0A": 512, "L0B": 512, "L0C": 64}
_ENGINES = {
    "MTE2": Engine(bytes_per_cycle=64, latency_cycles=250, burst_bytes=256),
    "MTE3": Engine(bytes_per_cycle=64, latency_cycles=250, burst_bytes=256),
    "MTE1": Engine(bytes_per_cycle=512, latency_cycles=3, burst_bytes=32),
}

_910B = Profile(
    name="ascend910b", cube_cores=24, vector_per_cube=2, clock_ghz=1.8,
    buffers={"UB": 192 * KIB, "L1": 512 * KIB, "L0A": 64 * KIB, "L0B": 64 * KIB, "L0C": 128 * KIB},
    alignment=_ALIGNMENT, engines=_ENGINES,
    vector_bytes_per_cycle=256, vector_latency_cycles=15,
    cube_macs_per_cycle={1: 8192, 2: 4096, 4: 1024}, cube_fractal=16, cube_latency_cycles=15,
    sources=_910B_SOURCES)

PROFILES = {
    "ascend910b": _910B,
    # The first generation: the same units and engines, more and coupled cores, bigger buffers.
    "ascend910": replace(
        _910B, name="ascend910", cube_cores=32, vector_per_cube=1, clock_ghz=1.0,
        buffers={"UB": 256 * KIB, "L1": 1024 * KIB, "L0A": 64 * KIB, "L0B": 64 * KIB,
                 "L0C": 256 * KIB},
        sources=_910_SOURCES),
}

DEFAULT_PROFILE = "ascend910b"


def current_profile() -> Profile:
    """The profile NPUMEM_SIM_PROFILE names, with NPUMEM_SIM_CORES cube cores if that is set."""
    name = os.environ.get("NPUMEM_SIM_PROFILE", DEFAULT_PROFILE).strip().lower()
    if name not in PROFILES:
        raise InvalidParamError(f"NPUMEM_SIM_PROFILE={name!r} is not a known device profile; "
                                f"known: {', '.join(sorted(PROFILES))}")
    profile = PROFILES[name]
    cores = os.environ.get("NPUMEM_SIM_CORES")
    if cores is not None:
        try:
            count = int(cores)
        except ValueError:
            count = 0
        if not 1 <= count <= 1024:
            raise InvalidParamError(f"NPUMEM_SIM_CORES={cores!r} must be a whole number of cube "
                                    "cores from 1 to 1024")
        profile = replace(profile, cube_cores=count)
    return profile
