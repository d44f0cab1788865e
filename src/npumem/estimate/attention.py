"""Which kernel `F.scaled_dot_product_attention` runs on the target GPU, and running that
kernel's operator in the fake run (which, with no GPU to ask, would fall back to the math path
and keep a whole attention matrix per layer that the GPU never makes).

The choice restates PyTorch's own (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
select_sdp_backend, and the checks of sdp_utils_cpp.h) for the modelled PyTorch and cuDNN
(versions.py): the backends in priority order, each taken if all its checks pass. Each check
below names the PyTorch function it follows. The rule sets known, from the release wheels'
compiled checks and the source:

  2.11  the base rules
  2.12  + cuDNN refuses a dropout that is not a multiple of 1/16 (check_cudnn_dropout)
  2.13  + cuDNN refuses batch or heads over 65535 (check_cudnn_tensor_shapes);
          memory-efficient attention needs aligned storage offsets
          (check_data_ptr_alignment_mem_efficient)
  2.14  + memory-efficient attention takes grouped and broadcast (MQA) heads, flash and cuDNN
          broadcast heads (check_batch_size_and_num_heads_dense<..., supports_mqa>); 3-D
          (unbatched) inputs get a batch dimension first (normalize_unbatched_input); cuDNN's
          head-dim limit is 256 only past cuDNN 9.22 (else 128, or 192/128), with a backward
          check (check_cudnn_d256_bprop_head_dim); cuDNN decode off on sm_10x/11x for cuDNN
          9.19-9.25.0 except 9.24.1

A version outside these takes the nearest set (a newer one the newest), and says so. Where
the modelled kernel's operator is missing from the installed PyTorch (2.14's memory-efficient
attention over grouped heads, modelled on 2.13), it runs on expanded heads
(_grouped_efficient).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .targets import Target
from .versions import Modelled

FLASH, EFFICIENT, CUDNN, MATH = "flash", "efficient", "cudnn", "math"
KNOWN = ((2, 11), (2, 12), (2, 13), (2, 14))
# at::SDPBackend's values (torch.nn.attention.SDPBackend), as the priority order holds them
_BY_VALUE = {0: MATH, 1: FLASH, 2: EFFICIENT, 3: CUDNN}
_DEFAULT_ORDER = [1, 2, 0, 3]            # Context's sdp_priority_order before priority_order()


def rule_set(versions: Modelled) -> tuple[tuple[int, int], str | None]:
    """The known rule set for `versions.torch`, and a note when it is not that version's own."""
    wanted = tuple(versions.torch[:2])
    older = [known for known in KNOWN if known <= wanted]
    chosen = older[-1] if older else KNOWN[0]
    name = ".".join(map(str, wanted))
    if wanted > KNOWN[-1]:
        return chosen, (f"PyTorch {name} is newer than the attention rules known: "
                        f"PyTorch {'.'.join(map(str, chosen))}'s rules applied")
    if not older:
        return chosen, (f"PyTorch {name} is older than the attention rules known: "
                        f"PyTorch {'.'.join(map(str, chosen))}'s rules applied")
    return chosen, None


@dataclass
class _Params:
    """sdp_params: what select_sdp_backend sees."""
    query: object
    key: object
    value: object
    mask: object
    dropout: float
    is_causal: bool
    enable_gqa: bool
    grad: bool                       # input_requires_grad: q, k or v, with grad mode on


def priority(target: Target, versions: Modelled, torch=None) -> list[str]:
    """priority_order / check_prefer_cudnn_attention: cuDNN first on sm_90 and sm_10x with
    cuDNN newer than 9.15 (on a CUDA 12 build only sm_x0 and sm_x3), unless
    TORCH_CUDNN_SDPA_DEPRIORITIZED=1; a priority order the script set itself
    (sdpa_kernel(..., set_priority=True)) is kept as it is."""
    order = list(_DEFAULT_ORDER)
    if torch is not None and hasattr(torch._C, "_get_sdp_priority_order"):
        order = [int(b) for b in torch._C._get_sdp_priority_order()]
    if order[:4] != _DEFAULT_ORDER:
        return [_BY_VALUE[b] for b in order if b in _BY_VALUE]
    minor_ok = versions.cuda >= (13, 0) or target.minor in (0, 3)
    if os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED", "") not in ("1", "true", "TRUE", "ON") \
            and versions.cudnn > 91500 and target.major in (9, 10) and minor_ok:
        return [CUDNN, FLASH, EFFICIENT, MATH]
    return [FLASH, EFFICIENT, MATH, CUDNN]


