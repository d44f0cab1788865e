"""The attention kernel an estimate picks, rule by rule against PyTorch's select_sdp_backend
(aten/src/ATen/native/transformers/cuda/sdp_utils.cpp and sdp_utils_cpp.h) for each PyTorch
version modelled, what the chosen kernel's fake operator allocates, the backward scratch, and
two whole estimates (autocast; T5's learned position bias)."""

from __future__ import annotations

import json
import math
import os

import pytest

torch = pytest.importorskip("torch")

from npumem.estimate import attention, kernel_rules  # noqa: E402
from npumem.estimate.targets import Target, target  # noqa: E402
from npumem.estimate.versions import STAND_IN_CUDNN, Modelled, parse_cudnn, parse_version  # noqa: E402

from .test_estimate import _estimate, needs_build  # noqa: E402

H100, A100, L4 = target("h100"), target("a100-80"), target("l4")
V211, V212, V213, V214 = (Modelled((2, minor, 0)) for minor in (11, 12, 13, 14))
HALF = torch.float16


def t(*shape, dtype=HALF, grad=False):
    return torch.empty(*shape, device="meta", dtype=dtype, requires_grad=grad)


def qkv(batch=2, heads=8, length=128, dim=64, dtype=HALF, grad=True, kv_heads=None, length_k=None):
    kv_heads = kv_heads or heads
    length_k = length_k or length
    return (t(batch, heads, length, dim, dtype=dtype, grad=grad),
            t(batch, kv_heads, length_k, dim, dtype=dtype, grad=grad),
            t(batch, kv_heads, length_k, dim, dtype=dtype, grad=grad))


def choose(gpu, versions, q, k, v, mask=None, dropout=0.0, causal=False, gqa=False):
    return attention.choose(gpu, torch, q, k, v, mask, dropout, causal, gqa, versions)


# -- versions ---------------------------------------------------------------------------------

def test_versions_parse_and_override():
    assert parse_version("2.11.0+cu130") == (2, 11, 0) and parse_version("2.14") == (2, 14, 0)
    assert parse_cudnn("9.19.0") == 91900 == parse_cudnn(91900) == parse_cudnn("91900")
    installed = Modelled.from_spec({}, environ={})
    assert installed.torch[:2] == parse_version(torch.__version__)[:2]
    assert installed.cudnn == STAND_IN_CUDNN == 91900           # stand_in_device.cpp's figure
    spec = Modelled.from_spec({"torch_version": "2.11", "cudnn_version": "9.15.0"}, environ={})
    assert (spec.torch, spec.cudnn) == ((2, 11, 0), 91500)
    assert Modelled.from_spec({}, environ={"NPUMEM_TORCH_VERSION": "2.14.1"}).torch == (2, 14, 1)


def test_rule_sets_and_their_notes():
    assert attention.rule_set(Modelled((2, 13, 0))) == ((2, 13), None)
    chosen, note = attention.rule_set(Modelled((2, 16, 0)))
    assert chosen == (2, 14) and "newer" in note and "2.14" in note
    chosen, note = attention.rule_set(Modelled((2, 9, 1)))
    assert chosen == (2, 11) and "older" in note


# -- priority_order / check_prefer_cudnn_attention ---------------------------------------------

def test_cudnn_first_on_sm90_with_cudnn_newer_than_9_15(monkeypatch):
    assert attention.priority(H100, V211, torch)[0] == attention.CUDNN
    assert attention.priority(H100, Modelled((2, 11, 0), 91500), torch)[0] == attention.FLASH
    assert attention.priority(A100, V211, torch)[0] == attention.FLASH       # sm_80: flash first
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    assert attention.priority(H100, V211, torch)[0] == attention.FLASH


# -- the checks, each named after its sdp_utils function ---------------------------------------

def test_check_cudnn_dropout_from_2_12():
    # GPT-2's dropout 0.1 in fp16 on an H100: cuDNN on 2.11; a multiple of 1/16 from 2.12 on
    q, k, v = qkv()
    assert choose(H100, V211, q, k, v, dropout=0.1, causal=True) == attention.CUDNN
    for versions in (V212, V213, V214):
        assert choose(H100, versions, q, k, v, dropout=0.1, causal=True) == attention.FLASH
        assert choose(H100, versions, q, k, v, dropout=0.125, causal=True) == attention.CUDNN


