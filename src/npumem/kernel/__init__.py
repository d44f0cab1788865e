"""Ascend C-shaped kernels in Python, run on the simulated device's AI cores.

    from npumem import kernel as K

    @K.kernel
    def add_custom(x, y, z, tile):
        start = K.get_block_idx() * tile
        pipe = K.TPipe()
        in_x, in_y = K.TQue(K.TPosition.VECIN, 2, "in_x"), K.TQue(K.TPosition.VECIN, 2, "in_y")
        out = K.TQue(K.TPosition.VECOUT, 2, "out")
        ...

See docs/aicore.md for the hierarchy, the cost model and a worked example.
"""

from ..aicore.profile import PROFILES, Profile, current_profile
from ..aicore.timeline import Timeline
from .context import get_block_idx, get_block_num
from .instructions import (
    abs, add, adds, cast, data_copy, data_copy_pad, data_copy_rows, div, duplicate, exp, ln, max, maxs, min, mins,
    mmad, mul, muls, reduce_max, reduce_sum, relu, sqrt, sub,
)
from .launch import RECENT, KernelFunction, Launch, kernel
from .pipe import TBuf, TPipe, TPosition, TQue
from .tensors import GlobalTensor, LocalTensor

__all__ = [
    "PROFILES", "RECENT", "GlobalTensor", "KernelFunction", "Launch", "LocalTensor", "Profile",
    "TBuf", "TPipe", "TPosition", "TQue", "Timeline", "abs", "add", "adds", "cast",
    "current_profile", "data_copy", "data_copy_pad", "data_copy_rows", "div", "duplicate", "exp",
    "get_block_idx", "get_block_num", "kernel", "ln", "max", "maxs", "min", "mins", "mmad", "mul",
    "muls", "reduce_max", "reduce_sum", "relu", "sqrt", "sub",
]
