"""Held-out check of the leak analysis (issue 61): leaking and clean programs that no rule or
threshold was set on (the table in tests/leak_patterns.py is in sample). Each leaking program
is scored on whether its leak is found at the user's line, with its growth per step within
25% of what the program really kept (tests/leak_patterns.held_bytes); each clean one on
whether it is called a leak.

    python bench/leak_heldout.py
"""

from __future__ import annotations

import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.leak_patterns import CACHE, MODELS, held_bytes  # noqa: E402

STEPS = 12


class ConvNet(nn.Module):
    def __init__(self, debug: bool):
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 8, 3, padding=1), nn.Linear(8 * 8 * 8, 4)
        self.debug, self.maps = debug, []
        MODELS.append(self)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        if self.debug:
            self.maps.append(y.detach())
        return self.head(y.flatten(1))


def conv_feature_maps_on_self():
    model = ConvNet(True)
    opt = torch.optim.Adam(model.parameters())
    for _ in range(STEPS):
        loss = nn.functional.cross_entropy(model(torch.randn(4, 3, 8, 8)),
                                           torch.randint(0, 4, (4,)))
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.maps


def lstm_hidden_not_detached():
    """Truncated BPTT gone wrong: the hidden state carries every step's graph."""
    model = nn.LSTM(16, 32, batch_first=True)
    MODELS.append(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    hidden = None
    for _ in range(STEPS):
        out, hidden = model(torch.randn(2, 5, 16), hidden)
        out.pow(2).mean().backward(retain_graph=True)
        opt.step()
        opt.zero_grad()
    return hidden


def predictions_by_step():
    model = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    MODELS.append(model)
    opt = torch.optim.AdamW(model.parameters())
    for step in range(STEPS):
        out = model(torch.randn(2, 6, 32))
        out.mean().backward()
        opt.step()
        opt.zero_grad()
        CACHE[f"step{step}"] = out.detach().clone()
    return None


def attention_weights_hook():
    model = nn.MultiheadAttention(32, 4, batch_first=True)
    MODELS.append(model)
    kept = []
    model.register_forward_hook(lambda m, i, out: kept.append(out[1]))
    with torch.no_grad():
        for _ in range(STEPS + 4):
            x = torch.randn(2, 6, 32)
            model(x, x, x)
    return kept


def hard_examples_with_graph():
    model = nn.Sequential(nn.Linear(20, 40), nn.Tanh(), nn.Linear(40, 3))
    MODELS.append(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    hard = []
    for _ in range(STEPS):
        x = torch.randn(8, 20)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, torch.randint(0, 3, (8,)))
        loss.backward(retain_graph=True)
        hard.append(logits[:2])
        opt.step()
        opt.zero_grad()
    return hard


def encoder_varying_lengths():
    model = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
    MODELS.append(model)
    opt = torch.optim.AdamW(model.parameters())
    for step in range(STEPS):
        model(torch.randn(2, 4 + (step * 5) % 11, 32)).mean().backward()
        opt.step()
        opt.zero_grad()


def fixed_batch_inference():
    model = nn.Sequential(nn.Linear(20, 40), nn.Tanh(), nn.Linear(40, 3))
    with torch.no_grad():
        for _ in range(STEPS):
            model(torch.randn(8, 20)).softmax(-1)


def ema_training():
    model = nn.Sequential(nn.Linear(20, 40), nn.Tanh(), nn.Linear(40, 3))
    ema = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(STEPS):
        nn.functional.cross_entropy(model(torch.randn(8, 20)),
                                    torch.randint(0, 3, (8,))).backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for shadow, p in zip(ema, model.parameters()):
                shadow.mul_(0.9).add_(p, alpha=0.1)
    return ema


def gru_history_kept_with_growing_batches():
    """Written after the first run (a second held-out set): per-sample embeddings kept with
    their graph while the batch grows each step."""
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 2))
    MODELS.append(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kept = []
    for step in range(STEPS):
        x = torch.randn(4 + 2 * step, 12)
        out = model(x)
        out.sum().backward(retain_graph=True)
        kept.append(out)
        opt.step()
        opt.zero_grad()
    return kept


def gan_two_optimizers():
    """Written after the first run: two optimizers step each iteration (two marks a step)."""
    gen, disc = nn.Linear(8, 16), nn.Linear(16, 1)
    g_opt, d_opt = torch.optim.Adam(gen.parameters()), torch.optim.Adam(disc.parameters())
    for _ in range(STEPS):
        fake = gen(torch.randn(8, 8))
        disc(fake.detach()).mean().backward()
        d_opt.step()
        d_opt.zero_grad()
        disc(fake).mean().backward()
        g_opt.step()
        g_opt.zero_grad()


def curriculum_lengths():
    """Written after the first run: the sequence length grows by schedule; the last batch is
    kept past the step (as `x` in the loop), no leak."""
    model = nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x = torch.randn(2, 8 + 3 * step + (step % 3), 16)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


def predictions_concatenated():
    """Third held-out set (written after the rules were final, run once): all predictions
    concatenated into one growing tensor."""
    model = nn.Linear(10, 5)
    MODELS.append(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    preds = torch.zeros(0, 5)
    for _ in range(STEPS):
        out = model(torch.randn(6, 10))
        out.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        preds = torch.cat([preds, out.detach()])
    return preds


def gradients_kept_by_step():
    """Third held-out set: a copy of every gradient kept for later analysis."""
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 3))
    MODELS.append(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history = {}
    for step in range(STEPS):
        nn.functional.cross_entropy(model(torch.randn(4, 10)), torch.randint(0, 3, (4,))).backward()
        history[step] = [p.grad.clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad()
    return history


def memory_bank_never_dequeued():
    """Third held-out set: an inference loop that banks every feature (no marks)."""
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh())
    bank = []
    with torch.no_grad():
        for _ in range(STEPS + 4):
            feats = model(torch.randn(5, 16))
            bank.append(feats / feats.norm(dim=1, keepdim=True))
    return bank


def memory_bank_fixed_size():
    """Third held-out set, clean: a MoCo-style queue trimmed to its size every step."""
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    queue = torch.zeros(0, 32)
    for _ in range(STEPS):
        feats = model(torch.randn(5, 16))
        feats.pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        queue = torch.cat([queue, feats.detach()])[-20:].clone()
    return queue


def periodic_validation():
    """Third held-out set, clean: validation under no_grad every third step, kept as numbers."""
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 3))
    opt = torch.optim.AdamW(model.parameters())
    scores = []
    for step in range(STEPS):
        nn.functional.cross_entropy(model(torch.randn(4, 10)), torch.randint(0, 3, (4,))).backward()
        opt.step()
        opt.zero_grad()
        if step % 3 == 2:
            with torch.no_grad():
                scores.append(model(torch.randn(16, 10)).argmax(-1).float().mean().item())
    return scores


