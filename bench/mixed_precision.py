"""A small transformer block at each precision policy, through the mixed-precision scheduler.

    python bench/mixed_precision.py [--device sim|torch:cpu|torch:cuda] [--json]

The block: token embedding, layer norm, one attention head group (Q, K, V and output
projections, scores, Softmax), residual add, layer norm, MLP (4x, GELU), residual add. Weights
are random, made here with a fixed seed (no downloads). Every MatMul, Softmax and Add runs on the
device through `MixedPrecisionScheduler.run` at policy float32, bfloat16, float16, int8 or auto;
the embedding lookup, layer norms and GELU run on the host in float32 (normalisations are
sensitive ops: the scheduler would keep them in float32 too).

One JSON row per policy:
- weights_bytes: the weights as the scheduler stores them (int8: one byte per MatMul weight
  plus a float32 scale per column; the embedding in the activations' dtype);
- matmul_weights_bytes: the MatMul weights alone (what int8 quarters);
- activations_peak_bytes: the largest activation footprint of one op: its non-weight inputs and
  its output as stored on the device (the float32 copies an op computes from are left out: a
  real kernel widens tile by tile in on-chip memory);
- max_rel_error, mean_rel_error: the block's output against a float64 reference, normwise:
  max |out - ref| / max |ref| and mean |out - ref| / mean |ref|;
- latency_ms: the block's wall time, on torch backends only (the simulator's time is not a
  hardware figure).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import npumem
from npumem.mixed_precision import POLICIES, MixedPrecisionScheduler

VOCAB, SEQ, DIM, HIDDEN = 1000, 128, 256, 1024


def make_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    scale = 1 / np.sqrt(DIM)
    shapes = {"wq": (DIM, DIM), "wk": (DIM, DIM), "wv": (DIM, DIM), "wo": (DIM, DIM),
              "w1": (DIM, HIDDEN), "w2": (HIDDEN, DIM)}
    weights = {name: (rng.standard_normal(shape) * scale).astype(np.float32)
               for name, shape in shapes.items()}
    weights["embedding"] = rng.standard_normal((VOCAB, DIM)).astype(np.float32)
    return weights


def layer_norm(x: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    return ((x - mean) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)).astype(x.dtype)


def gelu(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))).astype(x.dtype)


def block(weights, tokens, matmul, softmax, add):
    """The block with the given op implementations (float32 numpy, or the scheduler's)."""
    x = weights["embedding"][tokens]
    h = layer_norm(x)
    q, k, v = (matmul(h, weights[name]) for name in ("wq", "wk", "wv"))
    scores = matmul(q, np.ascontiguousarray(k.T)) / np.float32(np.sqrt(DIM))
    attended = matmul(softmax(scores), v)
    x = add(x, matmul(attended, weights["wo"]))
    hidden = gelu(matmul(layer_norm(x), weights["w1"]))
    return add(x, matmul(hidden, weights["w2"]))


def reference(weights, tokens) -> np.ndarray:
    wide = {name: value.astype(np.float64) for name, value in weights.items()}

    def softmax(s):
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return block(wide, tokens, np.matmul, softmax, np.add)


def run_policy(policy: str, weights, tokens, expected: np.ndarray) -> dict:
    scheduler = MixedPrecisionScheduler(policy)
    weight_ids = {id(weights[name]): name for name in ("wq", "wk", "wv", "wo", "w1", "w2")}
    stored_weights: dict[str, int] = {}
    activation_peak = 0

    def call(op, *inputs, **options):
        nonlocal activation_peak
        result = scheduler.run(op, *inputs, **options)
        weight = weight_ids.get(id(inputs[-1])) if op == "MatMul" else None
        weight_bytes = result.input_bytes[-1] if weight else 0
        if weight is not None:
            stored_weights[weight] = weight_bytes
        activation_peak = max(activation_peak,
                              result.stored_bytes - weight_bytes + result.output_bytes)
        return result.output

    start = time.perf_counter()
    out = block(weights, tokens, lambda a, b: call("MatMul", a, b),
                lambda s: call("Softmax", s), lambda a, b: call("Add", a, b))
    seconds = time.perf_counter() - start
    embedding_bytes = weights["embedding"].size * (4 if policy == "float32" else 2)
    diff = np.abs(out.astype(np.float64) - expected)
    return {"policy": policy, "weights_bytes": sum(stored_weights.values()) + embedding_bytes,
            "matmul_weights_bytes": sum(stored_weights.values()),
            "activations_peak_bytes": int(activation_peak),
            "max_rel_error": float(diff.max() / np.abs(expected).max()),
            "mean_rel_error": float(diff.mean() / np.abs(expected).mean()),
            "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="sim", help="sim, torch:cpu or torch:cuda")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        npumem.init(backend=args.device)
    except npumem.AclError as error:
        parser.error(error.message)
    npumem.set_device(0)
    weights = make_weights()
    tokens = np.random.default_rng(1).integers(0, VOCAB, SEQ)
    expected = reference(weights, tokens)
    rows = []
    if args.device.startswith("torch"):           # first calls pay for torch's start-up
        run_policy("float32", weights, tokens, expected)
    for policy in POLICIES:
        row = run_policy(policy, weights, tokens, expected)
        seconds = row.pop("seconds")
        row["latency_ms"] = seconds * 1e3 if args.device.startswith("torch") else None
        rows.append(row)
    npumem.reset_device(0)
    if args.json:
        print(json.dumps(rows))
        return
    base = rows[0]
    print(f"device {args.device}; block: seq {SEQ}, dim {DIM}, hidden {HIDDEN}, vocab {VOCAB}")
    print(f"{'policy':<9} {'weights':>10} {'x fp32':>7} {'matmul w':>10} {'x fp32':>7} "
          f"{'act peak':>10} {'x fp32':>7} {'max rel err':>12} {'mean rel err':>12} {'latency ms':>10}")
    for row in rows:
        latency = "-" if row["latency_ms"] is None else f"{row['latency_ms']:.1f}"
        print(f"{row['policy']:<9} {row['weights_bytes']:>10} "
              f"{row['weights_bytes'] / base['weights_bytes']:>7.2f} {row['matmul_weights_bytes']:>10} "
              f"{row['matmul_weights_bytes'] / base['matmul_weights_bytes']:>7.2f} "
              f"{row['activations_peak_bytes']:>10} "
              f"{row['activations_peak_bytes'] / base['activations_peak_bytes']:>7.2f} "
              f"{row['max_rel_error']:>12.2e} {row['mean_rel_error']:>12.2e} {latency:>10}")


if __name__ == "__main__":
    main()
