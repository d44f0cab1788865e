"""pytest plugin (registered as `npumem` through the pytest11 entry point):

    @pytest.mark.limit_device_memory("64 MiB")   # fail if the test's allocations peak above it
    @pytest.mark.no_device_leaks                 # fail if the test leaves device memory allocated

Both count device memory allocated through npumem (pools and runtime malloc) while the test
body runs; memory a pool keeps cached is not counted. The limit is compared with the bytes the
test asked for (a pool rounds blocks up; the report gives both). Leaks are checked after queued
stream work has finished and garbage is collected, and are reported with the file and line that
allocated. A marker with a bad argument stops the run at collection, with a sentence.
"""

from __future__ import annotations

import pytest

MARKERS = (
    "limit_device_memory(limit): fail when device memory allocated through npumem during the "
    "test peaks above limit (bytes or a size string such as '64 MiB')",
    "no_device_leaks: fail when device memory allocated through npumem during the test is still "
    "allocated at its end",
)


def pytest_configure(config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)


def pytest_collection_modifyitems(items) -> None:
    for item in items:               # bad marker arguments: a usage error before anything runs
        _limit(item)


def _limit(item) -> int | None:
    marker = item.get_closest_marker("limit_device_memory")
    if marker is None:
        return None
    from ..units import parse_size

    if len(marker.args) != 1 or marker.kwargs:
        raise pytest.UsageError(f"{item.nodeid}: use @pytest.mark.limit_device_memory('64 MiB')")
    try:
        return parse_size(marker.args[0])
    except ValueError as exc:
        raise pytest.UsageError(f"{item.nodeid}: limit_device_memory: {exc}") from None


def _peak_requested(tracker) -> dict[int, tuple[int, int]]:
    """{device: (peak bytes asked for, block bytes allocated at that moment)}."""
    live: dict[tuple[int, int], tuple[int, int]] = {}
    asked: dict[int, list[int]] = {}
    peaks: dict[int, tuple[int, int]] = {}
    for event in tracker.events():
        totals = asked.setdefault(event.device, [0, 0])
        if event.action == "alloc":
            live[(event.device, event.address)] = (event.requested, event.size)
            totals[0] += event.requested
            totals[1] += event.size
            if totals[0] > peaks.get(event.device, (-1, 0))[0]:
                peaks[event.device] = (totals[0], totals[1])
        elif event.action in ("free", "free_requested"):
            requested, size = live.pop((event.device, event.address), (0, 0))
            totals[0] -= requested
            totals[1] -= size
    return peaks


def _over_limit_report(tracker, peaks: dict[int, tuple[int, int]], limit: int) -> str:
    from ..units import format_size
    from .analysis import analyze_trace
    from .snapshot import device_traces

    lines = []
    traces = device_traces(tracker)
    for device, (requested, blocks) in sorted(peaks.items()):
        if requested <= limit:
            continue
        lines.append(f"device {device}: peak {format_size(requested)} asked for through npumem "
                     f"({format_size(blocks)} in pool blocks) exceeds the {format_size(limit)} "
                     f"limit by {format_size(requested - limit)}; live at the peak:")
        if device < len(traces) and traces[device]:
            lines += [f"  {format_size(site.bytes):>12} in {site.count} allocation(s) at {site.where}"
                      for site in analyze_trace(device, traces[device]).at_peak[:10]]
    return "\n".join(lines)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    limit = _limit(item)
    check_leaks = item.get_closest_marker("no_device_leaks") is not None
    if limit is None and not check_leaks:
        return (yield)
    from .leaks import settle
    from .tracker import Tracker

    tracker = Tracker(stacks=True, torch_memory=False).start()
    try:
        result = yield                 # a test that fails on its own raises here: reported as is
    finally:
        if check_leaks:
            settle()
        tracker.stop()
    problems = []
    if limit is not None:
        peaks = _peak_requested(tracker)
        if any(requested > limit for requested, _ in peaks.values()):
            problems.append(_over_limit_report(tracker, peaks, limit))
    if check_leaks:
        leaks = tracker.leaks()
        if leaks:
            problems.append("device memory leaked by the test:\n" + leaks.format())
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
    return result
