"""The mixed-precision scheduler: decisions from input statistics and op stability, runs on the
device whose errors stay within what the decision expected, and clear answers for bad input."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from npumem import memory
from npumem.errors import OpParamError
from npumem.mixed_precision import POLICIES, MixedPrecisionScheduler
from npumem.ops import REGISTRY

RNG = np.random.default_rng(0)
ACTIVATIONS = RNG.standard_normal((32, 64)).astype(np.float32)
WEIGHTS = (RNG.standard_normal((64, 48)) * 0.1).astype(np.float32)


def test_float16_is_refused_where_values_overflow_and_bfloat16_keeps_the_range():
    big = ACTIVATIONS * 1e5
    decision = MixedPrecisionScheduler("auto").decide("Add", big, big)
    assert decision.memory_dtype == "bfloat16"
    assert "float16 refused" in decision.reason and "65504" in decision.reason
    forced = MixedPrecisionScheduler("float16").decide("Add", big, big)
    assert forced.memory_dtype == "bfloat16"          # an explicit float16 cannot store them
    assert MixedPrecisionScheduler("float16").decide("Add", ACTIVATIONS, ACTIVATIONS).memory_dtype == "float16"


@pytest.mark.parametrize("policy", POLICIES)
def test_softmax_and_reductions_accumulate_in_float32_under_every_policy(policy):
    scheduler = MixedPrecisionScheduler(policy)
    for op in ("Softmax", "ReduceSum", "Mean", "MatMul"):
        inputs = (ACTIVATIONS, WEIGHTS) if op == "MatMul" else (ACTIVATIONS,)
        assert scheduler.decide(op, *inputs).compute_dtype == "float32"


def test_auto_takes_the_smallest_type_within_the_error_budget():
    loose = MixedPrecisionScheduler("auto", max_error=0.05).decide("MatMul", ACTIVATIONS, WEIGHTS)
    assert loose.memory_dtype == "int8"
    assert loose.bytes_saved == ACTIVATIONS.size * 2 + WEIGHTS.size * 3 - 4 * WEIGHTS.shape[1]
    middle = MixedPrecisionScheduler("auto", max_error=2e-3).decide("MatMul", ACTIVATIONS, WEIGHTS)
    assert middle.memory_dtype == "float16"
    strict = MixedPrecisionScheduler("auto", max_error=1e-6).decide("MatMul", ACTIVATIONS, WEIGHTS)
    assert strict.memory_dtype == "float32" and strict.bytes_saved == 0
    assert strict.expected_error < middle.expected_error < loose.expected_error


@pytest.mark.parametrize("policy", POLICIES)
def test_runs_land_within_the_expected_error(policy):
    result = MixedPrecisionScheduler(policy).run("MatMul", ACTIVATIONS, WEIGHTS)
    assert result.report.passed, result.report.format()
    expected = ACTIVATIONS.astype(np.float64) @ WEIGHTS
    error = np.abs(result.output - expected).mean() / np.abs(expected).mean()
    assert error <= max(result.decision.expected_error * 4, 1e-6)
    stored = {"float32": 4 * (ACTIVATIONS.size + WEIGHTS.size),
              "bfloat16": 2 * (ACTIVATIONS.size + WEIGHTS.size),
              "float16": 2 * (ACTIVATIONS.size + WEIGHTS.size),
              "int8": 2 * ACTIVATIONS.size + WEIGHTS.size + 4 * WEIGHTS.shape[1]}
    assert result.stored_bytes == stored[result.decision.memory_dtype]


@pytest.mark.parametrize("op", ["Add", "Mul", "Softmax", "ReduceSum", "Mean"])
def test_other_ops_run_at_half_precision(op):
    inputs = (ACTIVATIONS, ACTIVATIONS + 1) if op in ("Add", "Mul") else (ACTIVATIONS,)
    result = MixedPrecisionScheduler("bfloat16").run(op, *inputs, dim=1)
    assert result.report.passed, result.report.format()
    assert result.decision.memory_dtype == "bfloat16"


def test_bad_input_gets_a_clear_answer_or_error():
    scheduler = MixedPrecisionScheduler()
    empty = scheduler.decide("Add", np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32))
    assert empty.memory_dtype == "float32" and "empty" in empty.reason
    poisoned = ACTIVATIONS.copy()
    poisoned[0, 0], poisoned[1, 1] = np.nan, np.inf
    answer = scheduler.decide("Mul", poisoned, ACTIVATIONS)
    assert answer.memory_dtype == "float32" and "2 NaN or infinite" in answer.reason
    with pytest.raises(OpParamError, match="no recorded numerical stability.*set_stability"):
        scheduler.decide("Gelu", ACTIVATIONS)
    with pytest.raises(OpParamError, match="unknown precision policy 'fp8'"):
        MixedPrecisionScheduler("fp8")
    with pytest.raises(OpParamError, match="max_error"):
        MixedPrecisionScheduler(max_error=0)
    with pytest.raises(OpParamError, match="must be one of"):
        REGISTRY.set_stability("Gelu", "fragile")


def test_a_failed_run_leaves_device_memory_as_it_was():
    gc.collect()
    before = memory.memory_allocated()
    with pytest.raises(OpParamError, match="do not fit"):
        MixedPrecisionScheduler("bfloat16").run("MatMul", ACTIVATIONS, ACTIVATIONS)
    gc.collect()
    assert memory.memory_allocated() == before