def normalize(versions: Modelled, query, key, value, attn_mask):
    """normalize_unbatched_input (2.14 on, also called by _fused_sdp_choice_cuda): 3-D strided
    inputs get a batch dimension of 1, the mask one until it is 4-D. Returns the inputs and
    whether they were given one."""
    if rule_set(versions)[0] < (2, 14):
        return query, key, value, attn_mask, False
    if all(t.dim() == 3 and not t.is_nested for t in (query, key, value)):
        query, key, value = (t.unsqueeze(0) for t in (query, key, value))
        while attn_mask is not None and attn_mask.dim() < 4:
            attn_mask = attn_mask.unsqueeze(0)
        return query, key, value, attn_mask, True
    return query, key, value, attn_mask, False


def choose(target: Target, torch, query, key, value, attn_mask, dropout_p, is_causal,
           enable_gqa, versions: Modelled) -> str:
    """select_sdp_backend for the target and the modelled versions: flash, efficient, cudnn or
    math; "error" where every backend is switched off or refuses (PyTorch raises then)."""
    rules = rule_set(versions)[0]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    p = _Params(query, key, value, attn_mask, float(dropout_p), bool(is_causal),
                bool(enable_gqa), grad)
    switches = torch.backends.cuda
    if not (switches.math_sdp_enabled() or switches.flash_sdp_enabled()
            or switches.mem_efficient_sdp_enabled() or switches.cudnn_sdp_enabled()):
        return "error"
    for backend in priority(target, versions, torch):
        if backend == CUDNN and _use_cudnn(target, torch, p, rules, versions):
            return CUDNN
        if backend == FLASH and _use_flash(target, torch, p, rules):
            return FLASH
        if backend == EFFICIENT and _use_efficient(target, torch, p, rules):
            return EFFICIENT
        if backend == MATH and switches.math_sdp_enabled():
            return MATH
    return "error"


# -- the backends (can_use_*_attention in sdp_utils.cpp) ----------------------------------------

def _use_flash(target, torch, p, rules) -> bool:
    """can_use_flash_attention."""
    if not torch.backends.cuda.flash_sdp_enabled():                # check_runtime_disabled_flash
        return False
    if not _four_dims(p) or p.mask is not None:          # check_tensor_shapes, check_for_attn_mask
        return False
    head = p.query.shape[-1]
    if not (head == p.key.shape[-1] == p.value.shape[-1] and head <= 256):
        return False                                              # check_head_dim_size_flash
    if not (8, 0) <= (target.major, target.minor) <= (12, 1):
        return False                                 # check_flash_attention_hardware_support
    if not _flash_head_dim_backward(target, p):
        return False
    if p.is_causal and not _nested(p) and p.query.shape[-2] != p.key.shape[-2]:
        return False                                  # check_flash_causal_non_square_seqlens
    if not _dtypes(torch, p, _half_dtypes(torch, target)):          # check_dtypes_flash_attention
        return False
    if _nested(p):
        return _nested_ok(p, flash=True)
    return (_batch_and_heads(p, gqa=True, same_kv_heads=True, mqa=rules >= (2, 14))
            and _nonzero_lengths(p) and _last_dim_contiguous(p, ignore_singleton=True))


