"""The leaks users make, and loops that look like them but do not leak: each a small PyTorch
program recorded by npumem's tensor recorder (`record`), with the line that leaks marked
`# LEAK` in its source. A leaking pattern runs twice, with its leak and without it; what the
leaky run still holds at the end beyond the fixed one, over its steps, is the truth its
reported growth per step is scored against.

Runnable: `python tests/leak_patterns.py` prints each pattern's verdict.
"""

from __future__ import annotations

import torch

STEPS = 8
torch.manual_seed(0)


class MLP(torch.nn.Module):
    def __init__(self, store: bool = False):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 10)
        self.store, self.history = store, []
        MODELS.append(self)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if self.store:
            self.history.append(h)                       # LEAK: tensors stored on self
        return self.fc2(h)


def _batch(size: int = 8):
    return torch.randn(size, 32), torch.randint(0, 10, (size,))


def _train_step(model, optimizer, x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


# --- leaks -------------------------------------------------------------------------------------

def losses_kept_with_graphs(leak: bool):
    """Each step's loss kept for a plot, not its .item(): a scalar and its graph a step."""
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(STEPS):
        loss = _train_step(model, optimizer, *_batch())
        losses.append(loss if leak else loss.item())     # LEAK: the loss with its graph
    return losses


def retain_graph_and_append(leak: bool):
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    for _ in range(STEPS):
        x, y = _batch()
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward(retain_graph=leak)
        if leak:
            kept.append(loss)                            # LEAK: retain_graph plus append
        optimizer.step()
        optimizer.zero_grad()
    return kept


def validation_without_no_grad(leak: bool):
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    val_losses = []
    for _ in range(STEPS):
        _train_step(model, optimizer, *_batch())
        x, y = _batch(16)
        if leak:
            val = torch.nn.functional.cross_entropy(model(x), y)     # LEAK: no torch.no_grad()
        else:
            with torch.no_grad():
                val = torch.nn.functional.cross_entropy(model(x), y)
        val_losses.append(val if leak else val.item())
    return val_losses


CACHE: dict = {}


def global_cache_keyed_by_step(leak: bool):
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x, y = _batch()
        _train_step(model, optimizer, x, y)
        features = model.fc1(x).detach()
        CACHE[step if leak else 0] = features            # LEAK: a global cache keyed by step


def tensors_stored_on_self(leak: bool):
    model = MLP(store=leak)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(STEPS):
        _train_step(model, optimizer, *_batch())
    return model.history


def kv_cache_never_trimmed(leak: bool):
    """A serving loop (no marks: the step is inferred) that keeps each request's keys and
    values in a cache it never trims."""
    model = MLP()
    cache = []
    with torch.no_grad():
        for _ in range(STEPS + 4):
            x, _ = _batch(4)
            cache.append(torch.relu(model.fc1(x)))      # LEAK: a KV cache never trimmed
            if not leak:
                cache = cache[-2:]
            model.fc2(cache[-1] * 2)
    return cache


def hook_appends_activations(leak: bool):
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seen = []
    if leak:
        model.fc1.register_forward_hook(lambda m, i, out: seen.append(out))   # LEAK: a hook
    for _ in range(STEPS):
        _train_step(model, optimizer, *_batch())
    return seen


def anomaly_nodes_kept(leak: bool):
    """Autograd objects kept across steps: the graph of an output checked under anomaly
    mode, kept for debugging, holds its saved tensors."""
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    nodes = []
    for _ in range(STEPS):
        _train_step(model, optimizer, *_batch())
        with torch.autograd.detect_anomaly(check_nan=False):
            out = model(_batch()[0])
        if leak:
            nodes.append(out.grad_fn)                    # LEAK: autograd nodes kept
    return nodes


LEAKING = [losses_kept_with_graphs, retain_graph_and_append, validation_without_no_grad,
           global_cache_keyed_by_step, tensors_stored_on_self, kv_cache_never_trimmed,
           hook_appends_activations, anomaly_nodes_kept]


# --- clean loops -------------------------------------------------------------------------------

def clean_training_loop():
    model = MLP()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(STEPS):
        _train_step(model, optimizer, *_batch())


def inference_server_varying_batches():
    model = MLP()
    sizes = [1, 16, 4, 9, 2, 31, 8, 3, 20, 5, 12, 7, 25, 6]
    with torch.no_grad():
        for size in sizes:
            model(torch.randn(size, 32)).argmax(-1)


def generation_loop():
    """Greedy generation, the cache reset for each prompt: it grows within one and is freed."""
    model = MLP()
    with torch.no_grad():
        for _ in range(6):
            cache = torch.zeros(0, 64)
            x = torch.randn(1, 32)
            for _ in range(8):
                kv = torch.relu(model.fc1(x))
                cache = torch.cat([cache, kv])
                x = torch.nn.functional.pad(model.fc2(cache[-1:]), (0, 22))


def gradient_accumulation():
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(STEPS):
        for _ in range(4):
            x, y = _batch()
            (torch.nn.functional.cross_entropy(model(x), y) / 4).backward()
        optimizer.step()
        optimizer.zero_grad()


def warm_up_steps():
    """Adam's state made at the first step, a workspace made once at the second, a varying
    sequence length: memory rises in the first steps and then holds."""
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    workspace = []
    for step in range(STEPS):
        if step == 1:
            workspace.append(torch.empty(4096))
        _train_step(model, optimizer, *_batch(8 + (step * 7) % 13))


CLEAN = [clean_training_loop, inference_server_varying_batches, generation_loop,
         gradient_accumulation, warm_up_steps]


def live_at_end(snapshot: dict) -> int:
    """The bytes the program still held when it ended."""
    from npumem.profile.live_totals import live_changes
    from npumem.trace.snapshot.columns import arrays

    _, _, change = live_changes(arrays(snapshot["device_traces"][0]))
    return int(change.sum())


MODELS: list = []          # every MLP made: their parameters are not what a leak holds


def held_bytes(kept) -> int:
    """The bytes of the tensor storages that `kept` holds: its tensors, and the tensors saved
    in the autograd graphs it holds (not the models' parameters)."""
    params = {p.untyped_storage().data_ptr() for m in MODELS for p in m.parameters()}
    storages: dict[int, int] = {}
    seen: dict[int, object] = {}          # (held: getattr makes new objects, ids are reused)
    todo = [kept]
    while todo:
        item = todo.pop()
        if id(item) in seen or item is None:
            continue
        seen[id(item)] = item
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            if storage.data_ptr() not in params:
                storages[storage.data_ptr()] = storage.nbytes()
            todo.append(item.grad_fn)
        elif isinstance(item, (list, tuple)):
            todo += list(item)
        elif isinstance(item, dict):
            todo += list(item.values())
        elif hasattr(item, "next_functions"):            # an autograd node
            todo += [node for node, _ in item.next_functions]
            for name in dir(item):
                if name.startswith("_saved_"):
                    try:
                        todo.append(getattr(item, name))
                    except RuntimeError:                 # freed by backward
                        pass
    return sum(storages.values())


def record(program, *args) -> tuple[dict, float]:
    """`program(*args)` under npumem's tensor recorder (with stacks): (its snapshot, the bytes
    per step that what it returns holds: a leak's truth)."""
    from npumem.profile.tensor_recorder import TensorRecorder

    torch.manual_seed(0)
    CACHE.clear()
    MODELS.clear()
    with TensorRecorder() as recorder:
        kept = program(*args)
        snapshot = recorder.snapshot()
    steps = STEPS + 4 if program is kv_cache_never_trimmed else STEPS
    truth = held_bytes([kept, CACHE]) / steps
    CACHE.clear()
    return snapshot, truth


if __name__ == "__main__":
    import time

    from npumem.profile.leak_analysis import analyze_leaks

    for program in LEAKING:
        started = time.time()
        snapshot, truth = record(program, True)
        print(f"({time.time() - started:.1f} s)")
        analysis = analyze_leaks(snapshot)
        found = sum(leak.per_step for leak in analysis.leaks)
        print(f"{program.__name__}: truth {truth:.0f} B/step, found {found:.0f} "
              f"({analysis.verdict(0)})")
        for leak in analysis.leaks:
            print("   ", leak.describe())
    for program in CLEAN:
        analysis = analyze_leaks(record(program)[0])
        print(f"{program.__name__}: {len(analysis.leaks)} leak(s) ({analysis.verdict(0)})")
        for leak in analysis.leaks:
            print("   ", leak.describe())
