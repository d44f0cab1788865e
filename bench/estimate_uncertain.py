"""Does `npumem estimate` report every data-dependent decision, and nothing else? Each script
below marks the lines that decide on a value only a GPU computes with `# DECIDES`; the bench
estimates each (no GPU) and prints the lines found, missed and reported without a mark, and
the exit status (3: uncertain, 0: certain).

    python bench/estimate_uncertain.py [NAME ...]

The scripts were written before the rules were checked against them; add held-out ones in
the same form (a name and its source) to score the rules out of sample.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))

SCRIPTS = {
    "early_stop": """
        import torch
        model = torch.nn.Linear(512, 512).cuda()
        for step in range(20):
            loss = model(torch.randn(256, 512, device="cuda")).square().mean()
            loss.backward()
            if loss.item() < 0.01:                               # DECIDES
                break
    """,
    "nan_guard": """
        import torch
        x = torch.randn(1024, 1024, device="cuda", requires_grad=True)
        loss = (x @ x).mean()
        if torch.isnan(loss):                                    # DECIDES
            raise SystemExit("nan")
        loss.backward()
    """,
    "size_from_numpy": """
        import torch
        scores = torch.randn(4096, 256, device="cuda")
        top = int(scores.cpu().numpy().max() * 1000)             # DECIDES
        buffer = torch.empty(top + 1, 1024, device="cuda")
    """,
    "count_loop": """
        import torch
        tokens = torch.randint(0, 2, (64, 1024), device="cuda")
        n = tokens.sum().item()
        for _ in range(n):                                       # DECIDES
            pass
    """,
    "mask_all": """
        import torch
        done = False
        x = torch.randn(8192, 64, device="cuda")
        while not done:
            x = x * 0.5
            done = (x.abs() < 1e-3).all().item()                 # DECIDES
    """,
    "tensor_compare": """
        import torch
        x = torch.randn(8192, 512, device="cuda")
        if x.max() > 3:                                          # DECIDES
            y = torch.empty(1 << 30, device="cuda")
    """,
    "tolist_branch": """
        import torch
        logits = torch.randn(64, 1000, device="cuda")
        classes = logits.argmax(-1).tolist()
        if classes[0] == 7:                                      # DECIDES
            extra = torch.empty(1 << 28, device="cuda")
    """,
    "best_accuracy": """
        import torch
        best = 0.0
        model = torch.nn.Linear(256, 10).cuda()
        for epoch in range(3):
            preds = model(torch.randn(4096, 256, device="cuda")).argmax(-1).cpu().numpy()
            accuracy = (preds == 3).mean()
            if accuracy > best:                                  # DECIDES
                best = accuracy
    """,
    "device_draw": """
        import torch
        if torch.rand(1, device="cuda").item() < 0.5:            # DECIDES
            extra = torch.empty(1 << 28, device="cuda")
    """,
    "prints_only": """
        import torch
        model = torch.nn.Linear(1024, 1024).cuda()
        for step in range(3):
            loss = model(torch.randn(512, 1024, device="cuda")).square().mean()
            loss.backward()
            print(f"step {step}: {loss.item():.4f} {float(loss.detach().cpu()):.4f}")
    """,
}


def marked_lines(source: str) -> set[int]:
    return {number for number, line in enumerate(source.splitlines(), 1) if "# DECIDES" in line}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(SCRIPTS))
    args = parser.parse_args()
    unknown = [name for name in args.names if name not in SCRIPTS]
    if unknown:
        parser.error(f"no script named {', '.join(unknown)} (there are: {', '.join(SCRIPTS)})")
    found = missed = extra = 0
    print(f"{'script':18} {'exit':>4}  found  missed  unmarked")
    with tempfile.TemporaryDirectory() as folder:
        for name in args.names or SCRIPTS:
            source = textwrap.dedent(SCRIPTS[name])
            path = os.path.join(folder, f"{name}.py")
            with open(path, "w") as handle:
                handle.write(source)
            done = subprocess.run([sys.executable, "-m", "npumem", "estimate", "--json", "--", path],
                                  capture_output=True, text=True, cwd=folder, timeout=600)
            try:
                reported = {d["line"] for d in json.loads(done.stdout).get("uncertain", [])}
            except json.JSONDecodeError:
                print(f"{name:18} {done.returncode:>4}  failed: {done.stderr.strip()[-200:]}")
                continue
            wanted = marked_lines(source)
            found += len(wanted & reported)
            missed += len(wanted - reported)
            extra += len(reported - wanted)
            print(f"{name:18} {done.returncode:>4}  {sorted(wanted & reported)!s:6} "
                  f"{sorted(wanted - reported)!s:7} {sorted(reported - wanted)}", flush=True)
    print(f"decisions found {found}, missed {missed}; reported without a mark {extra}")


if __name__ == "__main__":
    main()
