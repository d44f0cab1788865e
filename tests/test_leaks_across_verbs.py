"""One leak story across verbs (issue 61): a GPU-shaped snapshot that `npumem estimate` makes
without a GPU, read by `report` (text and --json) and `tune`, which agree; a run that died
while growing is told so first by tune; `profile` refuses what is not a script in one line."""

from __future__ import annotations

import gzip
import json
import pickle
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

LEAKY = textwrap.dedent('''
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    for step in range(8):
        x = torch.randn(64, 256, device="cuda")
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, torch.randint(0, 10, (64,), device="cuda"))
        loss.backward(retain_graph=True)
        kept.append(loss)
        opt.step()
        opt.zero_grad()
''')


def npumem(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npumem", *map(str, args)], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def predicted(tmp_path_factory):
    folder = tmp_path_factory.mktemp("estimate")
    (folder / "leaky.py").write_text(LEAKY)
    done = npumem("estimate", "--gpu", "h100", "--out", folder / "out", "--", folder / "leaky.py")
    assert done.returncode == 0, done.stderr
    assert "  leak: the run grows by " in done.stdout and "leaky.py:9 in <module>" in done.stdout
    return folder / "out" / "predicted.pickle"


def test_a_gpu_shaped_leak_is_found_at_the_users_line_by_report_and_tune(predicted):
    text = npumem("report", predicted).stdout
    section = text.split("Leaks (growth at step boundaries):")[1]
    assert "judged at the boundaries of 8 steps marked by optimizer.step" in section
    assert "+128.00 KiB per step over 8 steps at " in section and "leaky.py:9 in <module>" in section
    data = json.loads(npumem("report", "--json", predicted).stdout)
    assert data["steps"]["source"] == "marked" and data["steps"]["count"] == 8
    first = data["leaks"][0]
    assert first["file"].endswith("leaky.py") and first["line"] == 9
    assert first["growth_per_step_bytes"] == 128 * 1024
    assert {"devices", "fragmentation", "leaks", "steps"} <= set(data)
    truth = 64 * 256 * 4 + 64 * 512 * 4 + 64 * 10 * 4 + 64 * 8 + 4   # x, hidden, logits, targets, loss
    found = sum(leak["growth_per_step_bytes"] for leak in data["leaks"])
    assert abs(found - truth) <= 0.25 * truth
    tune = npumem("tune", predicted).stdout
    assert tune.splitlines()[0].startswith("the run grows by ")
    assert "leaky.py:9 in <module>" in tune.splitlines()[0]


def test_a_run_that_died_growing_is_told_first_that_no_setting_fits_a_leak(predicted, tmp_path):
    with open(predicted, "rb") as handle:
        snapshot = pickle.load(handle)
    trace = snapshot["device_traces"][0]
    last = trace[-1]
    trace.append({"action": "oom", "addr": 1 << 30, "size": 64 << 20, "stream": 0,
                  "time_us": last["time_us"] + 1, "frames": last.get("frames") or []})
    died = tmp_path / "died.pickle.gz"
    with gzip.open(died, "wb") as handle:
        pickle.dump(snapshot, handle)
    first = npumem("tune", died).stdout.splitlines()[0]
    assert first.startswith("the run grows by ") and first.endswith("; no setting fits a leak")


@pytest.mark.parametrize("kind", ["pickle", "binary", "folder", "syntax"])
def test_profile_refuses_what_is_not_a_script_in_one_line(tmp_path, kind):
    target = {"pickle": tmp_path / "run.pickle", "binary": tmp_path / "blob",
              "folder": tmp_path / "adir", "syntax": tmp_path / "broken.py"}[kind]
    if kind == "pickle":
        target.write_bytes(pickle.dumps({"segments": []}))
    elif kind == "binary":
        target.write_bytes(b"\x7fELF\0\0\1\2")
    elif kind == "folder":
        target.mkdir()
    else:
        target.write_text("def f(:\n    pass\n")
    from click.testing import CliRunner

    from npumem.cli import main

    done = CliRunner().invoke(main, ["profile", "--out", str(tmp_path / "out"), "--", str(target)])
    assert done.exit_code == 2 and len(done.output.strip().splitlines()) == 1, done.output
    assert done.output.startswith("error: ") and not (tmp_path / "out").exists()
