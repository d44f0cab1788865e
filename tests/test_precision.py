"""Precision checks: the numbers, the worst element, tolerances, every input kind."""

import numpy as np
import pytest

import npumem
from npumem import precision
from npumem.ops import aclnn


def test_identical_arrays_pass_with_zero_differences():
    x = np.linspace(-1, 1, 100, dtype=np.float32).reshape(10, 10)
    report = precision.compare(x, x.copy())
    assert report.passed and bool(report)
    assert report.max_abs_diff == report.mean_abs_diff == report.max_rel_diff == 0.0
    assert "passed: all 100 elements" in str(report)


def test_the_report_has_the_exact_differences_and_the_worst_element():
    expected = np.array([[1.0, 2.0], [4.0, 100.0]])
    actual = np.array([[1.0, 2.1], [4.0, 100.5]])
    report = precision.compare(actual, expected, rtol=1e-3, atol=1e-5)
    assert report.mismatched == 2 and not report.passed
    assert report.max_abs_diff == pytest.approx(0.5)
    assert report.mean_abs_diff == pytest.approx(0.15)
    assert report.max_rel_diff == pytest.approx(0.05)
    assert report.mean_rel_diff == pytest.approx((0.05 + 0.005) / 4)
    # 0.5 off at 100 is 5x its tolerance; 0.1 off at 2 is 50x: the latter is the worst
    assert report.worst_index == (0, 1)
    assert (report.worst_actual, report.worst_expected) == (2.1, 2.0)
    assert report.worst_ratio == pytest.approx(0.1 / (1e-5 + 2e-3), rel=1e-6)
    text = report.format()
    assert "FAILED: 2 of 4 elements (50%)" in text and "worst element [0, 1]" in text


def test_default_tolerances_follow_the_less_precise_dtype():
    expected = np.ones(8, np.float32)
    actual = expected.astype(np.float16) + np.float16(5e-4)
    assert precision.compare(actual, expected).passed          # within float16's 1e-3
    assert not precision.compare(actual.astype(np.float32), expected).passed
    assert precision.compare(np.arange(4), np.arange(4)).rtol == 0.0
    assert not precision.compare(np.array([1, 2]), np.array([1, 3])).passed


def test_nan_and_inf_handling():
    expected = np.array([np.nan, np.inf, 1.0])
    assert precision.compare(expected.copy(), expected).passed
    assert not precision.compare(expected.copy(), expected, equal_nan=False).passed
    report = precision.compare(np.array([1.0, np.inf, 1.0]), expected)
    assert report.mismatched == 1 and report.worst_index == (0,)
    assert "no tolerance covers it" in report.format()
    assert precision.compare(np.array([np.nan, -np.inf, 1.0]), expected).mismatched == 1


def test_assert_close_raises_an_assertion_error_with_the_report():
    with pytest.raises(precision.PrecisionError, match="worst element") as info:
        precision.assert_close([1.0, 2.0], [1.0, 2.5])
    assert isinstance(info.value, AssertionError) and info.value.report.mismatched == 1
    assert precision.assert_close([1.0], [1.0 + 1e-9]).passed


def test_bad_input_says_what_is_wrong():
    with pytest.raises(ValueError, match=r"shape \(2,\), expected \(3,\)"):
        precision.compare([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="tolerances must be >= 0"):
        precision.compare([1.0], [1.0], rtol=-1)


def test_empty_arrays_pass():
    report = precision.compare(np.empty((0, 3)), np.empty((0, 3)))
    assert report.passed and report.worst_index is None


def test_npumem_tensors_after_a_queued_op(rt):
    x = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    stream = npumem.create_stream()
    a, out = npumem.from_numpy(x), npumem.empty((16, 16))
    aclnn.run_with_pool_workspace(aclnn.mul, aclnn.mul_get_workspace_size(a, a, out), stream)
    report = precision.compare(out, x * x)           # waits for the op before reading
    assert report.passed and report.actual_dtype == "float32"


def test_torch_tensors_including_bfloat16():
    torch = pytest.importorskip("torch")
    x = torch.linspace(0, 1, 64)
    assert precision.compare(x.to(torch.bfloat16), x).passed
    report = precision.compare(x + 1e-3, x.numpy())
    assert not report.passed and report.actual_dtype == "float32"


def test_npumem_bfloat16_tensors_compare_as_values_with_bfloat16_tolerance():
    values = np.array([1.5, -2.3, 1000.1], np.float32)
    stored = npumem.empty((3,), dtype="bfloat16")
    aclnn.run_with_pool_workspace(aclnn.cast, aclnn.cast_get_workspace_size(
        npumem.from_numpy(values), "bfloat16", stored))
    report = precision.compare(stored, values)      # raw bf16 words would be ~16000 off
    assert report.actual_dtype == "bfloat16" and report.rtol == 1.6e-2
    assert report.passed and report.max_abs_diff < 1.0