def test_a_mask_needs_stride_one_in_its_last_dimension():
    # check_last_dim_stride_equals_1_dense: T5's learned bias as transformers 5.17 passed it,
    # (1, H, L, L) permuted from the embedding's (L, L, H), goes to math on every version
    q, k, v = qkv(dtype=torch.float32)
    bias = torch.empty(128, 128, 8, device="meta", requires_grad=True).permute(2, 0, 1).unsqueeze(0)
    assert bias.stride(-1) == 8
    for versions in (V211, V213, V214):
        assert choose(H100, versions, q, k, v, bias, dropout=0.1) == attention.MATH
        assert choose(H100, versions, q, k, v, bias.contiguous(), dropout=0.1) == attention.EFFICIENT


def test_check_attn_mask_shape_keeps_cudnn_from_a_mask_that_requires_grad():
    q, k, v = qkv(dtype=torch.bfloat16)
    mask = t(1, 8, 128, 128, dtype=torch.bfloat16)
    assert choose(H100, V211, q, k, v, mask) == attention.CUDNN
    mask.requires_grad_(True)
    assert choose(H100, V211, q, k, v, mask) == attention.EFFICIENT   # flash: no mask at all
    # a 3-D mask is not among cuDNN's shapes (2-D or 4-D)
    assert choose(H100, V211, q, k, v, t(2, 128, 128, dtype=torch.bool)) == attention.EFFICIENT
    # boolean and broadcast (expanded, stride 0) masks are fine
    wide = t(2, 1, 1, 128, dtype=torch.bool).expand(2, 8, 128, 128)
    assert choose(H100, V211, q, k, v, wide) == attention.CUDNN


def test_grouped_query_attention_per_backend_and_version():
    # check_batch_size_and_num_heads_dense<supports_gqa, ...>: flash and cuDNN take enable_gqa on
    # every version; memory-efficient attention from 2.14 (fp32, where only it could run)
    q, k, v = qkv(heads=8, kv_heads=2, dtype=torch.float32)
    assert [choose(H100, vs, q, k, v, causal=True, gqa=True) for vs in (V211, V213, V214)] == \
        [attention.MATH, attention.MATH, attention.EFFICIENT]
    q, k, v = qkv(heads=8, kv_heads=2)
    assert choose(A100, V211, q, k, v, causal=True, gqa=True) == attention.FLASH
    assert choose(A100, V211, q, k, v, causal=True) == attention.MATH      # without enable_gqa
    # one key/value head (MQA) without enable_gqa: the fused kernels broadcast it from 2.14
    q, k, v = qkv(heads=8, kv_heads=1)
    assert choose(A100, V213, q, k, v, causal=True) == attention.MATH
    assert choose(A100, V214, q, k, v, causal=True) == attention.FLASH


def test_head_dims():
    # check_head_dim_size_flash: up to 256, q, k, v alike
    q, k, v = qkv(dim=264)
    assert choose(A100, V211, q, k, v) == attention.EFFICIENT
    # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120: training on an L4
    q, k, v = qkv(dim=200)
    assert choose(L4, V211, q, k, v) == attention.EFFICIENT
    assert choose(L4, V211, *qkv(dim=200, grad=False)) == attention.FLASH
    assert choose(L4, V211, *qkv(dim=240)) == attention.FLASH            # > 224, no dropout
    assert choose(L4, V211, *qkv(dim=240), dropout=0.1) == attention.EFFICIENT
    # check_head_dim_size_mem_efficient: fp32 needs a multiple of 4 on sm_80
    # (minimum_gemm_alignment)
    assert choose(A100, V211, *qkv(dim=66, dtype=torch.float32)) == attention.MATH
    # check_cudnn_tensor_shapes: 256 on sm_90 with cuDNN >= 9.10 up to 2.13; from 2.14 past 9.22
    q, k, v = qkv(dim=256, grad=False)
    assert choose(H100, V213, q, k, v) == attention.CUDNN
    assert choose(H100, V214, q, k, v) == attention.FLASH
    assert choose(H100, Modelled((2, 14, 0), 92300), q, k, v) == attention.CUDNN
    # check_cudnn_d256_bprop_head_dim (2.14): backward only for <=128, 192/128 or 256/256
    q, k, v = (t(2, 8, 128, 192, grad=True) for _ in range(3))
    assert choose(H100, Modelled((2, 14, 0), 92300), q, k, v) == attention.FLASH


