"""The devices `npumem estimate` predicts for: memory, multiprocessors and compute capability,
which the caching allocator's capacity and the kernels' own allocations depend on.

Memory is PyTorch's `get_device_properties().total_memory` (a little under nvidia-smi's total):
measured on the H200 lent to this project; for the others, the "total capacity" PyTorch's own
out-of-memory messages print on those boards (GIB below). The capacity a script can use is that
less the CUDA context the runtime takes before the first tensor (CONTEXT; `--memory` overrides
the whole figure). Multiprocessor counts and capabilities are NVIDIA's published figures.
"""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
GIB = 1 << 30
CONTEXT = 512 * MiB          # what the CUDA runtime holds before PyTorch allocates


@dataclass(frozen=True)
class Target:
    key: str                 # what --gpu takes
    name: str                # the name PyTorch reports
    device: str              # "cuda" or "npu"
    total_memory: int
    sm_count: int            # multiprocessors (AI cores on an NPU)
    major: int               # compute capability (0 on an NPU)
    minor: int
    soc: str | None = None   # the NPU's SoC name (torch_npu's padding rules)

    @property
    def capacity(self) -> int:
        """The memory a script's allocator can reserve."""
        return self.total_memory - CONTEXT

    def describe(self) -> str:
        size = f"{self.total_memory / 2**30:.0f} GiB"
        if self.device == "npu":
            return f"{self.name} ({size}, {self.sm_count} AI cores)"
        return f"{self.name} ({size}, {self.sm_count} SMs, sm_{self.major}{self.minor})"


TARGETS = {t.key: t for t in (
    Target("h100", "NVIDIA H100 80GB HBM3", "cuda", int(79.11 * GIB), 132, 9, 0),
    Target("h100-pcie", "NVIDIA H100 PCIe", "cuda", int(79.11 * GIB), 114, 9, 0),
    Target("h200", "NVIDIA H200", "cuda", 150_109_880_320, 132, 9, 0),     # measured
    Target("a100-80", "NVIDIA A100-SXM4-80GB", "cuda", int(79.33 * GIB), 108, 8, 0),
    Target("a100-40", "NVIDIA A100-SXM4-40GB", "cuda", int(39.50 * GIB), 108, 8, 0),
    Target("l4", "NVIDIA L4", "cuda", int(22.03 * GIB), 58, 8, 9),
    Target("rtx4090", "NVIDIA GeForce RTX 4090", "cuda", int(23.64 * GIB), 128, 8, 9),
    Target("910b", "Ascend910B2", "npu", 65536 * MiB, 24, 0, 0, soc="Ascend910B2"),
)}
DEFAULT = {"cuda": "h100", "npu": "910b"}


def target(key: str | None, device: str = "cuda") -> Target:
    """The profile named `key` (case and '-'/'_' ignored), or the device's default."""
    wanted = (key or DEFAULT[device]).lower().replace("_", "-")
    found = TARGETS.get(wanted)
    if found is None:
        raise KeyError(f"unknown --gpu {key!r}; known: {', '.join(TARGETS)}")
    return found
