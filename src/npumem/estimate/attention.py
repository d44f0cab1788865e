"""Which fused attention kernel `F.scaled_dot_product_attention` runs on the target GPU, and
running that kernel's operator in the fake run (which, with no GPU to ask, would fall back to
the math path and keep a whole attention matrix per layer that the GPU never makes).

The choice follows PyTorch's sdp_utils.cpp (select_sdp_backend) for dense tensors: the backends
in priority order (cuDNN first on sm_90/sm_100 with cuDNN newer than 9.15, else flash,
efficient, math), each taken if its checks pass. The checks kept are those a training or
generation script meets: dtypes per capability, head dimensions and alignment, masks, grouped
query attention, dropout, the last dimension contiguous. Global switches
(`torch.backends.cuda.enable_flash_sdp(False)`, ...) are honoured.
"""

from __future__ import annotations

from .targets import Target

FLASH, EFFICIENT, CUDNN, MATH = "flash", "efficient", "cudnn", "math"


def priority(target: Target, cudnn_version: int) -> list[str]:
    """priority_order / check_prefer_cudnn_attention (CUDA 13 builds)."""
    if cudnn_version > 91500 and target.major in (9, 10):
        return [CUDNN, FLASH, EFFICIENT, MATH]
    return [FLASH, EFFICIENT, MATH, CUDNN]


def choose(target: Target, torch, query, key, value, attn_mask, dropout_p, is_causal,
           enable_gqa, cudnn_version: int = 91900) -> str:
    backends = torch.backends.cuda
    half = query.dtype in (torch.float16, torch.bfloat16)
    dense = query.dim() == 4 and key.dim() == 4 and value.dim() == 4
    same_heads = query.shape[1] == key.shape[1] == value.shape[1] if dense else True
    gqa_ok = same_heads or (enable_gqa and dense and query.shape[1] % key.shape[1] == 0)
    strides_ok = all(t.stride(-1) == 1 for t in (query, key, value))
    head = query.shape[-1]
    for backend in priority(target, cudnn_version):
        if backend == CUDNN and backends.cudnn_sdp_enabled() and half and target.major >= 8 \
                and dense and gqa_ok and strides_ok and head % 8 == 0 and head <= 128 \
                and not torch.are_deterministic_algorithms_enabled():
            return CUDNN
        if backend == FLASH and backends.flash_sdp_enabled() and half and target.major >= 8 \
                and attn_mask is None and head <= 256 and key.shape[-1] == head == value.shape[-1] \
                and gqa_ok and strides_ok \
                and not (is_causal and query.shape[-2] != key.shape[-2]):
            return FLASH
        if backend == EFFICIENT and backends.mem_efficient_sdp_enabled():
            # minimum_gemm_alignment: 4 elements on sm_80+, 8 for half with tensor cores
            alignment = (8 if half else 4) if target.major >= 8 else (8 if half else 1)
            # PyTorch 2.11's check_batch_size_and_num_heads_dense<false>: no grouped heads
            if same_heads and strides_ok and head % alignment == 0 \
                    and value.shape[-1] % alignment == 0 \
                    and (query.dtype != torch.bfloat16 or target.major >= 8):
                return EFFICIENT
        if backend == MATH and backends.math_sdp_enabled():
            return MATH
    return MATH


def run(backend: str, torch, query, key, value, attn_mask, dropout_p, is_causal, scale):
    """The fused operator `backend` names, as scaled_dot_product_attention calls it."""
    aten = torch.ops.aten
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    if backend == FLASH:
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal,
                                                        False, scale=scale)[0]
    if backend == EFFICIENT:
        bias = attn_mask
        if bias is not None and bias.dtype == torch.bool:     # convert_boolean_attn_mask
            bias = torch.where(bias, 0.0, float("-inf")).to(query.dtype)
        if bias is not None and bias.shape[-1] % 16:          # pad_bias: a multiple of 16
            length = bias.shape[-1]
            bias = torch.nn.functional.pad(bias, (0, 16 - length % 16))[..., :length]
        if bias is not None:
            bias = bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
        return aten._scaled_dot_product_efficient_attention(query, key, value, bias, needs_grad,
                                                            dropout_p, is_causal, scale=scale)[0]
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:
        bias = torch.where(bias, 0.0, float("-inf")).to(query.dtype)
    return aten._scaled_dot_product_cudnn_attention(query, key, value, bias, needs_grad, dropout_p,
                                                    is_causal, False, scale=scale)[0]
