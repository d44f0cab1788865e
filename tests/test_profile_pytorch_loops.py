"""`npumem profile` on the training loops PyTorch users write: a small GPT-style model (random
weights, built here, no downloads) trained with AdamW, clean and with the leaks people make.
Leaks are growth step over step, named by the user's own line; weights and optimizer state
are never called leaks."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")

MODEL = textwrap.dedent("""\
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self, width, heads):
            super().__init__()
            self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                     nn.Linear(4 * width, width))

        def forward(self, x):
            h = self.norm1(x)
            x = x + self.attention(h, h, h, need_weights=False)[0]
            return x + self.mlp(self.norm2(x))


    class TinyGPT(nn.Module):
        def __init__(self, vocab=256, width=64, heads=4, layers=2, context=32):
            super().__init__()
            self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(context, width)
            self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
            self.head = nn.Linear(width, vocab)

        def forward(self, tokens):
            positions = torch.arange(tokens.shape[1])
            return self.head(self.blocks(self.embed(tokens) + self.position(positions)))


    def batch(size=8, context=32):
        return torch.randint(0, 256, (size, context))


    def loss_of(model, tokens):
        logits = model(tokens[:, :-1])
        return nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    """)

TRAIN = textwrap.dedent("""\
    import torch
    from tinygpt import TinyGPT, batch, loss_of

    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    history = []


    def validate():
        loss = loss_of(model, batch())
        history.append(loss)


    for step in range(STEPS):
        tokens = batch()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        LEAK
    """)

MODULE_LEVEL = textwrap.dedent("""\
    import torch

    scale = 1.0
    table = torch.ones(1024, 1024)
    lookup = torch.zeros(512, 1024)
    print(float(table.sum() * scale))
    """)


def profile(tmp_path, name: str, source: str, *target: str) -> tuple[str, dict, str]:
    folder = tmp_path / name
    library = folder / "site-packages"          # the model comes from an installed library
    library.mkdir(parents=True)
    (library / "tinygpt.py").write_text(MODEL)
    (folder / "train.py").write_text(source)
    out = folder / "out"
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(library), str(folder)]))
    run = subprocess.run([sys.executable, "-m", "npumem", "profile", "--out", str(out), "--",
                          *(target or [str(folder / "train.py")])],
                         capture_output=True, text=True, timeout=240, cwd=folder, env=environment)
    assert run.returncode == 0, run.stderr
    with open(out / "torch_snapshot.pickle", "rb") as handle:
        snapshot = pickle.load(handle)
    return run.stderr, snapshot, (out / "summary.txt").read_text()


def train(steps: int, leak: str = "pass") -> str:
    return TRAIN.replace("STEPS", str(steps)).replace("LEAK", leak)


def test_a_clean_loop_has_no_leak_and_its_weights_and_state_are_named(tmp_path):
    stderr, snapshot, summary = profile(tmp_path, "clean", train(6))
    assert "no leak: nothing grew step over step" in stderr
    assert "Leaks (growth at step boundaries):\n  judged at the boundaries of 6 steps marked by " \
           "optimizer.step\n  no leak: nothing grew step over step" in summary
    kinds = {e["category"] for e in snapshot["device_traces"][0] if e["action"] == "alloc"}
    assert {"parameter", "optimizer_state", "gradient", "activation", "input",
            "temporary"} <= kinds
    assert "by category: " in summary and "parameter" in summary


def test_a_loop_that_keeps_each_loss_graph_names_the_line_and_its_growth(tmp_path):
    # each step's logits kept, and with them the graph that made them, by the third step
    stderr, _, summary = profile(tmp_path, "leak", train(6, "history.append(logits)"))
    first = next(line for line in stderr.splitlines() if "leak:" in line)
    assert "per step over" in first and "train.py:17 in <module>" in first
    assert "train.py:17 in <module>" in summary.split("Leaks (growth at step boundaries):")[1]


def test_a_validation_step_without_no_grad_is_found_in_the_users_function(tmp_path):
    stderr, _, summary = profile(tmp_path, "validate", train(6, "validate()"))
    first = next(line for line in stderr.splitlines() if "leak:" in line)
    assert "train.py:11 in validate" in first
    leaks = summary.split("Leaks (growth at step boundaries):")[1]
    assert "train.py:11 in validate" in leaks and "called from" in leaks
    assert "tinygpt.py" not in leaks.splitlines()[2]           # not the library's line first


def test_module_level_tensors_are_named_by_their_own_lines(tmp_path):
    _, _, summary = profile(tmp_path, "module", MODULE_LEVEL)
    assert "train.py:4 in <module>" in summary and "train.py:5 in <module>" in summary
    assert "train.py:1 in <module>" not in summary


def test_a_module_run_with_dash_m_is_profiled_like_a_script(tmp_path):
    stderr, snapshot, summary = profile(tmp_path, "dash_m", train(3, "validate()"), "-m", "train")
    assert "train.py:11 in validate" in summary
    assert any(e["action"] == "alloc" for e in snapshot["device_traces"][0])


def test_a_sampled_profile_still_finds_the_leak_and_says_it_sampled(tmp_path):
    folder = tmp_path / "sampled"
    library = folder / "site-packages"
    library.mkdir(parents=True)
    (library / "tinygpt.py").write_text(MODEL)
    (folder / "train.py").write_text(train(6, "validate()"))
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(library), str(folder)]))
    run = subprocess.run([sys.executable, "-m", "npumem", "profile", "--out", str(folder / "out"),
                          "--sample-bytes", "64KiB", "--", str(folder / "train.py")],
                         capture_output=True, text=True, timeout=240, env=environment)
    assert run.returncode == 0, run.stderr
    assert "train.py:11 in validate" in next(l for l in run.stderr.splitlines() if "leak:" in l)
    assert "sampled (--sample-bytes)" in (folder / "out" / "summary.txt").read_text()
