"""What versions an estimate models: the PyTorch, cuDNN and CUDA of the GPU run being predicted,
which decide the attention kernel (attention.py) and so what it keeps.

Defaults: the installed PyTorch (its version, as a tuple), cuDNN 9.19.0 (what the stand-in
device reports, stand_in_device.cpp: the build the measured tables come from; a CUDA wheel's
own cuDNN is not read) and CUDA 13.0. The child's spec may override them ("torch_version",
"cudnn_version", "cuda_version"); so may NPUMEM_TORCH_VERSION / NPUMEM_CUDNN_VERSION, for a
run (bench/estimate_accuracy.py) that has no option to pass.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

STAND_IN_CUDNN = 91900       # stand_in_device.cpp: versionRuntimeCuDNN()
DEFAULT_CUDA = (13, 0)


def parse_version(text) -> tuple[int, ...]:
    """'2.11', '2.11.0+cu130', (2, 11) -> (2, 11, 0)."""
    if isinstance(text, (tuple, list)):
        parts = [int(x) for x in text]
    else:
        found = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", str(text))
        if not found:
            raise ValueError(f"not a version: {text!r}")
        parts = [int(x) for x in found.groups(default="0")]
    return tuple((parts + [0, 0, 0])[:3])


def parse_cudnn(text) -> int:
    """cuDNN's own integer form: 91900, '91900' or '9.19.0' -> 91900 (major*10000 +
    minor*100 + patch, as cudnnGetVersion gives it from 9.0 on)."""
    if isinstance(text, int):
        return text
    text = str(text).strip()
    if text.isdigit() and int(text) >= 10000:
        return int(text)
    major, minor, patch = parse_version(text if not text.isdigit() else f"{text}.0")
    if not 8 <= major <= 19 or minor > 99 or patch > 99:
        raise ValueError(f"not a cuDNN version: {text!r}")
    return major * 10000 + minor * 100 + patch


def installed_torch() -> tuple[int, ...]:
    import torch
    return parse_version(torch.__version__)


@dataclass(frozen=True)
class Modelled:
    torch: tuple[int, ...]
    cudnn: int = STAND_IN_CUDNN
    cuda: tuple[int, ...] = DEFAULT_CUDA

    @classmethod
    def installed(cls) -> "Modelled":
        return cls(installed_torch())

    @classmethod
    def from_spec(cls, spec: dict | None = None, environ=os.environ) -> "Modelled":
        """The spec's keys where given, else the environment's, else the defaults."""
        spec = spec or {}
        torch_version = spec.get("torch_version") or environ.get("NPUMEM_TORCH_VERSION")
        cudnn = spec.get("cudnn_version") or environ.get("NPUMEM_CUDNN_VERSION")
        cuda = spec.get("cuda_version") or environ.get("NPUMEM_CUDA_VERSION")
        return cls(parse_version(torch_version) if torch_version else installed_torch(),
                   parse_cudnn(cudnn) if cudnn else STAND_IN_CUDNN,
                   parse_version(cuda)[:2] if cuda else DEFAULT_CUDA)

    def as_dict(self) -> dict:
        return {"torch": ".".join(map(str, self.torch)), "cuda": ".".join(map(str, self.cuda)),
                "cudnn": f"{self.cudnn // 10000}.{self.cudnn // 100 % 100}.{self.cudnn % 100}",
                "text": self.describe()}

    def describe(self) -> str:
        cudnn = f"{self.cudnn // 10000}.{self.cudnn // 100 % 100}.{self.cudnn % 100}"
        return (f"PyTorch {'.'.join(map(str, self.torch[:2]))}, cuDNN {cudnn}, "
                f"CUDA {'.'.join(map(str, self.cuda))}")