def test_causal_with_more_keys_than_queries_and_empty_sequences():
    # check_flash_causal_non_square_seqlens
    q, k, v = qkv(length=1, length_k=128)
    assert choose(A100, V211, q, k, v, causal=True) == attention.EFFICIENT
    assert choose(A100, V211, q, k, v) == attention.FLASH
    # check_nonzero_sequence_lengths_dense
    assert choose(H100, V211, *qkv(length=0)) == attention.MATH


def test_deterministic_algorithms_and_global_switches():
    q, k, v = qkv()
    torch.use_deterministic_algorithms(True)
    try:
        assert choose(H100, V211, q, k, v) == attention.FLASH          # check_cudnn_deterministic
    finally:
        torch.use_deterministic_algorithms(False)
    backends = torch.backends.cuda
    try:
        backends.enable_cudnn_sdp(False)
        backends.enable_flash_sdp(False)
        assert choose(H100, V211, q, k, v) == attention.EFFICIENT
        backends.enable_mem_efficient_sdp(False)
        assert choose(H100, V211, q, k, v) == attention.MATH
        backends.enable_math_sdp(False)
        assert choose(H100, V211, q, k, v) == "error"                  # No available kernel
    finally:
        for switch in ("cudnn", "flash", "mem_efficient", "math"):
            getattr(backends, f"enable_{switch}_sdp")(True)


def test_dtypes_per_capability():
    turing = Target("t4", "Tesla T4", "cuda", 15 << 30, 40, 7, 5)
    # check_dtypes_low_precision and the efficient dtypes: fp32 never flash nor cuDNN; bf16 not
    # before sm_80 (efficient takes fp16 and fp32 there)
    assert choose(H100, V211, *qkv(dtype=torch.float32)) == attention.EFFICIENT
    assert choose(turing, V211, *qkv(dtype=torch.bfloat16)) == attention.MATH
    assert choose(turing, V211, *qkv(dtype=torch.float16)) == attention.EFFICIENT
    assert choose(H100, V211, *qkv(dtype=torch.float64)) == attention.MATH


def test_storage_offsets_from_2_13_and_cudnn_sizes():
    # check_data_ptr_alignment_mem_efficient: a query starting 2 floats into its storage
    base = torch.empty(2 * 8 * 128 * 64 + 2, device="meta")
    q = base[2:].view(2, 8, 128, 64)
    k, v = t(2, 8, 128, 64, dtype=torch.float32), t(2, 8, 128, 64, dtype=torch.float32)
    assert choose(A100, V211, q, k, v) == attention.EFFICIENT
    assert choose(A100, V213, q, k, v) == attention.MATH
    # check_cudnn_tensor_shapes (2.13): batch and heads up to 65535
    q, k, v = qkv(batch=65536, heads=1, length=64, grad=False)
    assert choose(H100, V211, q, k, v) == attention.CUDNN
    assert choose(H100, V213, q, k, v) == attention.FLASH


def test_unbatched_inputs_from_2_14():
    # normalize_unbatched_input: 3-D q, k, v get a batch dimension from 2.14 (math before)
    q, k, v = (t(8, 128, 64) for _ in range(3))
    for versions, expected in ((V213, attention.MATH), (V214, attention.FLASH)):
        q4, k4, v4, mask, added = attention.normalize(versions, q, k, v, None)
        assert added == (versions is V214)
        assert choose(A100, versions, q4, k4, v4, mask) == expected


def test_cudnn_decode_off_on_sm100_in_2_14():
    b200 = Target("b200", "NVIDIA B200", "cuda", 180 << 30, 148, 10, 0)
    q, k, v = qkv(length=1, length_k=128, grad=False)
    assert choose(b200, V213, q, k, v) == attention.CUDNN
    assert choose(b200, V214, q, k, v) == attention.FLASH


# -- what the chosen kernel's fake operator allocates (attention.cpp) ---------------------------