def _use_efficient(target, torch, p, rules) -> bool:
    """can_use_mem_efficient_attention."""
    if not torch.backends.cuda.mem_efficient_sdp_enabled():  # check_runtime_disabled_mem_efficient
        return False
    if not (5, 0) <= (target.major, target.minor) <= (12, 1):
        return False                                   # check_mem_efficient_hardware_support
    if not _four_dims(p):                                               # check_tensor_shapes
        return False
    alignment = _gemm_alignment(torch, target, p.query.dtype)
    head, head_v = p.query.shape[-1], p.value.shape[-1]
    if not (head == p.key.shape[-1] and head > 0 and head % alignment == 0
            and head_v > 0 and head_v % alignment == 0):
        return False                                       # check_head_dim_size_mem_efficient
    if rules >= (2, 13) and not _offsets_aligned(target, p, alignment):
        return False                                # check_data_ptr_alignment_mem_efficient
    if _nested(p):
        # check_requires_grad_and_nested: no training with nested inputs
        if p.grad or not _nested_ok(p, flash=False):
            return False
    else:
        gqa = rules >= (2, 14)
        if not (_nonzero_lengths(p) and _last_dim_contiguous(p, ignore_singleton=False)
                and _batch_and_heads(p, gqa=gqa, same_kv_heads=True, mqa=gqa)):
            return False
    allowed = (torch.float16, torch.float32, torch.bfloat16) if target.major >= 8 \
        else (torch.float16, torch.float32)
    return _dtypes(torch, p, allowed)                                   # check_tensor_dtype


def _use_cudnn(target, torch, p, rules, versions) -> bool:
    """can_use_cudnn_attention (a CUDA build with cuDNN 9 or newer)."""
    cudnn = versions.cudnn
    if cudnn < 90000:
        return False
    if p.dropout > 0.0 and 91100 < cudnn < 91400:     # no dropout in SDPA with cuDNN 9.11-9.13
        return False
    if not torch.backends.cuda.cudnn_sdp_enabled():                 # check_runtime_disabled_cudnn
        return False
    if _nested(p) and not _cudnn_nested_allowed(target):               # check_for_nested_inputs
        return False
    if not _four_dims(p):                                               # check_tensor_shapes
        return False
    if torch.are_deterministic_algorithms_enabled() \
            and not torch.is_deterministic_algorithms_warn_only_enabled():
        return False                                               # check_cudnn_deterministic
    if not _dtypes(torch, p, _half_dtypes(torch, target)):          # check_dtypes_low_precision
        return False
    if not _mask_shape(p):                                               # check_attn_mask_shape
        return False
    if not (8, 0) <= (target.major, target.minor) <= (12, 1):       # check_cudnn_hardware_support
        return False
    if rules >= (2, 12) and p.dropout * 16.0 != math.floor(p.dropout * 16.0):
        return False                                                    # check_cudnn_dropout
    if _nested(p):
        # check_cudnn_query_seq_len_nested (2.14): the longest query over 128
        return rules < (2, 14) or max(int(n) for n in _nested_lengths(p.query)) > 128
    if not (_nonzero_lengths(p) and _last_dim_contiguous(p, ignore_singleton=True)
            and _batch_and_heads(p, gqa=True, same_kv_heads=False, mqa=rules >= (2, 14))):
        return False
    if not _cudnn_shapes(target, p, rules, cudnn):
        return False
    if rules >= (2, 14) and not _cudnn_backward_head_dims(target, p, cudnn):
        return False
    # is_cudnn_attention_decode_disabled (2.14): no single-query cuDNN on sm_10x/11x for cuDNN
    # 9.19 to 9.25.0 but 9.24.1
    if rules >= (2, 14) and target.major in (10, 11) and 91900 <= cudnn <= 92500 \
            and cudnn != 92401 and p.query.shape[2] == 1:
        return False
    return True


# -- the checks ---------------------------------------------------------------------------------

def _nested(p) -> bool:
    """has_for_nested_inputs: a strided nested tensor among q, k, v."""
    return any(t.is_nested for t in (p.query, p.key, p.value))


def _four_dims(p) -> bool:
    """check_tensor_shapes: q, k and v all 4-D."""
    return p.query.dim() == p.key.dim() == p.value.dim() == 4


def _half_dtypes(torch, target):
    """check_dtypes_low_precision: fp16 and bf16 from sm_80, fp16 alone before."""
    return (torch.float16, torch.bfloat16) if target.major >= 8 else (torch.float16,)


