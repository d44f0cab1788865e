"""The cuDNN convolution workspace model (estimate/conv_workspace.py): PyTorch's routing and the
workspace rules against hand-worked arithmetic, its ranges, its wiring into KernelRules, and
the model scored on the shipped table leaving each workload out."""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")

from npumem.estimate import conv_workspace as cw  # noqa: E402
from npumem.estimate import kernel_rules  # noqa: E402
from npumem.estimate.targets import target  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
CAL = cw.Calibration()               # the defaults: these tests do not depend on the fit
FLAGS = cw.Flags()


def _contiguous(shape):
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= size
    return strides


def _key(kind, x, w, stride=(1, 1), padding=(1, 1), groups=1, transposed=False, dtype="float32",
         mask=(True, True, False), x_strides=None, output_padding=(0, 0)):
    key = [kind, [dtype, list(x), x_strides or _contiguous(x)], [dtype, list(w), _contiguous(w)], False,
           list(stride), list(padding), [1] * len(stride), transposed, list(output_padding), groups]
    return key + [list(mask)] if kind == "backward" else key


def _predict(key, flags=FLAGS):
    made, why = cw.key_problems(key)
    return [cw.workspace(p, CAL, flags) for p in made], why


def test_forward_transposes_input_and_weight():
    # 3x3, 64 -> 64 channels, 16 x 16 x 16 float32 NCHW (TF32 allowed: cuDNN's default)
    x, w = 16 * 64 * 16 * 16 * 4, 64 * 64 * 9 * 4
    (space,), _ = _predict(_key("forward", [16, 64, 16, 16], [64, 64, 3, 3]))
    assert space.likely == x + w + 16 and space.low == 0
    assert "transposed" in space.reason


def test_backward_runs_data_then_weight_gradient():
    x = y = 16 * 64 * 16 * 16 * 4
    w = 64 * 64 * 9 * 4
    (data, weight), _ = _predict(_key("backward", [16, 64, 16, 16], [64, 64, 3, 3]))
    assert (data.op, weight.op) == ("backward_data", "backward_weight")
    assert data.likely == x + y + w + 16
    assert weight.likely == int(CAL.weight_ratio_wide * (x + y + w + 16))          # 64 channels, 3x3
    (_, narrow), _ = _predict(_key("backward", [8, 32, 80, 80], [32, 32, 3, 3]))
    assert narrow.likely == int(CAL.weight_ratio * (2 * 8 * 32 * 80 * 80 * 4 + 32 * 32 * 9 * 4 + 16))
    only_weight, _ = _predict(_key("backward", [16, 64, 16, 16], [64, 64, 3, 3], mask=(False, True, True)))
    assert [s.op for s in only_weight] == ["backward_weight"]


def test_pointwise_rules():
    # 1x1 stride 1: only the weight transposed; 1x1 stride 2: none (forward and data gradient)
    (one,), _ = _predict(_key("forward", [4, 32, 96, 96], [3, 32, 1, 1], padding=(0, 0)))
    assert one.likely == 3 * 32 * 4 + 16
    (strided,), _ = _predict(_key("forward", [16, 64, 16, 16], [128, 64, 1, 1], (2, 2), (0, 0)))
    assert strided.likely == 0 and strided.high > 0


def test_what_rules_out_transposes():
    key = _key("forward", [16, 64, 16, 16], [64, 64, 3, 3])
    for flags in (cw.Flags(allow_tf32=False),):
        (space,), _ = _predict(key, flags)
        assert space.likely == 0 and "allow_tf32" in space.reason
    (double,), _ = _predict(_key("forward", [16, 64, 16, 16], [64, 64, 3, 3], dtype="float64"))
    assert double.likely == 0 and "float64" in double.reason
    nhwc = [64 * 16 * 16, 1, 16 * 64, 64]                 # channels_last strides
    (last,), _ = _predict(_key("forward", [16, 64, 16, 16], [64, 64, 3, 3], x_strides=nhwc))
    assert last.likely == 0 and "channels_last" in last.reason
    (stem,), _ = _predict(_key("forward", [16, 3, 224, 224], [64, 3, 7, 7], (2, 2), (3, 3)))
    assert stem.likely == 0                                 # 3 input channels