def test_the_meta_kernels_give_the_gpu_kernels_outputs():
    with torch.device("meta"):
        q = torch.empty(2, 128, 8, 64, dtype=HALF).transpose(1, 2).requires_grad_()
        out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, q, q, None, True, 0.1, False)
        # _efficient_attention_forward: out in (B, L, H, D), logsumexp fp32 (B, H, Lq
        # rounded up to 32), the philox seed and offset on the host (not device memory)
        assert out.shape == (2, 8, 128, 64) and out.transpose(1, 2).is_contiguous()
        assert lse.shape == (2, 8, 128) and lse.dtype == torch.float32
        assert seed.device.type == offset.device.type == "meta"
        q33 = torch.empty(2, 8, 33, 64, dtype=HALF)
        lse = torch.ops.aten._scaled_dot_product_efficient_attention(q33, q33, q33, None, True)[1]
        assert lse.shape == (2, 8, 64)
        # mha_fwd: softmax_lse fp32 (B, H, Lq); the output takes the query's layout
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, q, q, 0.1, True)[:2]
        assert out.stride() == q.stride() and lse.shape == (2, 8, 128)
        # run_cudnn_SDP_fprop: softmax stats fp32 (B, H, Lq, 1)
        out, lse = torch.ops.aten._scaled_dot_product_cudnn_attention(q, q, q, None, True)[:2]
        assert lse.shape == (2, 8, 128, 1) and out.shape == (2, 8, 128, 64)


def test_run_converts_pads_and_expands_the_mask_as_attention_cpp():
    q = t(2, 8, 100, 64, grad=True)
    # convert_boolean_attn_mask: a boolean mask becomes additive in the query's dtype
    mask = attention._additive_mask(torch, t(2, 1, 100, 100, dtype=torch.bool), HALF)
    assert mask.dtype == HALF and mask.shape == (2, 1, 100, 100)
    # preprocess_mask: strides (100) not multiples of 8 -> pad_bias to 104, slice, expand
    ready = attention._preprocess_mask(torch, mask, q, q)
    assert ready.shape == (2, 8, 100, 100) and ready.stride()[-2] == 104
    aligned = t(1, 8, 100, 128)[..., :100]
    assert attention._preprocess_mask(torch, aligned, q, q).stride()[-2] == 128   # no copy
    # flash pads a head dim to a multiple of 8 and slices the output back (pad_last_dim)
    odd = t(2, 8, 100, 60)
    assert attention.run(attention.FLASH, torch, odd, odd, odd, None, 0.0, False, None).shape == \
        (2, 8, 100, 60)


def test_grouped_heads_run_where_the_installed_operator_lacks_them():
    # modelling 2.14's memory-efficient GQA on an older PyTorch: the gradients come back with
    # the key/value heads (as 2.14's _scaled_dot_product_efficient_attention_backward gives them)
    q = t(2, 8, 64, 64, dtype=torch.float32, grad=True)
    k, v = (t(2, 2, 64, 64, dtype=torch.float32, grad=True) for _ in range(2))
    assert choose(A100, V214, q, k, v, gqa=True) == attention.EFFICIENT
    out = attention.run(attention.EFFICIENT, torch, q, k, v, None, 0.0, False, None)
    assert out.shape == (2, 8, 64, 64)
    out.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


# -- the backward's scratch (kernel_rules.py) ----------------------------------------------------

def test_flash_backward_scratch():
    rules = kernel_rules.KernelRules(H100)
    q = t(8, 512, 12, 64).transpose(1, 2)              # (B, H, L, D) over (B, L, H, D)
    args = [q, q, q, q, q, None, None, None, 512, 512, 0.0, True, None, None]
    found = rules.workspaces("_scaled_dot_product_flash_attention_backward", args)
    # softmax_d: B*H*round128(L)*4; dq_accum: B*round128(L)*H*round32(D)*4; nothing contiguous'd
    assert [size for size, _, _ in found] == [8 * 12 * 512 * 4, 8 * 512 * 12 * 64 * 4]
    # a (B, H, L, D)-contiguous grad_out is copied; GQA expands dK and dV; D 136 rounds to 192
    grad = t(8, 12, 512, 136)
    q, k = t(8, 512, 12, 136).transpose(1, 2), t(8, 512, 2, 136).transpose(1, 2)
    found = kernel_rules._flash_attention_backward([grad, q, k, k, q], H100)
    labels = [label for _, label, _ in found]
    assert labels[0] == "flash attention: contiguous grad_out" and labels[-1].endswith("dV")
    assert found[2][0] == 8 * 512 * 12 * 192 * 4
    torch.use_deterministic_algorithms(True)
    try:       # deterministic: dq_accum split ceil(SMs / (B*H)) ways
        found = kernel_rules._flash_attention_backward([q, q, q, q, q], H100)
        assert found[-1][0] == math.ceil(132 / 96) * 8 * 512 * 12 * 192 * 4
    finally:
        torch.use_deterministic_algorithms(False)


