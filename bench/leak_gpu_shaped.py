"""The leak table (tests/leak_patterns.py) on GPU-shaped snapshots, without a GPU: each
pattern runs under `npumem estimate` on the default device "cuda" (a fake H100), and its
predicted.pickle is judged as report judges any snapshot. Prints, per pattern, the growth per
step found, where, and on which steps; leaking patterns are scored against the CPU truth.

    python bench/leak_gpu_shaped.py [OUT_DIR]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SCRIPT = """import sys
sys.path.insert(0, {root!r})
import torch
torch.set_default_device("cuda")
from tests import leak_patterns as p
kept = p.{name}({args})
"""


def main(out: str) -> int:
    from npumem.cli.common import load_as_snapshot
    from npumem.profile.leak_analysis import analyze_leaks
    from tests import leak_patterns as patterns

    os.makedirs(out, exist_ok=True)
    failures = 0
    for program in patterns.LEAKING + patterns.CLEAN:
        name, leaking = program.__name__, program in patterns.LEAKING
        script = os.path.join(out, f"{name}.py")
        with open(script, "w") as handle:
            handle.write(SCRIPT.format(root=ROOT, name=name, args="True" if leaking else ""))
        folder = os.path.join(out, name)
        done = subprocess.run([sys.executable, "-m", "npumem", "estimate", "--gpu", "h100",
                               "--force", "--out", folder, "--", script],
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{name}: estimate failed: {done.stderr.strip()[-300:]}")
            failures += 1
            continue
        analysis = analyze_leaks(load_as_snapshot(os.path.join(folder, "predicted.pickle")))
        found = sum(leak.per_step for leak in analysis.leaks)
        users = all("leak_patterns.py" in leak.where for leak in analysis.leaks)
        if leaking:
            truth = patterns.record(program, True)[1]
            ok = bool(analysis.leaks) and users and abs(found - truth) <= 0.25 * truth
            print(f"leak  {name:34} truth {truth:7.0f} B/step  found {found:7.0f}  "
                  f"{'ok' if ok else 'MISSED'}  [{analysis.verdict(0)[:50]}]")
        else:
            ok = not analysis.leaks
            print(f"clean {name:34} {len(analysis.leaks)} leak(s)  {'ok' if ok else 'FALSE ALARM'}"
                  f"  [{analysis.verdict(0)[:50]}]")
        failures += not ok
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="leak_gpu_")))
