"""The lines that end a test run that skipped tests: each group skipped, what its tests need, and
the command that runs them (conftest.py's pytest_terminal_summary prints them).

Without it, `python -m pytest` on a fresh clone said "396 skipped" and no more: a user could
not tell a missing PyTorch (one command away) from the maintainers' own data (not theirs to
have)."""

from __future__ import annotations

from collections import Counter

CPU_TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"

# (words one of which the skip reason holds, what the tests need, how to run them); first match
GROUPS = (
    (("could not import 'torch'", "no module named 'torch'"),
     "needing PyTorch, which is not installed",
     f"{CPU_TORCH} && python -m pytest   (the CPU wheel: no CUDA packages)"),
    (("../shared",),
     "reading real users' recordings in ../shared, a folder beside the repository that "
     "a clone does not have",
     "nothing to install: tests/data holds the recordings a clone is tested with"),
    (("a gpu is recorded instead", "this machine has a gpu"),
     "testing what a machine without a GPU does, and this one has a GPU",
     "nothing to install: they run on a machine without one"),
    (("no cuda", "cuda gpu", " devices", "is not available here"),
     "needing a CUDA GPU (or two devices)",
     "python -m pytest on a machine with an NVIDIA GPU and PyTorch for CUDA"),
    (("chromium", "chromedriver", "selenium", "node.js"),
     "driving `npumem view` in a browser, which is not installed here",
     "apt-get install chromium chromium-driver nodejs && python -m pytest tests/test_view*.py"),
    (("not built", "g++"),
     "needing npumem's C extensions, which were not built (no C compiler at install)",
     "install gcc and Python's headers, then pip install -e \".[test]\""),
)


def _reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr or "")


def summary_lines(reports) -> list[str]:
    """One line per group of skipped tests, largest first: count, what they need, the command
    (a reason no group knows is a group of its own, said as it is)."""
    counted: Counter = Counter()
    for report in reports:
        reason = _reason(report)
        lowered = reason.lower()
        group = next(((need, run) for words, need, run in GROUPS
                      if any(word in lowered for word in words)), None)
        counted[group or (reason, "")] += 1
    lines = []
    for (need, run), count in counted.most_common():
        lines.append(f"{count} skipped, {need}: {run}" if run else f"{count} skipped: {need}")
    return lines