def _dtypes(torch, p, allowed) -> bool:
    """check_tensor_dtype: q, k and v of one dtype, and that one allowed."""
    return p.query.dtype == p.key.dtype == p.value.dtype and p.query.dtype in allowed


def _nonzero_lengths(p) -> bool:
    """check_nonzero_sequence_lengths_dense: no zero-length query or key sequence."""
    return p.query.shape[-2] != 0 and p.key.shape[-2] != 0


def _last_dim_contiguous(p, ignore_singleton: bool) -> bool:
    """check_last_dim_stride_equals_1_dense: q, k, v and (on a GPU) the mask each with stride 1
    in the last dimension; flash and cuDNN let a head dimension of 1 pass."""
    ok = all(t.stride(-1) == 1 for t in (p.query, p.key, p.value))
    if ignore_singleton:
        ok = ok or p.query.shape[-1] == 1
    return ok and (p.mask is None or p.mask.stride(-1) == 1)


def _batch_and_heads(p, gqa: bool, same_kv_heads: bool, mqa: bool) -> bool:
    """check_batch_size_and_num_heads_dense and check_grouped_query_attention: one batch size;
    with enable_gqa (where the backend takes it) the query's heads a multiple of the key's (and
    of the value's, where those may differ), else one head count (or, where the backend takes
    it, one key and value head: 2.14's supports_mqa)."""
    q, k, v = (t.shape[0] for t in (p.query, p.key, p.value))
    if not q == k == v:
        return False
    hq, hk, hv = (t.shape[-3] for t in (p.query, p.key, p.value))
    if p.enable_gqa and gqa:
        if same_kv_heads and hk != hv:
            return False
        return hk > 0 and hv > 0 and hq % hk == 0 and hq % hv == 0
    if hq == hk == hv:
        return True
    return mqa and hq > 0 and hk == 1 and hv == 1


def _flash_head_dim_backward(target, p) -> bool:
    """check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120: training on
    sm_86-89 and sm_120-121 takes a head dim up to 192, or over 224 without dropout."""
    small_sm = (8, 6) <= (target.major, target.minor) <= (8, 9) \
        or (12, 0) <= (target.major, target.minor) <= (12, 1)
    if not (p.grad and small_sm):
        return True
    head = p.query.shape[-1]
    return head <= 192 or (p.dropout == 0.0 and head > 224)


