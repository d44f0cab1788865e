"""Memory the GPU's kernels allocate for themselves, which a fake run cannot see: each rule
turns one operator call into the workspaces PyTorch's CUDA code asks its caching allocator for,
with the source it follows.

A rule returns (size, label, temporary): a temporary is freed before the operator returns; the
others are kept by PyTorch to the end of the process (per thread and stream, as cuBLAS's are).
cuDNN convolutions: the measured table where a call is in it, else conv_workspace.py's model
(`convolution_ranges` keeps each modelled workspace's range, in the order they are made).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading

from . import conv_workspace
from . import streams
from .targets import Target

MiB = 1 << 20
TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cudnn_workspaces.json")
MODELLED_LABEL = conv_workspace.MODELLED_LABEL

# every operator that takes a cuBLAS handle (aten/src/ATen/cuda/Blas.cpp and CUDABlas.cpp)
CUBLAS_OPS = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "addr",
              "_addmm_activation", "_int_mm", "_scaled_mm", "linalg_vecdot"}


def cublas_workspace_size(target: Target, environ=os.environ) -> int:
    """CublasHandlePool.cpp, parseChosenWorkspaceSize: CUBLAS_WORKSPACE_CONFIG's :SIZE:COUNT
    pairs (KiB) summed; unset: 4096 KiB x 8 on sm_90, else 4096 KiB x 2 + 16 KiB x 8."""
    config = environ.get("CUBLAS_WORKSPACE_CONFIG")
    default = 4096 * 8 * 1024 if (target.major, target.minor) == (9, 0) else 4096 * 1024 * 2 + 16 * 1024 * 8
    if config is None:
        return default
    pairs = re.findall(r":([0-9]+):([0-9]+)", config)
    return sum(int(size) * 1024 * int(count) for size, count in pairs) if pairs else default


def cublaslt_workspace_size(environ=os.environ) -> int:
    """CublasHandlePool.cpp, parseCUDABlasLtWorkspaceSize: CUBLASLT_WORKSPACE_SIZE KiB, default
    1024 (the separate cuBLASLt workspace PyTorch 2.11 allocates for addmm with a bias)."""
    try:
        return int(environ.get("CUBLASLT_WORKSPACE_SIZE", "1024")) * 1024
    except ValueError:
        return 1024 * 1024


def _nbytes(tensor) -> int:
    return math.prod(tensor.shape) * tensor.element_size()


def _describe(tensor) -> list:
    return [str(tensor.dtype)[6:], list(tensor.shape), list(tensor.stride())]


class KernelRules:
    def __init__(self, target: Target, environ=os.environ):
        self.target = target
        self.cublas = cublas_workspace_size(target, environ)
        self.cublaslt = cublaslt_workspace_size(environ)
        self._handles: set = set()          # ((thread, stream), kind) that have their workspace
        # NPUMEM_CONV_TABLE: another table (bench/conv_workspace_loo.py leaves a workload out);
        # NPUMEM_CONV_MEASURED=0: the model alone, the table only calibrating it
        with open(environ.get("NPUMEM_CONV_TABLE") or TABLE) as handle:
            table = json.load(handle)
        self.table_source = table["measured_on"]
        # measured on an sm_90 GPU: exact there (same shapes, strides, dtypes and arguments); the
        # heuristics of another architecture choose differently, so elsewhere the model answers
        measured = environ.get("NPUMEM_CONV_MEASURED", "1") != "0" and (target.major, target.minor) == (9, 0)
        self._table = {json.dumps(key): sizes for key, sizes in table["entries"]} if measured else {}
        self.calibration = conv_workspace.fit(table["entries"])
        self.convolution_ranges: list = []  # [likely, low, high] per modelled workspace, in call order
        self.convolution_counts = {"measured": 0, "modelled": 0}    # convolution calls
        self.convolution_reasons: dict = {}  # reason -> cuDNN operations
        self._planned: set = set()          # (thread, key) whose plan cuDNN has cached

    def workspaces(self, name: str, args) -> list[tuple[int, str, bool]]:
        """The workspaces of one call of operator `name` (aten's name, no namespace)."""
        if self.target.device != "cuda":     # an NPU has no cuBLAS or cuDNN
            return []
        if name in CUBLAS_OPS:
            return self._cublas(name, args)
        if name == "convolution":            # (input, weight, bias, stride, ..., groups)
            return self._convolution("forward", args[0], args[1], args[2], args[3:9])
        if name == "convolution_backward":   # (grad_output, input, weight, bias_sizes, ...)
            return self._convolution("backward", args[1], args[2], args[3], args[4:11])
        if name in _CONV_ENTRIES:           # reached as such under inference_mode
            return self._convolution("forward", *_as_convolution(name, args))
        if name == "_scaled_dot_product_cudnn_attention_backward":
            return _cudnn_attention_backward(args)
        if name in ("_efficient_attention_backward", "_scaled_dot_product_efficient_attention_backward"):
            return _efficient_attention_backward(args)
        if name in ("_scaled_dot_product_flash_attention_backward", "_flash_attention_backward"):
            return _flash_attention_backward(args, self.target,
                                             heads_second=not name.startswith("_flash"))
        return []

    def _cublas(self, name, args) -> list:
        """getCurrentCUDABlasHandle: one workspace per (handle, stream), a handle per thread
        (streams.py says the stream); the cuBLASLt path (addmm with a 1-D bias: gemm_and_bias)
        takes its own."""
        out = []
        where = (threading.get_ident(), streams.current())
        if (where, "cublas") not in self._handles:
            self._handles.add((where, "cublas"))
            out.append((self.cublas, "cuBLAS workspace", False))
        lt = name == "_addmm_activation" or (name == "addmm" and args[0].dim() == 1)
        if lt and (where, "cublaslt") not in self._handles:
            self._handles.add((where, "cublaslt"))
            out.append((self.cublaslt, "cuBLASLt workspace", False))
        return out

    def _convolution(self, kind, data, weight, bias, rest) -> list:
        """cuDNN picks its plan, and so its workspace, at run time (conv_workspace.py): the
        measured table where the call is in it (same shapes, strides, dtypes and arguments, on
        sm_90), else the model's most likely figure; its range is kept in convolution_ranges."""
        key = [kind, _describe(data), _describe(weight), bias is not None,
               *[list(a) if isinstance(a, (list, tuple)) else a for a in rest]]
        text = json.dumps(key)
        sizes = self._table.get(text)
        if sizes is not None:
            self.convolution_counts["measured"] += 1
            self._count("measured on the GPU (cudnn_workspaces.json)")
            return [(size, conv_workspace.MEASURED_LABEL, True) for size in sizes]
        self.convolution_counts["modelled"] += 1
        made, routed = conv_workspace.key_problems(key)
        if not made:
            self._count(routed)
            return []
        import torch
        flags = conv_workspace.torch_flags(torch)
        out = []
        for problem in made:
            space = conv_workspace.workspace(problem, self.calibration, flags)
            self._count(space.reason)
            first = (threading.get_ident(), problem.op, text) not in self._planned
            if flags.benchmark and first:   # get_plans_from_find: every plan's largest, then freed
                out.append((conv_workspace.find_workspace(problem), conv_workspace.FIND_LABEL, True))
            self._planned.add((threading.get_ident(), problem.op, text))
            if space.likely:
                self.convolution_ranges.append([space.likely, space.low, space.high])
                out.append((space.likely, conv_workspace.MODELLED_LABEL, True))
        return out

    def _count(self, reason: str) -> None:
        self.convolution_reasons[reason] = self.convolution_reasons.get(reason, 0) + 1

    @property
    def convolution_reason_counts(self) -> str:
        """One line: each reason a convolution's workspace was set by, with its count."""
        ranked = sorted(self.convolution_reasons.items(), key=lambda item: -item[1])
        return "; ".join(f"{reason} x{count}" for reason, count in ranked)


# the entries above aten.convolution that inference_mode dispatches as they are (their
# CompositeImplicitAutograd decomposition into convolution runs at the autograd key it skips)
_CONV_ENTRIES = {"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                 "conv_transpose3d", "_convolution"}


def _as_convolution(name, args) -> tuple:
    """(input, weight, bias, [stride, padding, dilation, transposed, output_padding, groups]) of
    a convolution entry point, its schema's defaults filled in (Convolution.cpp conv2d and
    conv_transpose2d; _convolution_mode's "valid" and symmetric "same" padding)."""
    data, weight, *rest = args
    dims = weight.dim() - 2
    bias = rest[0] if rest else None
    rest = list(rest[1:])

    def ints(value, default):
        value = default if value is None else value
        return [int(value)] * dims if isinstance(value, int) else [int(v) for v in value]

    if name == "_convolution":
        stride, padding, dilation, transposed, output_padding, groups = rest[:6]
    elif name.startswith("conv_transpose"):
        rest += [None] * (5 - len(rest))
        stride, padding, output_padding, groups, dilation = rest[:5]
        transposed = True
    else:
        rest += [None] * (4 - len(rest))
        stride, padding, dilation, groups = rest[:4]
        output_padding, transposed = 0, False
    dilation = ints(dilation, 1)
    if isinstance(padding, str):
        padding = [0] * dims if padding == "valid" else \
            [d * (int(k) - 1) // 2 for d, k in zip(dilation, weight.shape[2:])]
    return data, weight, bias, [ints(stride, 1), ints(padding, 0), dilation, bool(transposed),
                                ints(output_padding, 0), int(groups or 1)]


def _cudnn_attention_backward(args) -> list:
    """cuDNN's fused attention backward (MHA.cpp, run_cudnn_SDP_bprop): dQ accumulated in fp32
    (B*H*Lq*D*4), the softmax statistics (B*H*Lq*4) and a 256-byte scratch."""
    query = args[1]
    batch, heads, length, dim = (int(x) for x in query.shape)
    return [(batch * heads * length * dim * 4 + batch * heads * length * 4 + 256,
             "cuDNN attention backward workspace", True)]


def _efficient_attention_backward(args) -> list:
    """The memory-efficient attention backward (attention_backward.cu): a contiguous copy of a
    strided grad_out, delta = (grad_out * out).sum(-1) in fp32 (B*H*Lq*4) and its copy, and the
    kernel's workspace: gQ accumulated in fp32 over tiles of 128 queries, with a 32-byte
    counter per tile."""
    grad_out, query = args[0], args[1]
    batch, heads, length, dim = (int(x) for x in query.shape)
    out = []
    if not grad_out.is_contiguous():
        out.append((_nbytes(grad_out), "efficient attention: contiguous grad_out", True))
    tiles = -(-length // 128)
    out += [(batch * heads * length * 4, "efficient attention: delta", True),
            (batch * heads * length * 4, "efficient attention: delta", True),
            (batch * heads * tiles * (128 * dim * 4 + 32), "efficient attention workspace", True)]
    return out


def _flash_attention_backward(args, target: Target, heads_second: bool = True) -> list:
    """FlashAttention-2's backward (attention_backward.cu, _flash_attention_backward, and
    flash_api.cpp, mha_bwd): contiguous copies of grad_out and out where the (B, L, H, D) views
    it reads are not contiguous; softmax_d, fp32 (B, H, Lq rounded to 128); dq_accum, fp32
    (B, Lq rounded to 128, H, D rounded to 32, or 64 past 128) -- under
    torch.use_deterministic_algorithms (not warn-only) zeroed and split
    ceil(SMs / (B * H)) ways; with fewer key heads (GQA) dK and dV expanded to every query head
    in the input dtype, then summed. `heads_second`: the (B, H, L, D) layout of
    _scaled_dot_product_flash_attention_backward (else _flash_attention_backward's B, L, H, D)."""
    import torch
    grad_out, query, key, out_ = args[0], args[1], args[2], args[4]
    views = [t.transpose(1, 2) if heads_second else t for t in (grad_out, query, key, out_)]
    grad_blhd, q_blhd, k_blhd, out_blhd = views
    batch, length, heads, dim = (int(x) for x in q_blhd.shape)
    length_k, heads_k = int(k_blhd.shape[1]), int(k_blhd.shape[2])
    found = []
    for tensor, what in ((grad_blhd, "grad_out"), (out_blhd, "out")):
        if not tensor.is_contiguous():
            found.append((_nbytes(tensor), f"flash attention: contiguous {what}", True))
    rounded = -(-length // 128) * 128
    dim8 = -(-dim // 8) * 8
    step = 32 if dim8 <= 128 else 64
    dim_rounded = -(-dim8 // step) * step
    splits = 1
    if torch.are_deterministic_algorithms_enabled() \
            and not torch.is_deterministic_algorithms_warn_only_enabled():
        splits = -(-target.sm_count // (batch * heads))
    found += [(batch * heads * rounded * 4, "flash attention backward: softmax_d", True),
              (splits * batch * rounded * heads * dim_rounded * 4,
               "flash attention backward: dq_accum", True)]
    if heads_k != heads:
        expanded = batch * length_k * heads * dim8 * query.element_size()
        found += [(expanded, "flash attention backward: expanded dK", True),
                  (expanded, "flash attention backward: expanded dV", True)]
    return found
