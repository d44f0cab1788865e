"""Figures a report shows must mean what they say: fragmentation counts only free bytes stranded
in segments that are partly in use, and a timeline's axis holds the peak it labels."""

from __future__ import annotations

import re

from npumem.profile.fragmentation import analyze, format_fragmentation
from npumem.profile.html import render_html
from npumem.profile.report import build_report

MiB = 1 << 20


def segment(address: int, blocks: list[tuple[int, str]]) -> dict:
    out, offset = [], address
    for size, state in blocks:
        out.append({"address": offset, "size": size, "requested_size": size, "state": state})
        offset += size
    return {"device": 0, "address": address, "total_size": offset - address, "stream": 0,
            "segment_type": "large", "allocated_size": 0, "active_size": 0, "blocks": out}


def test_empty_cached_segments_are_cached_not_fragmented():
    snapshot = {"device_traces": [], "segments": [
        segment(0x1000_0000, [(20 * MiB, "inactive")]),               # cached, whole
        segment(0x2000_0000, [(20 * MiB, "inactive")]),
        segment(0x3000_0000, [(4 * MiB, "active_allocated"), (2 * MiB, "inactive"),
                              (4 * MiB, "active_allocated"), (6 * MiB, "inactive"),
                              (4 * MiB, "active_allocated")])]}
    pool, = analyze(snapshot)
    assert (pool.cached, pool.cached_segments) == (40 * MiB, 2)
    assert (pool.stranded, pool.largest_stranded) == (8 * MiB, 6 * MiB)
    assert pool.ratio == 0.25                       # (8 - 6) / 8; the old formula said 0.83
    text = format_fragmentation([pool])
    assert "40.00 MiB cached in 2 empty segment(s)" in text
    assert "8.00 MiB stranded in partly used ones (largest piece 6.00 MiB)" in text


def test_only_cached_segments_is_no_fragmentation():
    pool, = analyze({"device_traces": [], "segments": [
        segment(0x1000_0000, [(2 * MiB, "inactive")]) for _ in range(1)] + [
        segment(0x2000_0000, [(20 * MiB, "inactive")])]})
    assert pool.ratio == 0.0 and pool.stranded == 0


def test_the_timeline_axis_holds_the_peak_it_labels():
    # entries whose clock does not rise in entry order: the peak comes at the latest time
    times = [100_000, 150_000, 90_000, 562_900, 439_000]
    entries = [{"action": "alloc", "addr": 0x100 * (i + 1), "size": MiB * (i + 1), "stream": 0,
                "time_us": t, "frames": []} for i, t in enumerate(times[:4])]
    entries.append({"action": "free_requested", "addr": 0x100, "size": MiB, "stream": 0,
                    "time_us": times[4], "frames": []})
    page = render_html(build_report({"segments": [], "device_traces": [entries]}, "t"))
    span_us = float(re.search(r'data-span="([0-9.e+]+)"', page).group(1))
    label = re.search(r"live at the peak \([^)]* at ([0-9.]+) ms\)", page)
    assert label is not None
    peak_ms = float(label.group(1))
    assert abs(peak_ms - (562_900 - 90_000) / 1000) < 1e-3       # from the earliest event
    assert peak_ms * 1000 <= span_us + 1e-6                      # inside the drawn axis
    ticks = [float(t) for t in re.findall(r'<text x="[0-9.]+" y="[0-9.]+" text-anchor="\w+">'
                                           r'([0-9.]+) ms</text>', page)]
    assert ticks and max(ticks) <= span_us / 1000 and max(ticks) >= 0.5 * peak_ms
