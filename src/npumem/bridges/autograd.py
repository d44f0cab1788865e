"""`CustomMatMul`: a torch.autograd.Function whose forward and backward run npumem's two-phase
MatMul (seed 004's custom operator, with npumem in the place of the vendor kernel).

Each product is planned with `matmul_get_workspace_size`, given a workspace from npumem's pool and
queued on the current stream; inputs, outputs and gradients cross as zero-copy views (DLPack), so
nothing is copied between torch and npumem. It runs wherever npumem's backend can see the torch
tensors: the simulator and torch:cpu for cpu tensors, torch:cuda / torch:npu for their device's.
The backward needs A^T and B^T, non-contiguous views: phase 1 asks for their dense copies.

    npumem.init(backend="torch:cpu"); npumem.set_device(0)
    c = CustomMatMul()(a, b); c.sum().backward()
"""

from __future__ import annotations

from ..device.torch_backend import import_torch
from ..errors import OpParamError
from ..ops import aclnn
from ..ops.dlpack import from_dlpack
from ..runtime.state import RUNTIME

torch = import_torch()           # this bridge is PyTorch's: a clear error where it is missing


def npumem_matmul(a, b, out) -> int:
    """out = a @ b through the two-phase API on the current stream; returns the workspace size.

    `a`, `b` and `out` are torch tensors; `out` is written in place."""
    stream = RUNTIME.current_stream()            # starts the runtime on first use
    product = from_dlpack(out)
    planned = aclnn.matmul_get_workspace_size(from_dlpack(a), from_dlpack(b), product)
    size = aclnn.run_with_pool_workspace(aclnn.matmul, planned, stream)
    stream.synchronize()          # torch reads `out` as soon as we return
    return size


def _check(a, b) -> None:
    if a.dim() != 2 or b.dim() != 2:
        raise OpParamError(f"CustomMatMul: needs 2-D matrices, got shapes {tuple(a.shape)} and "
                           f"{tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise OpParamError(f"CustomMatMul: inner dims differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype or a.device != b.device:
        raise OpParamError(f"CustomMatMul: a is {a.dtype} on {a.device}, b is {b.dtype} on "
                           f"{b.device}; they must match")


class CustomMatMulFunction(torch.autograd.Function):
    """c = a @ b; grad_a = grad @ b^T, grad_b = a^T @ grad, all through npumem."""

    @staticmethod
    def forward(ctx, a, b):
        _check(a, b)
        c = torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
        npumem_matmul(a.detach(), b.detach(), c)
        ctx.save_for_backward(a, b)
        return c

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad = grad.detach()
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = torch.empty_like(a, memory_format=torch.contiguous_format)
            npumem_matmul(grad, b.detach().t(), grad_a)
        if ctx.needs_input_grad[1]:
            grad_b = torch.empty_like(b, memory_format=torch.contiguous_format)
            npumem_matmul(a.detach().t(), grad, grad_b)
        return grad_a, grad_b


def custom_matmul(a, b):
    """a @ b, differentiable, computed by npumem."""
    return CustomMatMulFunction.apply(a, b)


class CustomMatMul(torch.nn.Module):
    """The seed's module form, `CustomMatMul()(a, b)`; `CustomMatMul.apply(a, b)` works too, as
    for the autograd function (CustomMatMulFunction) it wraps."""

    apply = staticmethod(custom_matmul)

    def forward(self, a, b):
        return custom_matmul(a, b)
