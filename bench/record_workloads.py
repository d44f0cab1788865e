"""Record allocation traces of small plain-PyTorch workloads, beyond the ones in ../shared/data.

    python bench/record_workloads.py OUT_DIR [NAME ...] [--device cpu|cuda]     # then:
    python bench/fragmentation.py ../shared/data/traces/*.gz OUT_DIR/*.jsonl.gz
    npumem replay --check OUT_DIR/NAME.pickle                                   # cuda recordings

On cpu (the default) each workload runs under `torch.profiler.profile(profile_memory=True)`, as
the shared traces were recorded, and is written as OUT_DIR/NAME.jsonl.gz (npumem's JSONL trace).
On cuda it runs on the GPU under `torch.cuda.memory._record_memory_history` (Python stacks) and
the real caching allocator's snapshot is written as OUT_DIR/NAME.pickle, as
`torch.cuda.memory._dump_snapshot` writes it. The models are written here in plain torch (no
downloads) and seeded, so a run is repeatable; they exist to check allocator policies, and
npumem's model of PyTorch's allocator, on workloads they were not tuned on.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import pickle
import random
import tempfile

import torch
import torch.nn.functional as F
from torch import nn

from npumem.trace import read_trace, write_trace


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(y + self.shortcut(x))


def residual_cnn(widths: list[int], blocks: int) -> nn.Module:
    layers = [nn.Conv2d(3, widths[0], 3, 1, 1), nn.BatchNorm2d(widths[0]), nn.ReLU()]
    cin = widths[0]
    for stage, width in enumerate(widths):
        for index in range(blocks):
            layers.append(BasicBlock(cin, width, 2 if index == 0 and stage > 0 else 1))
            cin = width
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10))


class UNet(nn.Module):
    """Three downsamplings, three upsamplings with skip connections (long-lived activations)."""

    def __init__(self, width: int = 16):
        super().__init__()
        w = width
        self.down = nn.ModuleList([nn.Conv2d(3, w, 3, 1, 1), nn.Conv2d(w, 2 * w, 3, 2, 1),
                                   nn.Conv2d(2 * w, 4 * w, 3, 2, 1), nn.Conv2d(4 * w, 8 * w, 3, 2, 1)])
        self.up = nn.ModuleList([nn.ConvTranspose2d(8 * w, 4 * w, 2, 2),
                                 nn.ConvTranspose2d(8 * w, 2 * w, 2, 2),
                                 nn.ConvTranspose2d(4 * w, w, 2, 2)])
        self.out = nn.Conv2d(2 * w, 3, 1)

    def forward(self, x):
        skips = []
        for conv in self.down:
            x = F.gelu(conv(x))
            skips.append(x)
        skips.pop()
        for up in self.up:
            x = torch.cat([F.gelu(up(x)), skips.pop()], 1)
        return self.out(x)


class TinyGPT(nn.Module):
    """A decoder with a KV cache that grows by concatenation, as simple generation loops do."""

    def __init__(self, dim: int = 256, layers: int = 4, heads: int = 4, vocab: int = 2000):
        super().__init__()
        self.heads, self.vocab = heads, vocab
        self.embed = nn.Embedding(vocab, dim)
        self.qkv = nn.ModuleList(nn.Linear(dim, 3 * dim) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
                                 for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(2 * layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids, cache=None):
        cache = cache if cache is not None else [None] * len(self.qkv)
        x = self.embed(ids)
        batch, length, dim = x.shape
        for i, (qkv, proj, mlp) in enumerate(zip(self.qkv, self.proj, self.mlp)):
            q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2)
                       for t in qkv(self.norms[2 * i](x)).split(dim, -1))
            if cache[i] is not None:
                k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=length > 1)
            x = x + proj(attended.transpose(1, 2).reshape(batch, length, dim))
            x = x + mlp(self.norms[2 * i + 1](x))
        return self.head(x[:, -1])


def training(model: nn.Module, batch, loss, steps: int = 5, optimizer: str = "adamw",
             micro_batches: int = 1, eval_every: int = 0, state_first: bool = False):
    """`steps` optimizer steps on fresh batches: forward, backward (`micro_batches` of them,
    accumulating gradients), update; with `eval_every`, a forward pass without gradients after
    every that many steps. The optimizer makes its state in the first step, between that step's
    gradients; with `state_first` it is made before it, as loading a checkpoint does."""
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), 1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)

    def run():
        if state_first:
            _make_state(opt)
        for step in range(1, steps + 1):
            opt.zero_grad(set_to_none=True)
            for _ in range(micro_batches):
                inputs, target = batch()
                loss(model(inputs), target).backward()
            opt.step()
            if eval_every and step % eval_every == 0:
                with torch.no_grad():
                    model(batch()[0])
    return run


def mixed_precision_training(model: nn.Module, batch, loss, steps: int = 20):
    """`steps` AdamW steps with torch.amp's recipe: the forward pass under autocast (bfloat16
    on the CPU, float16 on a GPU) and a GradScaler, which makes its scale in the first step
    and checks the gradients for inf and NaN in every step."""
    device = next(model.parameters()).device.type
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    scaler = torch.amp.GradScaler(device)
    dtype = torch.bfloat16 if device == "cpu" else torch.float16

    def run():
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            inputs, target = batch()
            with torch.autocast(device, dtype=dtype):
                value = loss(model(inputs), target)
            scaler.scale(value).backward()
            scaler.step(opt)
            scaler.update()
    return run


def _make_state(opt: torch.optim.Optimizer) -> None:
    """The state `opt` would make in its first step (zeros, and AdamW's step count on the host,
    where it keeps it), made now, one parameter after another, as a checkpoint is loaded."""
    for group in opt.param_groups:
        for param in group["params"]:
            if isinstance(opt, torch.optim.AdamW):
                opt.state[param] = {"step": torch.tensor(0.0, device="cpu"),
                                    "exp_avg": torch.zeros_like(param),
                                    "exp_avg_sq": torch.zeros_like(param)}
            else:
                opt.state[param] = {"momentum_buffer": torch.zeros_like(param)}


def generation(model: TinyGPT, batch: int = 4, prompt: int = 32, new_tokens: int = 64, runs: int = 3):
    """Greedy decoding: a prompt, then one token at a time against the growing cache."""
    def run():
        with torch.no_grad():
            for _ in range(runs):
                cache = [None] * len(model.qkv)
                token = model(torch.randint(0, model.vocab, (batch, prompt)), cache).argmax(-1, keepdim=True)
                for _ in range(new_tokens):
                    token = model(token, cache).argmax(-1, keepdim=True)
    return run


def _classes(n: int, classes: int = 10):
    return torch.randint(0, classes, (n,))


def _varying_lengths(batch: int, dim: int, lengths: list[int], seed: int = 0):
    """Batches whose sequence length is drawn for each one (padding to the longest sequence of
    the batch, as dynamic padding does), from a seeded generator."""
    rng = random.Random(seed)

    def make():
        length = rng.choice(lengths)
        return torch.randn(batch, length, dim), torch.randn(batch, length, dim)
    return make


def _workloads():
    """name -> a function building the workload's run() (built lazily: models take memory)."""
    cross_entropy = nn.CrossEntropyLoss()

    def tokens():
        return torch.randint(0, 2000, (8, 96)), _classes(8, 2000)
    return {
        "cnn_sgd": lambda: training(residual_cnn([16, 32, 64, 128], 2),
                                    lambda: (torch.randn(16, 3, 64, 64), _classes(16)),
                                    cross_entropy, optimizer="sgd"),
        "cnn_wide": lambda: training(residual_cnn([32, 64, 128], 3),
                                     lambda: (torch.randn(8, 3, 80, 80), _classes(8)), cross_entropy),
        "unet": lambda: training(UNet(16), lambda: (torch.randn(4, 3, 96, 96), torch.randn(4, 3, 96, 96)),
                                 F.mse_loss),
        "mlp": lambda: training(nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                                              nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 10)),
                                lambda: (torch.randn(256, 784), _classes(256)), cross_entropy),
        "mlp_amp": lambda: mixed_precision_training(
            nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                          nn.Linear(1024, 10)),
            lambda: (torch.randn(128, 512), _classes(128)), cross_entropy),
        "encoder": lambda: training(nn.TransformerEncoder(nn.TransformerEncoderLayer(256, 4, 1024, batch_first=True), 4),
                                    lambda: (torch.randn(8, 128, 256), torch.randn(8, 128, 256)), F.mse_loss),
        "gpt_train": lambda: training(TinyGPT(), tokens, cross_entropy),
        # the same, resumed: the optimizer's state exists before the first step
        "gpt_resume": lambda: training(TinyGPT(), tokens, cross_entropy, state_first=True),
        "gpt_generate": lambda: generation(TinyGPT()),
        "cnn_accum": lambda: training(residual_cnn([16, 32, 64], 2),
                                      lambda: (torch.randn(8, 3, 48, 48), _classes(8)),
                                      cross_entropy, steps=8, optimizer="sgd", micro_batches=2),
        "mlp_eval": lambda: training(nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 10)),
                                     lambda: (torch.randn(256, 784), _classes(256)), cross_entropy,
                                     steps=8, eval_every=2),
        "encoder_varlen": lambda: training(
            nn.TransformerEncoder(nn.TransformerEncoderLayer(128, 4, 512, batch_first=True), 2),
            _varying_lengths(8, 128, [48, 64, 96]), F.mse_loss, steps=16),
        "lstm": lambda: training(nn.LSTM(128, 256, 2, batch_first=True),
                                 lambda: (torch.randn(16, 64, 128), None),
                                 lambda output, _: output[0].pow(2).mean()),
    }


