"""Where the benchmarks find their inputs: ../shared/data when it is beside the repository,
else the real recordings the tests ship (tests/data/cuda_snapshots), so every bench runs on a
fresh clone. Each bench prints which set it used."""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
BUNDLED = ROOT / "tests" / "data" / "cuda_snapshots"


def traces() -> list[str]:
    """Allocation traces: ../shared/data/traces, else the bundled CUDA recordings."""
    shared = sorted(str(p) for p in (SHARED / "traces").glob("*.jsonl.gz"))
    chosen = shared or sorted(str(p) for p in BUNDLED.glob("*.pickle.gz"))
    print(f"inputs: {'../shared/data/traces' if shared else 'tests/data/cuda_snapshots'} "
          f"({len(chosen)} traces)", file=sys.stderr)
    return chosen


def one_trace(shared_name: str, bundled_name: str) -> str:
    """A single trace: `shared_name` from ../shared, else `bundled_name` from the tests."""
    shared = SHARED / "traces" / shared_name
    path = shared if shared.is_file() else BUNDLED / bundled_name
    print(f"input: {path.relative_to(ROOT.parent) if shared.is_file() else path.relative_to(ROOT)}",
          file=sys.stderr)
    return str(path)


def planning_problems() -> list[str]:
    """Planning problems: ../shared/data/dsa (but the very large iopddl ones), else the bundled
    recordings, whose lifetimes `npumem plan` reads too."""
    shared = sorted(str(p) for p in (SHARED / "dsa").glob("*.csv") if "iopddl" not in p.name)
    if shared:
        return shared
    print("inputs: tests/data/cuda_snapshots (../shared/data/dsa is absent)", file=sys.stderr)
    return sorted(str(p) for p in BUNDLED.glob("*.pickle.gz"))