def test_routing_follows_convolution_cpp():
    # depthwise float32 NCHW: PyTorch's own kernel; fp16 with a listed workload: cuDNN
    made, why = cw.key_problems(_key("forward", [8, 64, 56, 56], [64, 1, 3, 3], groups=64))
    assert made == [] and "depthwise" in why
    made, _ = cw.key_problems(_key("forward", [8, 64, 56, 56], [64, 1, 3, 3], groups=64, dtype="float16"))
    assert len(made) == 1                                  # stride 1, 3x3, >= 32 channels, width >= 7
    nhwc = [64 * 56 * 56, 1, 56 * 64, 64]
    made, _ = cw.key_problems(_key("forward", [8, 64, 56, 56], [64, 1, 3, 3], groups=64, x_strides=nhwc))
    assert len(made) == 1                                  # channels_last depthwise always cuDNN
    made, why = cw.key_problems(_key("forward", [0, 64, 8, 8], [64, 64, 3, 3]))
    assert made == [] and "empty" in why
    made, why = cw.key_problems(_key("forward", [2, 8, 8, 8], [8, 4, 3, 3], (2, 2), transposed=True,
                                     output_padding=(2, 2)))
    assert made == [] and "output_padding" in why
    # 1-D is viewed as 2-D with H = 1; a transposed convolution's forward is cuDNN's data gradient
    (p,), _ = cw.key_problems(["forward", ["float32", [4, 16, 100], [1600, 100, 1]],
                               ["float32", [32, 16, 5], [80, 5, 1]], False, [1], [2], [1], False, [0], 1])
    assert p.spatial == (1, 100) and p.out == (1, 100) and p.kernel == (1, 5)
    (t,), _ = cw.key_problems(_key("forward", [4, 128, 12, 12], [128, 64, 2, 2], (2, 2), (0, 0), transposed=True))
    assert t.op == "backward_data" and t.c == 64 and t.spatial == (24, 24) and t.out == (12, 12)


def test_the_range_holds_the_likely_figure_and_the_headline_is_never_its_top():
    with open(kernel_rules.TABLE) as handle:
        entries = json.load(handle)["entries"]
    cal = cw.fit(entries)
    for key, _ in entries:
        for space in cw.predict_key(key, cal):
            assert space.low <= space.likely <= space.high
            assert space.likely < space.high, (key, space)
            assert space.low == 0                          # IMPLICIT_GEMM: what a run needs at least


def test_find_workspace_is_the_largest_family():
    made, _ = cw.key_problems(_key("forward", [16, 64, 16, 16], [64, 64, 3, 3]))
    p = made[0]
    im2col = 64 * 9 * 16 * 16 * 16 * 4
    assert cw.find_workspace(p) >= max(im2col, p.x_bytes + p.y_bytes + p.w_bytes)


def _rules(environ):
    return kernel_rules.KernelRules(target("h200"), environ)


def _tensors(key):
    kind, (dtype, x, xs), (_, w, ws), *_ = key
    make = lambda shape, strides: torch.empty_strided(shape, strides, device="meta",  # noqa: E731
                                                       dtype=getattr(torch, dtype))
    return make(x, xs), make(w, ws)


def test_kernel_rules_measured_then_modelled():
    with open(kernel_rules.TABLE) as handle:
        key, sizes = json.load(handle)["entries"][1]      # a forward with a measured workspace
    x, w = _tensors(key)
    args = [x, w, None, *key[4:10]]
    rules = _rules({})
    assert rules.workspaces("convolution", args) == [(s, cw.MEASURED_LABEL, True) for s in sizes]
    assert rules.convolution_counts == {"measured": 1, "modelled": 0} and rules.convolution_ranges == []
    modelled = _rules({"NPUMEM_CONV_MEASURED": "0"})
    out = modelled.workspaces("convolution", args)
    assert [label for _, label, _ in out] == [kernel_rules.MODELLED_LABEL]
    assert modelled.convolution_counts == {"measured": 0, "modelled": 1}
    (likely, low, high), = modelled.convolution_ranges
    assert out[0][0] == likely and low <= likely < high
    assert "x1" in modelled.convolution_reason_counts
    # elsewhere than sm_90 the table is not used
    assert kernel_rules.KernelRules(target("a100-80"), {}).workspaces("convolution", args)[0][1] == \
        kernel_rules.MODELLED_LABEL


