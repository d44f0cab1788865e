"""pytest plugin (registered as `npumem` through the pytest11 entry point):

    @pytest.mark.limit_device_memory("64 MiB")   # fail if the test's allocations peak above it
    @pytest.mark.no_device_leaks                 # fail if the test leaves device memory allocated

Both count device memory allocated through npumem (pools and runtime malloc) while the test
body runs; memory a pool keeps cached is not counted. Leaks are checked after queued stream work
has finished and garbage is collected, and are reported with the file and line that allocated.
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


def _over_limit_report(tracker, limit: int) -> str:
    from ..units import format_size
    from .analysis import analyze_trace
    from .snapshot import device_traces

    lines = []
    for device, entries in enumerate(device_traces(tracker)):
        if not entries:
            continue
        result = analyze_trace(device, entries)
        if result.peak_allocated <= limit:
            continue
        lines.append(f"device {device}: peak {format_size(result.peak_allocated)} allocated through "
                     f"npumem exceeds the {format_size(limit)} limit by "
                     f"{format_size(result.peak_allocated - limit)}; live at the peak:")
        lines += [f"  {format_size(site.bytes):>12} in {site.count} allocation(s) at {site.where}"
                  for site in result.at_peak[:10]]
    return "\n".join(lines)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    limit = _limit(item)
    check_leaks = item.get_closest_marker("no_device_leaks") is not None
    if limit is None and not check_leaks:
        yield
        return
    from .leaks import settle
    from .tracker import Tracker

    tracker = Tracker(stacks=True).start()
    try:
        outcome = yield
    finally:
        if check_leaks:
            settle()
        tracker.stop()
    if outcome.excinfo is not None:        # the test failed on its own: report that
        return
    problems = []
    if limit is not None and tracker.peak_allocated() > limit:
        problems.append(_over_limit_report(tracker, limit))
    if check_leaks:
        leaks = tracker.leaks()
        if leaks:
            problems.append("device memory leaked by the test:\n" + leaks.format())
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
