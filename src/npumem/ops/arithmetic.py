"""Tensor arithmetic as torch users write it: a + b, a - b, a * b, a / b, a @ b, and with a
number on either side of + and *. Each runs aclnn's two-phase op on the current stream (the one
`npumem.stream(s)` sets), its workspace from the caching pool, into a new tensor. + - * / of
two tensors whose plan is simple take the lean route of ops/fastpath.py, which does the same.

The operators are installed on Tensor here: tensor.py cannot import the ops, which import it.
"""

from __future__ import annotations

import numpy as np

from ..errors import OpParamError
from ..runtime.state import RUNTIME
from . import aclnn
from .fastpath import FAST, OPS as FAST_OPS
from ..dtypes import numpy_dtype
from .tensor import Tensor, empty, from_numpy, result


def _binary(op: str, left: Tensor, right, out: Tensor | None = None) -> Tensor:
    """`left op right` with aclnn's two-phase op on the current stream; a number on the right
    becomes a tensor of left's dtype. `out`: the result the lean route (ops/fastpath.py)
    allocated before it handed the call over."""
    if not isinstance(right, Tensor):
        if not isinstance(right, (int, float)) or isinstance(right, bool):
            return NotImplemented
        right = from_numpy(np.full(left.shape, right, numpy_dtype(left.dtype)))
    stream = RUNTIME.current_stream()
    if op == "matmul":
        if left.ndim != 2 or right.ndim != 2:
            raise OpParamError(f"@ takes 2-d tensors here, got shapes {left.shape} and {right.shape}")
        out = empty((left.shape[0], right.shape[1]), dtype=left.dtype, stream=stream)
        planned = aclnn.matmul_get_workspace_size(left, right, out)
    else:
        shape = left.shape
        if right.shape != shape:          # broadcast_shapes costs more than the rest of phase 1
            try:
                shape = np.broadcast_shapes(left.shape, right.shape)
            except ValueError:
                raise OpParamError(f"{op}: shapes {left.shape} and {right.shape} do not "
                                   "broadcast") from None
        if out is None:                   # (else the lean route allocated it already)
            out = result(shape, left.dtype, stream)
        phase1 = getattr(aclnn, f"{op}_get_workspace_size")
        planned = phase1(left, right, 1, out) if op in ("add", "sub") else phase1(left, right, out)
        if op in FAST_OPS:
            FAST.remember(op, left, right, out, planned)
    aclnn.run_with_pool_workspace(getattr(aclnn, op), planned, stream)
    return out



def _operator(op: str, reflected: bool = False):
    if op in FAST_OPS and not reflected:
        def apply(self: Tensor, other):
            if type(other) is Tensor and type(self) is Tensor:     # the common case first
                done, out = FAST.run(op, self, other)
                if done is not None:
                    return done
                return _binary(op, self, other, out)
            return _binary(op, self, other)
    else:
        def apply(self: Tensor, other):
            return _binary(op, self, other)
    apply.__name__ = f"__{'r' if reflected else ''}{'truediv' if op == 'div' else op}__"
    apply.__doc__ = f"self {op} other, queued on the current stream"
    return apply


for _op in ("add", "sub", "mul", "div", "matmul"):
    setattr(Tensor, f"__{'truediv' if _op == 'div' else _op}__", _operator(_op))
Tensor.__radd__ = _operator("add", reflected=True)      # a number + tensor: order does not matter
Tensor.__rmul__ = _operator("mul", reflected=True)