def _gemm_alignment(torch, target, dtype) -> int:
    """minimum_gemm_alignment: 4 elements from sm_80, raised to 128 bits (8 halves, 4 floats)
    where tensor cores run (sm_80 on; sm_70 for halves only)."""
    half = dtype in (torch.float16, torch.bfloat16)
    tensor_cores = target.major >= 8 or (target.major >= 7 and half)
    alignment = 4 if target.major >= 8 else 1
    if tensor_cores:
        alignment = max(alignment, 128 // (16 if half else 32))
    return alignment


def _offsets_aligned(target, p, alignment: int) -> bool:
    """check_data_ptr_alignment_mem_efficient (2.13 on): on sm_80 and newer each of q, k, v
    (dense, not empty) starts at a storage offset that is a multiple of the GEMM alignment (the
    caching allocator's blocks are 512-byte aligned, so the offset alone decides)."""
    if target.major < 8 or _nested(p):
        return True
    return all(t.numel() == 0 or t.storage_offset() % alignment == 0
               for t in (p.query, p.key, p.value))


def _mask_shape(p) -> bool:
    """check_attn_mask_shape: no mask that requires grad; a 2-D (Lq or 1, Lk or 1) or 4-D
    (B or 1, H or 1, Lq or 1, Lk or 1) mask."""
    mask = p.mask
    if mask is None:
        return True
    if mask.requires_grad:
        return False
    fits = lambda size, want: size == want or size == 1          # noqa: E731
    if not (fits(mask.shape[-2], p.query.shape[2]) and fits(mask.shape[-1], p.key.shape[2])):
        return False
    if mask.dim() == 2:
        return True
    return mask.dim() == 4 and fits(mask.shape[0], p.query.shape[0]) \
        and fits(mask.shape[1], p.query.shape[1])


def _cudnn_shapes(target, p, rules, cudnn) -> bool:
    """check_cudnn_tensor_shapes, for cuDNN 9 and newer."""
    b, h, s_q, d_qk = p.query.shape
    s_k, d_v = p.key.shape[2], p.value.shape[3]
    if rules >= (2, 13) and (b > 65535 or h > 65535):
        return False
    sm90_or_10x = (target.major == 9 and target.minor == 0) or target.major == 10
    limit = 128
    if rules >= (2, 14):
        # 256 needs cuDNN newer than 9.22 (and a frontend with D256, which the 2.14 wheels
        # have); not sm_107 before cuDNN 9.25.1
        sm107 = (target.major, target.minor) == (10, 7) and cudnn <= 92500
        if sm90_or_10x and not sm107 and cudnn > 92200:
            limit = 256
        elif sm90_or_10x and cudnn >= 91100 and (d_qk, d_v) == (192, 128):
            limit = 192
    else:
        if cudnn >= 91000 and (target.major, target.minor) == (9, 0):
            limit = 256                                  # Hopper with cuDNN 9.10 and newer
        if cudnn >= 91100 and target.major == 10 and (d_qk, d_v) == (192, 128):
            limit = 192                                  # Blackwell's DeepSeek shape
    if d_qk > limit or d_v > limit or d_qk % 8 or d_v % 8:
        return False
    if s_k == 1:                                         # no key/value sequence of 1
        return False
    return not (p.dropout != 0.0 and s_q == 1)           # nor a single query with dropout


def _cudnn_backward_head_dims(target, p, cudnn) -> bool:
    """check_cudnn_d256_bprop_head_dim (2.14): where head dims up to 256 run forward (see
    _cudnn_shapes), training takes (<=128, <=128), (192, 128) or (256, 256) only."""
    if not p.grad:
        return True
    sm90_or_10x = (target.major == 9 and target.minor == 0) or target.major == 10
    sm107 = (target.major, target.minor) == (10, 7) and cudnn <= 92500
    if not (cudnn > 92200 and sm90_or_10x and not sm107):
        return True
    d_qk, d_v = p.query.shape[3], p.value.shape[3]
    return (d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))


def _cudnn_nested_allowed(target) -> bool:
    """check_for_nested_inputs: cuDNN takes nested inputs only with
    TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED=1, on sm_90 and sm_10x."""
    enabled = os.environ.get("TORCH_CUDNN_SDPA_NESTED_TENSOR_ENABLED", "") in ("1", "true", "ON")
    return enabled and target.major in (9, 10)


def _nested_lengths(tensor) -> list:
    """The sequence lengths of a strided nested (B, H, {L}, D) tensor."""
    return [t.shape[1] for t in tensor.unbind()] if tensor.is_nested else [tensor.shape[-2]]


def _nested_ok(p, flash: bool) -> bool:
    """check_batch_size_nested, check_head_dim_size_flash_nested (flash) and
    check_for_seq_len_0_nested_tensor: one batch size unless not training, a head dim that is a
    multiple of 8 up to 256 (flash), no empty sequence."""
    batches = {t.size(0) for t in (p.query, p.key, p.value)}
    if len(batches) > 1 and p.grad:
        return False
    if flash:
        head = p.query.size(-1)
        if not (head == p.key.size(-1) == p.value.size(-1) and head % 8 == 0 and head <= 256):
            return False
    return all(min(_nested_lengths(t), default=0) > 0 for t in (p.query, p.key, p.value))


# -- running the chosen kernel (attention.cpp, scaled_dot_product_attention) --------------------

