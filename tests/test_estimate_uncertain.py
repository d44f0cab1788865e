"""npumem estimate never guesses silently: a branch, a loop bound or a size decided on a value
the fake run assumed makes the estimate uncertain (exit status 3, each decision with its line);
unmodelled work is named in the verdict line; autograd's bytes have an owner."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
numpy = pytest.importorskip("numpy")

from npumem.estimate import decisions  # noqa: E402
from npumem.estimate.answers import Answers  # noqa: E402

needs_build = pytest.mark.skipif(shutil.which("g++") is None, reason="estimate builds its stand-in "
                                 "device with g++")


@pytest.fixture
def recorded(monkeypatch):
    seen = decisions.Decisions()
    monkeypatch.setattr(decisions, "_decisions", seen)
    return seen


def _origin(kind="float", value=0.0):
    return decisions.Origin(kind, "std", value, ("train.py", 3))


def test_arithmetic_keeps_the_mark_and_printing_decides_nothing(recorded):
    loss = decisions.mark(0.0, _origin())
    scaled = (loss * 2 + 1) / 4
    assert isinstance(scaled, decisions.AssumedFloat) and scaled == 0.25
    assert f"{scaled:.3f}" == "0.250" and str(round(scaled, 2)) == "0.25"
    assert len(recorded.seen) == 1                   # the == above is the one decision
    assert isinstance(round(scaled, 2), decisions.AssumedFloat)


def test_comparisons_truth_and_integer_conversions_decide(recorded):
    value = decisions.mark(0.0, _origin())
    assert not value > 0.5                           # line A
    count = decisions.mark(3, _origin("int", 3))
    assert int(count * 2) == 6                       # line B: int() and == (one line)
    assert round(value) == 0                         # line C
    how = sorted({d.how for d in recorded.seen.values()})
    assert how == ["a comparison", "a conversion to an integer"]
    lines = {d.line for d in recorded.seen.values()}
    assert len(lines) == 3
    assert all(d.file == os.path.abspath(__file__) for d in recorded.seen.values())


def test_a_numpy_round_trip_keeps_the_mark(recorded):
    array = decisions.mark(numpy.zeros((4, 8), numpy.float32), _origin("numpy", 0))
    peak = array.max() * 100
    assert isinstance(peak, decisions.AssumedFloat)
    assert isinstance(array[1:].sum(axis=1), decisions.AssumedArray)
    assert not recorded.seen
    assert not (array > 3).any()                     # a truth value made from it
    assert int(peak) == 0
    assert [d.how for d in recorded.seen.values()] == ["a truth value computed from it",
                                                       "a conversion to an integer"]
    listed = decisions.mark([[0, 0], [0, 0]], _origin("tolist", 0))
    assert isinstance(listed[1][0], decisions.AssumedInt)
    assert pickle_round_trip(array).__class__ is numpy.ndarray
    assert pickle_round_trip(listed[0][0]).__class__ is int
    assert pickle_round_trip(decisions.mark(1.5, _origin())).__class__ is float


def pickle_round_trip(value):
    import pickle
    return pickle.loads(pickle.dumps(value))


def test_a_value_given_for_its_line_is_not_assumed():
    answers = Answers({"lines": {f"{os.path.basename(__file__)}:999": 0.7}})
    assert answers._at_line((os.path.abspath(__file__), 999)) == 0.7
    assert answers._at_line((os.path.abspath(__file__), 998)) is None
    assert answers._at_line(("/elsewhere/other.py", 999)) is None


def _estimate(tmp_path, source: str, *options: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, NPUMEM_CACHE_DIR=str(tmp_path.parent / "npumem-cache"))
    return subprocess.run([sys.executable, "-m", "npumem", "estimate", *options, "--", str(script)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


def _json(done) -> dict:
    return json.loads(done.stdout)


BRANCHES = """
    import torch
    x = torch.randn(4096, 1024, device="cuda")
    if x.std().item() > 0.5:
        big = torch.empty(1 << 32, device="cuda")
    loss = (x * 2).mean()
    while loss.item() > 0.01:
        loss = loss * 0.5
    size = int(x.abs().cpu().numpy().max() * 1000)
    extra = torch.zeros(size + 1, device="cuda")
    if torch.isnan(loss):
        print("nan")
    print(f"loss {loss.item():.3f}")
    count = (x > 0).sum().item()
    for _ in range(count):
        pass
    import math
    if math.isnan(loss.item()) or not isinstance(range(2), range):
        print("nan")