# -- whole estimates -------------------------------------------------------------------------

@needs_build
def test_autocast_chooses_on_the_cast_dtypes(tmp_path, monkeypatch):
    # fp32 q, k, v under bf16 autocast: the GPU casts before choosing. Choosing on fp32 would
    # give the memory-efficient kernel; on bf16 with dropout 0.1 an H100 takes cuDNN on 2.11
    # and flash from 2.12 (check_cudnn_dropout), the version modelled set as child.py's spec
    # would set it (here by its environment variable)
    script = """
        import torch, torch.nn.functional as F
        q = torch.randn(4, 8, 256, 64, device="cuda", requires_grad=True)
        with torch.autocast("cuda", torch.bfloat16):
            out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.1, is_causal=True)
        print("DTYPE", out.dtype)
        out.float().sum().backward()
        """
    for version, kernel in (("2.11", "cudnn"), ("2.13", "flash")):
        monkeypatch.setenv("NPUMEM_TORCH_VERSION", version)
        done = _estimate(tmp_path, script, "--json")
        assert done.returncode == 0, done.stderr
        assert "DTYPE torch.bfloat16" in done.stderr
        assert json.loads(done.stdout)["fake_run"]["attention"] == {kernel: 1}


T5_SCRIPT = """
    import os, torch
    from transformers import T5Config, T5ForConditionalGeneration
    from transformers.integrations import sdpa_attention
    if os.environ.get("T5_STRIDED_BIAS"):
        # transformers 5.17 (which recorded the GPU runs) passed T5's learned bias to SDPA as
        # compute_bias made it, a permuted (1, H, L, L) view; 5.25 makes it contiguous
        make = sdpa_attention.create_position_bias_mask
        def strided(position_bias, attention_mask, is_causal, query, key):
            if attention_mask is None and not is_causal:
                return position_bias
            return make(position_bias, attention_mask, is_causal, query, key)
        sdpa_attention.create_position_bias_mask = strided
    config = T5Config(vocab_size=64, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                      num_decoder_layers=1, num_heads=4, dropout_rate=0.1,
                      decoder_start_token_id=0, pad_token_id=0)
    model = T5ForConditionalGeneration(config).to("cuda").train()
    ids = torch.randint(0, 64, (2, 96), device="cuda")
    saved = []
    def pack(tensor):
        if tensor.numel() == 2 * 4 * 96 * 96 and tensor.is_contiguous():
            saved.append(str(tensor.dtype))       # an encoder layer's (B, H, L, L) scores
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=ids, labels=ids[:, :8].contiguous()).loss
    print("SCORES", saved.count("torch.float32"), saved.count("torch.bool"))
    loss.backward()
    """


@needs_build
def test_t5_learned_bias_runs_math_where_its_last_stride_is_not_one(tmp_path, monkeypatch):
    try:
        from transformers import T5ForConditionalGeneration  # noqa: F401
    except Exception as exc:                 # transformers without torch, a broken torchvision
        pytest.skip(f"transformers' T5 does not import: {exc}")
    monkeypatch.setenv("NPUMEM_TORCH_VERSION", "2.11")
    stock = _estimate(tmp_path, T5_SCRIPT, "--json")
    assert stock.returncode == 0, stock.stderr
    # transformers 5.25 makes the bias contiguous: memory-efficient attention takes it (fp32; a
    # mask that requires grad keeps only cuDNN away) and keeps no score matrix
    assert json.loads(stock.stdout)["fake_run"]["attention"] == {"efficient": 4}
    assert "SCORES 0 0" in stock.stderr
    # as 5.17 passed it (last stride = heads): check_last_dim_stride_equals_1_dense sends the
    # encoder's two layers to math, which keeps per layer the softmax output and the dropout
    # output (fp32) and dropout's mask (bool) -- what the H100 run of T5 kept
    monkeypatch.setenv("T5_STRIDED_BIAS", "1")
    strided = _estimate(tmp_path, T5_SCRIPT, "--json")
    assert strided.returncode == 0, strided.stderr
    assert json.loads(strided.stdout)["fake_run"]["attention"] == {"math": 2, "efficient": 2}
    assert "SCORES 4 2" in strided.stderr
