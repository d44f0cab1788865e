"""Tensors, the two-phase operator API and the operator registry.

    from npumem import ops
    a = ops.from_numpy(x); b = ops.empty(x.shape)
    size, executor = ops.aclnn.add_get_workspace_size(a, a, 2.0, b)
"""

from . import aclnn, arithmetic  # noqa: F401 - arithmetic installs Tensor's operators
from .executor import Executor, destroy_executor, set_executor_repeatable
from .registry import REGISTRY, OpImpl, list_ops, register_op
from .tensor import Scalar, Storage, Tensor, create_tensor, empty, from_numpy, zeros

__all__ = [
    "REGISTRY", "Executor", "OpImpl", "Scalar", "Storage", "Tensor", "aclnn", "create_tensor",
    "destroy_executor", "empty", "from_numpy", "list_ops", "register_op",
    "set_executor_repeatable", "zeros",
]