THIRD = [predictions_concatenated, gradients_kept_by_step, memory_bank_never_dequeued,
         memory_bank_fixed_size, periodic_validation]

LEAKING = [conv_feature_maps_on_self, lstm_hidden_not_detached, predictions_by_step,
           attention_weights_hook, hard_examples_with_graph, gru_history_kept_with_growing_batches,
           predictions_concatenated, gradients_kept_by_step, memory_bank_never_dequeued]
CLEAN = [encoder_varying_lengths, fixed_batch_inference, ema_training, gan_two_optimizers,
         curriculum_lengths, memory_bank_fixed_size, periodic_validation]


def main() -> int:
    from npumem.profile.leak_analysis import analyze_leaks
    from npumem.profile.tensor_recorder import TensorRecorder

    failures = 0
    for program in LEAKING + CLEAN:
        torch.manual_seed(0)
        CACHE.clear()
        MODELS.clear()
        with TensorRecorder() as recorder:
            kept = program()
            snapshot = recorder.snapshot()
        steps = STEPS + 4 if program in (attention_weights_hook, memory_bank_never_dequeued) \
            else STEPS
        truth = held_bytes([kept, CACHE]) / steps if program in LEAKING else 0.0
        CACHE.clear()
        analysis = analyze_leaks(snapshot)
        found = sum(leak.per_step for leak in analysis.leaks)
        users = all(leak.where.split(":")[0].endswith("leak_heldout.py")
                    for leak in analysis.leaks)
        if program in LEAKING:
            ok = bool(analysis.leaks) and users and abs(found - truth) <= 0.25 * truth
            error = f"{(found - truth) / truth:+.1%}" if truth else "n/a"
            print(f"leak  {program.__name__:28} truth {truth:8.0f} B/step  found {found:8.0f} "
                  f"({error})  {'ok' if ok else 'MISSED'}  [{analysis.verdict(0)[:60]}]")
        else:
            ok = not analysis.leaks
            print(f"clean {program.__name__:28} {len(analysis.leaks)} leak(s)  "
                  f"{'ok' if ok else 'FALSE ALARM'}  [{analysis.verdict(0)[:60]}]")
        for leak in analysis.leaks:
            print(f"        {leak.describe()[:160]}")
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
