"""npumem: accelerator device memory for Ascend NPUs and GPUs, with a simulated NPU built in.

    import npumem
    npumem.init(); npumem.set_device(0)
    ptr = npumem.malloc(1 << 20)
    ...
    npumem.free(ptr); npumem.reset_device(0); npumem.finalize()

`npumem.acl` is a pyACL-compatible module (return codes instead of exceptions).
"""

from . import errors
from .constants import DataType, EventStatus, Format, MallocPolicy, MemAttr, MemcpyKind, RunMode
from .errors import AclError
from .runtime import *  # noqa: F401,F403 - the runtime API is the top-level API
from .runtime import __all__ as _runtime_all
from . import ops
from .ops import Scalar, Tensor, aclnn, create_tensor, empty, from_numpy, zeros
from .ops.dlpack import from_dlpack
from .zero_copy import ZeroCopyMemory
from .accelerator import (
    current_device, current_stream, default_stream, device_count, is_available, stream, synchronize,
)
from . import kvcache, pipeline, precision, profile

profile._start_from_environment()      # NPUMEM_PROFILE=1 profiles the whole process

__version__ = "0.1.0"

__all__ = [
    "errors", "AclError", "DataType", "EventStatus", "Format", "MallocPolicy", "MemAttr",
    "MemcpyKind", "RunMode", "__version__", "ops", "aclnn", "Tensor", "Scalar", "empty", "zeros",
    "from_numpy", "from_dlpack", "create_tensor", "ZeroCopyMemory", "kvcache", "pipeline", "precision", "profile",
    "current_device", "current_stream", "default_stream", "device_count", "is_available", "stream",
    "synchronize", *_runtime_all,
]
