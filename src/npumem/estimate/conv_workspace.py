"""cuDNN convolution workspaces by rule: for one aten convolution call, which cuDNN operations
run (PyTorch's routing) and, for each, the workspace it most likely asks the caching allocator
for, with a stated range.

Sources, each named where it is used:
- aten/src/ATen/native/Convolution.cpp (_select_conv_backend, ConvParams::use_cudnn,
  use_cudnn_depthwise, is_depthwise, check_cudnn_depthwise_workload_with_filter): when cuDNN
  runs at all; 1-D convolutions are viewed as 2-D with H = 1 (_convolution, view1d_as_2d).
- aten/src/ATen/native/ConvUtils.h (cudnn_conv_suggest_memory_format): NHWC or NCHW descriptors.
- aten/src/ATen/native/cudnn/Conv_v8.cpp: run_conv_plan asks the caching allocator for the
  plan's workspace (nothing for 0 bytes); the first call of a key tries the heuristics' configs
  in order and goes on to the next one when the workspace allocation raises OutOfMemoryError
  (try_configs), then keeps the plan per key (benchmark_cache, thread local); with
  cudnn.benchmark, get_plans_from_find allocates the largest workspace of every plan that fits
  the largest free block (halving on OOM), times them, frees it, empties the cache
  (_cudnn_get_conv_benchmark_empty_cache, on by default), then runs the fastest plan.
  filterEngineConfigs drops tensor-core engines for float32 when allow_tf32 is off and
  non-deterministic ones when deterministic is on. convolution_backward runs the data
  gradient, then the weight gradient (cudnn_convolution_backward).
- cuDNN's documented algorithm families (cudnnConvolutionFwdAlgo_t): IMPLICIT_GEMM needs no
  workspace (so a plan with none always exists: what a run needs at least is 0);
  IMPLICIT_PRECOMP_GEMM a small index buffer; GEMM an explicit im2col matrix; FFT and
  FFT_TILING the transformed tensors; WINOGRAD_NONFUSED its transformed tiles. NVIDIA's "Tensor
  Ops Made Easier in cuDNN": tensor-core engines on packed NCHW data transform it to NHWC
  internally, in the workspace.

What the sources leave open, the choice cuDNN's heuristics make between a tensor-core engine
that transposes NCHW operands and one that needs nothing, is calibrated on the measured table
(cudnn_workspaces.json) by `fit`, and bench/conv_workspace_loo.py scores it leaving each
workload out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MODELLED_LABEL = "cuDNN convolution workspace (modelled)"
MEASURED_LABEL = "cuDNN convolution workspace"
FIND_LABEL = "cuDNN benchmark find workspace (modelled)"
SCRATCH = 16            # the few bytes every transposing plan measured adds beyond its copies
_ELEMENT = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


@dataclass(frozen=True)
class Problem:
    """One cuDNN operation in cuDNN's own terms: x (N, C, *spatial) convolved with w (K, C/g,
    *kernel) into y (N, K, *out). A data gradient computes x from y, a weight gradient w."""
    op: str                         # "forward" | "backward_data" | "backward_weight"
    n: int
    c: int
    k: int
    groups: int
    spatial: tuple
    out: tuple
    kernel: tuple
    stride: tuple
    dtype: str
    channels_last: bool

    @property
    def element(self) -> int:
        return _ELEMENT.get(self.dtype, 4)

    @property
    def x_bytes(self) -> int:
        return self.n * self.c * math.prod(self.spatial) * self.element

    @property
    def y_bytes(self) -> int:
        return self.n * self.k * math.prod(self.out) * self.element

    @property
    def w_bytes(self) -> int:
        return self.k * (self.c // self.groups) * math.prod(self.kernel) * self.element

    @property
    def macs(self) -> int:
        return self.n * self.k * math.prod(self.out) * (self.c // self.groups) * math.prod(self.kernel)

    @property
    def pointwise(self) -> bool:
        return all(r == 1 for r in self.kernel)

    @property
    def strided(self) -> bool:
        return any(s != 1 for s in self.stride)

    @property
    def channels_in(self) -> int:
        """Channels per group the operation reads (a data gradient reads y's)."""
        return (self.k if self.op == "backward_data" else self.c) // self.groups


@dataclass
class Workspace:
    op: str
    likely: int
    low: int
    high: int
    reason: str


@dataclass
class Calibration:
    """The heuristics' choices the sources leave open, fitted on measured workspaces (`fit`)."""
    forward_macs: float = 1.0e8      # below this (and under `forward_channels`): no transposes
    forward_channels: int = 64       # from this many input channels the forward transposes
    data_macs: float = 1.0e8         # a data gradient transposes from this many MACs
    weight_ratio: float = 1.05       # weight gradient: this many times x + y + w bytes
    weight_ratio_wide: float = 2.3   # the same for a wide (forward_channels) unstrided k x k one
    weight_pointwise_channels: float = 22.6   # a strided 1x1 weight gradient below: none
    weight_high: float = 2.6         # the most a weight gradient took, in the same unit
    entries: int = 0                 # how many measurements it was fitted on


@dataclass
class Flags:
    """torch.backends.cudnn's settings at the call (Context.cpp)."""
    enabled: bool = True
    benchmark: bool = False
    deterministic: bool = False
    allow_tf32: bool = True


def torch_flags(torch) -> Flags:
    c = torch._C
    return Flags(enabled=c._get_cudnn_enabled(), benchmark=c._get_cudnn_benchmark(),
                 deterministic=c._get_cudnn_deterministic() or c._get_deterministic_algorithms(),
                 allow_tf32=c._get_cudnn_allow_tf32())


def output_spatial(spatial, kernel, stride, padding, dilation, transposed, output_padding) -> tuple:
    """ConvUtils.h conv_output_size / conv_input_size."""
    if transposed:
        return tuple((i - 1) * s - 2 * p + d * (r - 1) + op + 1 for i, r, s, p, d, op
                     in zip(spatial, kernel, stride, padding, dilation, output_padding))
    return tuple((i + 2 * p - d * (r - 1) - 1) // s + 1 for i, r, s, p, d
                 in zip(spatial, kernel, stride, padding, dilation))


def _channels_last(shape, strides) -> bool:
    """c10's suggest_memory_format for 4-D/5-D: channels innermost, with more than one channel."""
    if len(shape) not in (4, 5) or shape[1] == 1:
        return False
    order = [1, *range(len(shape) - 1, 1, -1), 0]   # C, W, H(, D), N from innermost
    expected = 1
    for dim in order:
        if shape[dim] != 1 and strides[dim] != expected:
            return False
        expected *= shape[dim]
    return math.prod(shape[2:]) > 1


def problems(kind, data, weight, params, mask=None) -> tuple[list[Problem], str]:
    """The cuDNN operations one call runs, in order, or none and why (Convolution.cpp).

    data/weight: (dtype name, shape, strides); params: (stride, padding, dilation, transposed,
    output_padding, groups); mask: convolution_backward's output_mask."""
    dtype, shape, strides = data
    wdtype, wshape, wstrides = weight
    stride, padding, dilation, transposed, output_padding, groups = params
    stride, padding, dilation, output_padding = (list(v) for v in (stride, padding, dilation, output_padding))
    if len(shape) == 3:                               # _convolution: view1d_as_2d
        shape, wshape = [shape[0], shape[1], 1, shape[2]], [*wshape[:2], 1, wshape[2]]
        strides = wstrides = None
        stride, padding, dilation, output_padding = ([a, *b] for a, b in
                                                     zip((1, 0, 1, 0), (stride, padding, dilation, output_padding)))
    if shape[0] == 0 or shape[1] == 0:
        return [], "empty input: no kernel runs (_select_conv_backend)"
    if dtype not in _ELEMENT:
        return [], f"{dtype}: not a cuDNN convolution"
    channels_last = dtype != "float64" and wdtype != "float64" and len(wshape) in (4, 5) and (
        (strides is not None and _channels_last(shape, strides))
        or (wstrides is not None and _channels_last(wshape, wstrides)))
    depthwise = (not transposed and len(shape) in (4, 5) and shape[1] == groups and groups > 1
                 and wshape[0] % shape[1] == 0)
    spatial, kernel = tuple(shape[2:]), tuple(wshape[2:])
    if depthwise and not channels_last and not _cudnn_depthwise(dtype, shape, wshape, stride, dilation):
        return [], ("depthwise: PyTorch's own CUDA kernel, no cuDNN workspace "
                    "(Convolution.cpp use_cudnn_depthwise: NCHW and not the fp16 workloads it lists)")
    if transposed and any(op >= s for op, s in zip(output_padding, stride)):
        return [], "output_padding >= stride: PyTorch's slow transposed kernel, not cuDNN (use_cudnn)"
    out = output_spatial(spatial, kernel, stride, padding, dilation, transposed, output_padding)
    n = shape[0]
    if transposed:    # cuDNN's forward problem runs from the transposed conv's output to its input
        c, k, x_sp, y_sp = wshape[1] * groups, wshape[0], out, spatial
    else:
        c, k, x_sp, y_sp = shape[1], wshape[0], spatial, out
    ops = (["backward_data"] if transposed else ["forward"]) if kind == "forward" else []
    if kind == "backward":
        mask = mask or [True, True, False]
        if mask[0]:
            ops.append("forward" if transposed else "backward_data")
        if mask[1]:
            ops.append("backward_weight")
    made = [Problem(op, n, c, k, groups, tuple(x_sp), tuple(y_sp), kernel, tuple(stride), dtype, channels_last)
            for op in ops]
    return made, "depthwise through cuDNN (channels_last or a listed fp16 workload)" if depthwise else ""


def _cudnn_depthwise(dtype, shape, wshape, stride, dilation) -> bool:
    """Convolution.cpp use_cudnn_depthwise for NCHW: fp16 4-D, no dilation, square stride, at
    least 32 channels, then check_cudnn_depthwise_workload_with_filter."""
    if dtype != "float16" or len(shape) != 4 or any(d != 1 for d in dilation) or shape[1] < 32:
        return False
    if stride[0] != stride[1] and shape[2] != 1:
        return False
    if shape[2] == 1 and stride[1] == 1:
        return True
    if wshape[2] != wshape[3] or wshape[3] not in (1, 3, 5) or shape[3] < 7:
        return False
    s, r, w, ch, bs = stride[1], wshape[3], shape[3], shape[1], shape[0]
    if s == 1:
        return True
    if s != 2:
        return False
    if bs == 1:
        return (r == 1 and w <= 28) or r in (3, 5)
    return (r == 1 and bs <= 16 and ch >= 128 and w <= 7) or (r in (3, 5) and (ch >= 512 or (ch >= 256 and w >= 28)))


def workspace(p: Problem, cal: Calibration, flags: Flags) -> Workspace:
    """The most likely workspace of one cuDNN operation, its range and the rule that set it."""
    copies = p.x_bytes + p.y_bytes + p.w_bytes + SCRATCH      # every operand transposed
    # the range: 0, IMPLICIT_GEMM's, which the retry on a failed allocation ends at (what a run
    # needs at least), to the largest measured on this GPU for any operation, in x + y + w bytes,
    # and a quarter more for shapes unlike the measured
    high = max(int(1.25 * cal.weight_high * copies), copies)
    tensor_cores = p.dtype in ("float16", "bfloat16") or (p.dtype == "float32" and flags.allow_tf32)
    if not tensor_cores:
        why = ("float64" if p.dtype == "float64" else "float32 with cudnn.allow_tf32 off: "
               "filterEngineConfigs drops tensor-core engines")
        return Workspace(p.op, 0, 0, high, f"{why}; the NCHW-native implicit GEMM needs no workspace")
    if p.channels_last:
        likely = int(cal.weight_ratio * p.w_bytes) if p.op == "backward_weight" else 0
        return Workspace(p.op, likely, 0, high, "channels_last: the tensor cores' own layout, no "
                         "transposes (cudnn_conv_suggest_memory_format)")
    if p.op == "backward_weight":
        if p.pointwise and p.strided and p.channels_in < cal.weight_pointwise_channels:
            return Workspace(p.op, 0, 0, high, "1x1 strided weight gradient on few channels: a "
                             "reduction without workspace, calibrated")
        if _wide(p):
            return Workspace(p.op, int(cal.weight_ratio_wide * copies), 0, high,
                             f"wide weight gradient: x and dy transposed to NHWC plus split-K partial "
                             f"dw, {cal.weight_ratio_wide:.2f} x (x + y + w) calibrated")
        return Workspace(p.op, int(cal.weight_ratio * copies), 0, high,
                         f"weight gradient: x and dy transposed to NHWC plus its reduction, "
                         f"{cal.weight_ratio:.2f} x (x + y + w) calibrated")
    if p.pointwise and p.strided:
        return Workspace(p.op, 0, 0, high, "1x1 strided: an implicit GEMM over the sampled pixels, "
                         "no workspace")
    if p.pointwise:
        return Workspace(p.op, p.w_bytes + SCRATCH, 0, high, "1x1 stride 1: a GEMM per image on NCHW "
                         "data; only the weight is transposed")
    if p.op == "forward":
        if p.channels_in < 8:
            return Workspace(p.op, 0, 0, high, "fewer than 8 input channels: no tensor-core tile, "
                             "the implicit GEMM needs no workspace")
        if p.channels_in >= cal.forward_channels or p.macs >= cal.forward_macs:
            return Workspace(p.op, p.x_bytes + p.w_bytes + SCRATCH, 0, high,
                             "tensor-core engine on NCHW: x and w transposed to NHWC")
        return Workspace(p.op, 0, 0, high, "small forward: the heuristics keep an NCHW implicit GEMM "
                         "(no workspace), calibrated")
    if p.macs >= cal.data_macs:
        return Workspace(p.op, copies, 0, high, "tensor-core engine on NCHW: dy, dx and w transposed "
                         "to NHWC")
    return Workspace(p.op, 0, 0, high, "small data gradient: the heuristics keep an NCHW implicit "
                     "GEMM (no workspace), calibrated")


def _wide(p: Problem) -> bool:
    """A k x k unstrided weight gradient over many channels: where the measured weight gradients
    took twice the others (2.1-2.6 against 1.0-1.5 times x + y + w)."""
    return not p.pointwise and not p.strided and p.channels_in >= Calibration.forward_channels


def find_workspace(p: Problem) -> int:
    """cudnn.benchmark: get_plans_from_find allocates the largest workspace among all plans that
    fit; the largest family by its documented form: GEMM's explicit im2col matrix
    (C/g * R * S x N * out pixels), FFT's padded complex transforms of x, w and y (stride 1), and
    the transposes."""
    pixels = math.prod(p.out)
    im2col = (p.c // p.groups) * math.prod(p.kernel) * p.n * pixels * p.element
    fft = 0
    if not p.strided and not p.pointwise:
        padded = math.prod(i + r - 1 for i, r in zip(p.spatial, p.kernel))
        fft = 8 * (padded // 2 + 1) * (p.n * p.c + p.k * (p.c // p.groups) + p.n * p.k)
    copies = p.x_bytes + p.y_bytes + p.w_bytes + SCRATCH
    return max(im2col, fft, 3 * copies)


def fit(entries) -> Calibration:
    """Calibrate the open choices on measured rows [key, sizes] (cudnn_workspaces.json's
    entries). The gates: the geometric mean between the largest problem measured at 0 and the
    smallest measured with transposes; the weight-gradient ratio: the median of the measured
    ratios (wide ones apart), its high the largest. A backward call that ran two operations but shows one workspace
    is ambiguous and left out, unless a source rule gives one of them none (a strided 1x1 data
    gradient)."""
    seen = {"forward": ([], []), "backward_data": ([], []), "pointwise_weight": ([], [])}
    ratios, wide = [], []
    for key, sizes in entries:
        made = key_problems(key)[0]
        if len(sizes) == len(made) or not sizes:
            pairs = list(zip(made, sizes)) if sizes else [(p, 0) for p in made]
        elif len(made) == 2 and len(sizes) == 1 and made[0].pointwise and made[0].strided:
            pairs = [(made[1], sizes[0])]
        else:
            continue
        for p, size in pairs:
            if p.op == "backward_weight":
                if p.pointwise and p.strided:
                    seen["pointwise_weight"][bool(size)].append(p.channels_in)
                if size:
                    (wide if _wide(p) else ratios).append(size / (p.x_bytes + p.y_bytes + p.w_bytes + SCRATCH))
            elif not p.pointwise and p.channels_in >= 8 and not (
                    p.op == "forward" and p.channels_in >= Calibration.forward_channels):
                seen[p.op][bool(size)].append(p.macs)
    cal = Calibration(entries=len(entries))
    cal.forward_macs = _gate(*seen["forward"], cal.forward_macs)
    cal.data_macs = _gate(*seen["backward_data"], cal.data_macs)
    cal.weight_pointwise_channels = _gate(*seen["pointwise_weight"], cal.weight_pointwise_channels)
    for name, found in (("weight_ratio", ratios), ("weight_ratio_wide", wide)):
        if found:
            setattr(cal, name, sorted(found)[len(found) // 2])
    if ratios or wide:
        cal.weight_high = max(ratios + wide)
    return cal


def _gate(zeros, copies, default) -> float:
    """The threshold between the problems measured at 0 and those with transposes."""
    if not zeros and not copies:
        return default
    if not copies:
        return max(zeros) * 2
    below = max(zeros, default=min(copies) / 2)
    above = min((c for c in copies if c > below), default=below * 2)
    return math.sqrt(below * above)


def key_problems(key) -> tuple[list[Problem], str]:
    """problems() of a measured table key (kernel_rules' key format)."""
    kind, data, weight, _bias, stride, padding, dilation, transposed, output_padding, groups, *rest = key
    return problems(kind, data, weight, (stride, padding, dilation, transposed, output_padding, groups),
                    rest[0] if rest else None)


def predict_key(key, cal: Calibration, flags: Flags | None = None) -> list[Workspace]:
    """The modelled workspaces (zeros included) of a table key, in call order."""
    made, _ = key_problems(key)
    return [workspace(p, cal, flags or Flags()) for p in made]