def test_benchmark_mode_adds_the_find_workspace_once_per_plan():
    x = torch.empty(8, 64, 32, 32, device="meta")
    w = torch.empty(64, 64, 3, 3, device="meta")
    args = [x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1]
    rules = _rules({"NPUMEM_CONV_MEASURED": "0"})
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        first = rules.workspaces("convolution", args)
        again = rules.workspaces("convolution", args)
    finally:
        torch.backends.cudnn.benchmark = saved
    assert [label for _, label, _ in first] == [cw.FIND_LABEL, cw.MODELLED_LABEL]
    assert first[0][0] > first[1][0]
    assert [label for _, label, _ in again] == [cw.MODELLED_LABEL]


def test_leaving_each_workload_out_stays_within_a_factor_of_two(monkeypatch):
    """The real check: calibrated without a workload, the model predicts that workload's
    measured workspaces (largest per call) within 2x (1 MiB floor) on at least 85% of its calls,
    its median within 1.3x, and its total bytes within 2x; the old bound was off by 3-12x."""
    # the bench puts src/ on sys.path for itself; kept past this test, importlib.metadata would
    # find src/npumem.egg-info before the installed distribution (test_profile_robustness)
    monkeypatch.setattr(sys, "path", [os.path.join(ROOT, "bench"), *sys.path])
    import conv_workspace_loo as loo
    with open(kernel_rules.TABLE) as handle:
        entries = json.load(handle)["entries"]
    groups = loo.group_by_workload(entries)
    assert sorted(len(g) for g in groups.values()) == [16, 16, 16, 22]
    for name, rows in groups.items():
        cal = cw.fit([e for n, r in groups.items() if n != name for e in r])
        errors = [loo.call_error([w.likely for w in cw.predict_key(k, cal)], v) for k, v in rows]
        assert sum(e <= 1 for e in errors) >= math.ceil(0.85 * len(rows)), (name, errors)
        assert sorted(errors)[len(errors) // 2] <= math.log2(1.3), name
        predicted = sum(w.likely for k, _ in rows for w in cw.predict_key(k, cal))
        measured = sum(sum(v) for _, v in rows)
        assert 0.5 <= predicted / measured <= 2, name


def test_inference_mode_entry_points_map_onto_convolution():
    # under torch.inference_mode the hook sees aten.conv2d itself, not its convolution
    x, w = torch.empty(2, 8, 16, 16, device="meta"), torch.empty(8, 8, 3, 3, device="meta")
    _, _, bias, rest = kernel_rules._as_convolution("conv2d", [x, w])
    assert bias is None and rest == [[1, 1], [0, 0], [1, 1], False, [0, 0], 1]
    assert kernel_rules._as_convolution("conv2d", [x, w, None, [1], "same"])[3][1] == [1, 1]
    t = torch.empty(8, 4, 2, 2, device="meta")
    assert kernel_rules._as_convolution("conv_transpose2d", [x, t, None, [2, 2]])[3] == \
        [[2, 2], [0, 0], [1, 1], True, [0, 0], 1]
    rules = _rules({"NPUMEM_CONV_MEASURED": "0"})
    x = torch.empty(16, 64, 16, 16, device="meta")
    w = torch.empty(64, 64, 3, 3, device="meta")
    assert rules.workspaces("conv2d", [x, w, None, [1, 1], [1, 1]]) == \
        rules.workspaces("convolution", [x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1])