"""


@needs_build
def test_every_branch_on_an_assumed_value_is_reported_with_its_line(tmp_path):
    done = _estimate(tmp_path, BRANCHES, "--json")
    assert done.returncode == 3, done.stderr
    found = {(d["line"], d["how"]) for d in _json(done)["uncertain"]}
    assert found == {(4, "a comparison"), (7, "a comparison"), (9, "a conversion to an integer"),
                     (11, "the truth of a tensor (bool(), if, while)"),
                     (15, "a loop bound (range)"),
                     (18, "a test of the value (isnan, isinf, isfinite)")}
    first = next(d for d in _json(done)["uncertain"] if d["line"] == 4)
    assert first["file"] == "script.py" and first["assumed"] == 0.0
    assert first["code"] == "if x.std().item() > 0.5:" and first["read_at"] == "script.py:4"
    printed = _estimate(tmp_path, BRANCHES)
    assert printed.returncode == 3
    assert "UNCERTAIN: 6 decisions on assumed values" in printed.stdout
    assert "script.py:9: size = int(x.abs().cpu().numpy().max() * 1000)" in printed.stdout
    assert "--assume script.py:4=VALUE" in printed.stdout


@needs_build
def test_values_given_per_line_decide_the_run(tmp_path):
    given = ["--assume", "script.py:4=0.7,script.py:7=0.001,script.py:9=2,script.py:11=False",
             "--assume", "script.py:14=3,script.py:18=1.5"]
    done = _estimate(tmp_path, BRANCHES, "--json", *given)
    assert done.returncode == 0, done.stderr
    result = _json(done)
    assert result["uncertain"] == []
    # the 16 GiB buffer the branch makes at 0.7 is counted now
    assert result["peak_allocated_bytes"] >= 16 << 30


@needs_build
def test_a_script_that_only_prints_what_it_assumed_is_certain(tmp_path):
    done = _estimate(tmp_path, """
        import torch
        model = torch.nn.Linear(1024, 1024).cuda()
        for step in range(2):
            loss = model(torch.randn(512, 1024, device="cuda")).square().mean()
            loss.backward()
            print(f"step {step}: loss {loss.item():.4f}, {float(loss.detach().cpu())}")
    """, "--json")
    assert done.returncode == 0, done.stderr
    result = _json(done)
    assert result["uncertain"] == [] and result["unmodelled"] == []
    lines = [row["line"] for row in result["by_line"]]
    assert not any("no Python stack" in line for line in lines)
    assert any(line.endswith("script.py:5 in <module> (backward)") for line in lines), lines


@needs_build
def test_unmodelled_work_is_in_the_verdict_line(tmp_path):
    done = _estimate(tmp_path, """
        import torch
        @torch.library.custom_op("npumem_test::twice", mutates_args=())
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2
        x = twice(torch.randn(1024, 1024, device="cuda"))
        values, order = torch.sort(torch.randn(100_000, device="cuda"))
        step = torch.compile(lambda t: t + 1)
        print(step(x).shape)
    """)
    assert done.returncode == 0, done.stderr
    verdict = next(line for line in done.stdout.splitlines() if "peak reserved" in line)
    assert "not modelled: custom operator npumem_test::twice" in verdict
    assert "sort's scratch" in verdict and "torch.compile" in verdict


@needs_build
def test_a_bad_line_assumption_is_a_usage_error(tmp_path):
    for bad in ("script.py:x=1", "script.py:4", "script.py:4=maybe", ":4=1"):
        done = _estimate(tmp_path, "print(1)\n", "--assume", bad)
        assert done.returncode == 2 and "--assume" in done.stderr, (bad, done.stderr)
        assert "Traceback" not in done.stderr


@needs_build
def test_a_side_stream_has_its_own_pool_and_cublas_workspace(tmp_path):
    source = """
        import torch
        side = torch.cuda.Stream()
        layer = torch.nn.Linear(4096, 4096).cuda()
        y = layer(torch.randn(64, 4096, device="cuda"))
        del y
        with torch.cuda.stream(side):
            z = layer(torch.randn(64, 4096, device="cuda"))
            assert torch.cuda.current_stream() == side
        z.record_stream(torch.cuda.current_stream())
        assert torch.cuda.current_stream() != side
    """
    done = _estimate(tmp_path, source, "--json")
    assert done.returncode == 0, done.stderr
    result = _json(done)
    assert result["kernel_workspaces"]["cuBLAS workspace"] == 2 * 32 << 20    # one per stream
    assert any("record_stream" in item["what"] for item in result["unmodelled"])
    one_stream = _estimate(tmp_path, source.replace("with torch.cuda.stream(side):", "if True:")
                           .replace("== side", "!= side"), "--json")
    assert _json(one_stream)["kernel_workspaces"]["cuBLAS workspace"] == 32 << 20
    # the side stream's 1 MiB request cannot take the default stream's freed block
    assert result["peak_reserved_bytes"] > _json(one_stream)["peak_reserved_bytes"] + (32 << 20)


@needs_build
def test_fit_keeps_a_margin_and_says_it(tmp_path):
    script = tmp_path / "grow.py"
    script.write_text("import sys, torch\n"
                      "x = torch.empty(int(float(sys.argv[1]) * 2**28), device='cuda')\n")
    env = dict(os.environ, NPUMEM_CACHE_DIR=str(tmp_path.parent / "npumem-cache"))
    done = subprocess.run([sys.executable, "-m", "npumem", "estimate", "--memory", "10GiB",
                           "--fit", "GIB=2,9,9.7", "--", str(script), "{GIB}"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    answer = next(line for line in done.stdout.splitlines() if line.startswith("largest"))
    assert answer.startswith("largest GIB that fits: 9,")      # 9.7 GiB leaves under 5%
    assert "(5%) kept as the margin" in answer


@needs_build
def test_a_draw_from_the_devices_random_numbers_is_a_guess_but_checks_on_ids_are_not(tmp_path):
    done = _estimate(tmp_path, """
        import torch
        ids = torch.randint(0, 1000, (4, 128), device="cuda")
        assert not (ids < 0).any()                       # holds for any draw
        if torch.rand(1, device="cuda").item() < 0.5:    # a GPU draws its own
            layer = torch.empty(1 << 28, device="cuda")
        if torch.rand(1).item() < 2:                     # the host's draw is the GPU run's too
            pass
    """, "--json")
    assert done.returncode == 3, done.stderr
    (decision,) = _json(done)["uncertain"]
    assert decision["line"] == 5 and "random numbers" in decision["what"]


def test_cudnn_versions_as_people_write_them():
    from npumem.estimate.versions import parse_cudnn
    assert parse_cudnn("9") == 90000 and parse_cudnn("9.10.2") == 91002 == parse_cudnn("91002")
    for bad in ("99.1", "7", "x.y", "9.100"):
        with pytest.raises(ValueError):
            parse_cudnn(bad)


@needs_build
def test_an_assumption_for_a_line_that_reads_nothing_is_warned_about(tmp_path):
    done = _estimate(tmp_path, """
        import torch
        n = torch.randint(0, 2, (64, 1024), device="cuda").sum().item()
        for _ in range(n):
            pass
    """, "--assume", "script.py:4=3")
    assert done.returncode == 3
    assert "--assume script.py:4=3 matched no value read at that line" in done.stderr
    assert "read at script.py:3" in done.stderr
