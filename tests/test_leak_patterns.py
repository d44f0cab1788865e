"""The table of leaks users make and of loops that only look like them (issue 61): each leak is
found at the user's line with its growth per step within 25% of what the program really kept,
and no clean loop is called a leak. No timing is asserted."""

from __future__ import annotations

import functools
import json

import pytest

pytest.importorskip("torch")

from npumem.profile.leak_analysis import analyze_leaks

from . import leak_patterns as patterns


@functools.lru_cache(maxsize=None)
def recorded(name: str, leak: bool | None) -> tuple[dict, float]:
    program = getattr(patterns, name)
    return patterns.record(program) if leak is None else patterns.record(program, leak)


@pytest.mark.parametrize("name", [p.__name__ for p in patterns.LEAKING])
def test_each_leak_is_found_at_the_users_line_with_its_growth(name):
    snapshot, truth = recorded(name, True)
    analysis = analyze_leaks(snapshot)
    assert analysis.leaks, analysis.lines()
    found = sum(leak.per_step for leak in analysis.leaks)
    assert abs(found - truth) <= 0.25 * truth, (found, truth, analysis.lines())
    for leak in analysis.leaks:            # the user's own line, not torch's
        assert leak.where.split(":")[0].endswith("leak_patterns.py"), leak.where
    # the pattern's own function is on the stack of what it leaked
    assert any(name in leak.where or any(name in frame for frame in leak.stack)
               for leak in analysis.leaks), [leak.describe() for leak in analysis.leaks]
    steps = analysis.steps[0]
    expected = "inferred" if name == "kv_cache_never_trimmed" else "marked"
    assert steps.source == expected
    assert all(leak.inferred == (expected == "inferred") for leak in analysis.leaks)
    if expected == "inferred":             # said beside every claim
        assert all("inferred steps" in leak.describe() for leak in analysis.leaks)


@pytest.mark.parametrize("name", ["retain_graph_and_append", "kv_cache_never_trimmed"])
def test_the_fixed_program_has_no_leak(name):
    snapshot, _ = recorded(name, False)
    assert analyze_leaks(snapshot).leaks == []


@pytest.mark.parametrize("name", [p.__name__ for p in patterns.CLEAN])
def test_clean_loops_are_not_called_leaks(name):
    snapshot, _ = recorded(name, None)
    analysis = analyze_leaks(snapshot)
    assert analysis.leaks == [], analysis.lines()


def test_the_json_carries_each_claim_with_its_evidence():
    snapshot, _ = recorded("retain_graph_and_append", True)
    out = json.loads(json.dumps(analyze_leaks(snapshot).to_json()))
    assert out["steps"] == {"count": patterns.STEPS, "source": "marked", "marker": "optimizer.step",
                            "reason": None, "judged": True, "device": 0}
    first = out["leaks"][0]
    assert first["file"].endswith("leak_patterns.py") and isinstance(first["line"], int)
    assert first["growth_per_step_bytes"] == 2048 and first["steps"] == patterns.STEPS
    evidence = first["evidence"]
    assert [v for _, v in evidence["live_bytes_at_boundaries"]] == [2048 * k for k in range(1, patterns.STEPS + 1)]
    assert evidence["p_value"] < 0.01 and evidence["growth_per_step_interval"] == [2048, 2048]


def test_a_run_without_steps_says_leaks_are_not_judged():
    snapshot, _ = recorded("inference_server_varying_batches", None)
    analysis = analyze_leaks(snapshot)
    assert analysis.lines()[0].startswith("no repeating step found: leaks are not judged")
    assert analysis.to_json()["steps"]["source"] is None