def record(name: str, out_dir: pathlib.Path) -> tuple[pathlib.Path, int]:
    """Run workload `name` under the profiler; write OUT_DIR/NAME.jsonl.gz; (path, events)."""
    torch.manual_seed(0)
    run = _workloads()[name]()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as profiler:
        run()
    handle, chrome = tempfile.mkstemp(suffix=".json")
    os.close(handle)
    try:
        profiler.export_chrome_trace(chrome)
        path = out_dir / f"{name}.jsonl.gz"
        return path, write_trace(read_trace(chrome), str(path), "jsonl")
    finally:
        os.unlink(chrome)


def record_cuda(name: str, out_dir: pathlib.Path) -> tuple[pathlib.Path, int]:
    """Run workload `name` on the GPU with the allocator's history on; write OUT_DIR/NAME.pickle
    (the memory snapshot); (path, trace entries)."""
    torch.manual_seed(0)
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
    try:
        with torch.device("cuda"):              # every tensor the workload makes is on the GPU
            run = _workloads()[name]()
            run()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    del run
    torch.cuda.empty_cache()
    path = out_dir / f"{name}.pickle"
    with open(path, "wb") as handle:
        pickle.dump(snapshot, handle)
    return path, sum(len(trace) for trace in snapshot["device_traces"])


def main() -> None:
    names = list(_workloads())
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=pathlib.Path)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"default: all of {', '.join(names)}")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(names))
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(names)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: PyTorch sees no CUDA GPU on this machine")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.names or names:
        path, events = (record_cuda if args.device == "cuda" else record)(name, args.out_dir)
        print(f"{name}: {events} events -> {path}", flush=True)


if __name__ == "__main__":
    main()