def run(backend: str, torch, query, key, value, attn_mask, dropout_p, is_causal, scale):
    """The fused operator `backend` names, called as scaled_dot_product_attention calls it
    (the mask converted and padded as there), and its output."""
    aten = torch.ops.aten
    # should_compute_logsumexp: q, k or v requires grad, with grad mode on
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if backend == FLASH:
        return _flash(torch, query, key, value, dropout_p, is_causal, scale)
    bias = _additive_mask(torch, attn_mask, query.dtype)
    if backend == EFFICIENT:
        if bias is not None:
            bias = _preprocess_mask(torch, bias, query, key)
        if key.shape[1] != query.shape[1] and _installed(torch) < (2, 14):
            return _grouped_efficient(torch)(query, key, value, bias, needs_grad, dropout_p,
                                             is_causal, scale)
        return aten._scaled_dot_product_efficient_attention(query, key, value, bias, needs_grad,
                                                            dropout_p, is_causal, scale=scale)[0]
    return aten._scaled_dot_product_cudnn_attention(query, key, value, bias, needs_grad, dropout_p,
                                                    is_causal, False, scale=scale)[0]


def _additive_mask(torch, mask, dtype):
    """convert_boolean_attn_mask (and its cuDNN twin): a boolean mask becomes an additive one
    of the query's dtype and the mask's shape (0 where True, -inf or a large negative else)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask, torch.zeros((), dtype=dtype, device=mask.device),
                       torch.full((), float("-inf"), dtype=dtype, device=mask.device))


def _preprocess_mask(torch, mask, query, key):
    """preprocess_mask: a mask whose strides (but the last) are not multiples of 8, or whose
    last stride is not 1, is padded by pad_bias (its last dimension grown by 8 - L % 8, then
    sliced back: the copy is what the kernel reads); then it is expanded to (B, H, Lq, Lk)."""
    aligned = all(s % 8 == 0 for s in mask.stride()[:-1]) and mask.stride(-1) == 1
    if not aligned:
        length = mask.shape[-1]
        mask = torch.nn.functional.pad(mask, (0, 8 - length % 8))[..., :length]
    return mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])


def _flash(torch, query, key, value, dropout_p, is_causal, scale):
    """The CUDA flash branch: head dims padded to a multiple of 8 (pad_last_dim<8>), the scale
    taken from the unpadded one (calculate_scale), the output sliced back
    (post_process_flash_output)."""
    head = query.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(head)
    if head % 8:
        pad = 8 - head % 8
        query, key, value = (torch.nn.functional.pad(t, (0, pad)) for t in (query, key, value))
    out = torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                             False, scale=scale)[0]
    return out[..., :head] if head % 8 else out


def _installed(torch) -> tuple[int, int]:
    from .versions import parse_version
    return parse_version(torch.__version__)[:2]


def _grouped_efficient(torch):
    """Memory-efficient attention over fewer key/value heads (GQA, MQA: 2.14's kernel takes
    them) where the installed PyTorch's operator does not: the operator runs on key and value
    expanded to the query's heads, which are let go at once (a transient the GPU may not have);
    what is kept for backward is what 2.14 keeps (q, k, v, out, logsumexp), and the key and
    value gradients are summed back over each group."""
    aten = torch.ops.aten

    def expand(tensor, heads):
        return tensor.repeat_interleave(heads // tensor.shape[1], dim=1)

    class GroupedEfficient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, query, key, value, bias, needs_grad, dropout_p, is_causal, scale):
            heads = query.shape[1]
            out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
                query, expand(key, heads), expand(value, heads), bias, needs_grad, dropout_p,
                is_causal, scale=scale)
            ctx.save_for_backward(query, key, value, bias, out, lse, seed, offset)
            ctx.args = (dropout_p, is_causal, scale)
            return out

        @staticmethod
        def backward(ctx, grad):
            query, key, value, bias, out, lse, seed, offset = ctx.saved_tensors
            dropout_p, is_causal, scale = ctx.args
            heads = query.shape[1]
            bias_grad = bias is not None and ctx.needs_input_grad[3]
            grads = aten._scaled_dot_product_efficient_attention_backward(
                grad, query, expand(key, heads), expand(value, heads), bias, out, lse, seed,
                offset, dropout_p, [True, True, True, bias_grad], is_causal, scale=scale)
            sums = [g.unflatten(1, (t.shape[1], heads // t.shape[1])).sum(2)
                    for g, t in ((grads[1], key), (grads[2], value))]
            return grads[0], sums[0], sums[1], grads[3] if bias_grad else None, None, None, \
                None, None

    return GroupedEfficient.apply
