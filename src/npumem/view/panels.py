"""The side panels: steps and leaks from the one analysis `npumem report` uses
(profile.leak_analysis and the report's own choice of what to list), msprof's component
totals, and PyTorch 2.14's pinned host memory."""

from __future__ import annotations

from .source import Source

LEAKS_SHOWN = 50


def analyze_later(source: Source) -> None:
    """Steps and leaks (the report's analysis, the step inference included), then the OOM's
    explanation, in the background: the first view does not wait for them."""
    import threading

    def work():
        try:
            steps_of(source)
        except Exception as exc:          # the leaks route says it; the server goes on
            source.extras["analysis"] = {
                "steps": {"starts": [], "source": None, "describe": str(exc)}, "rows": [],
                "heading": f"the leak analysis failed: {type(exc).__name__}: {exc}",
                "growing": [], "lines": [], "json": None}
        source.explain_oom_later()

    threading.Thread(target=work, name="npumem-view-analysis", daemon=True).start()


def steps_of(source: Source) -> dict:
    """{"starts": [entry positions], "source": "marked"|"inferred"|None, "describe": str},
    found once per source, as the report finds them (with the leaks, where one analysis
    finds both)."""
    return _analysis(source)["steps"]


def _analysis(source: Source) -> dict:
    known = source.extras.get("analysis")
    if known is not None:
        return known
    with source.analysis_lock:
        known = source.extras.get("analysis")
        if known is None:
            known = source.extras["analysis"] = _analyze(source)
    return known


def _analyze(source: Source) -> dict:
    """The report's leak analysis of the device shown (profile.leak_analysis, the one `report`,
    `tune` and `diff` use): its steps, its growing sites, and the list the report prints under
    its leak heading, with the heading (the report's own choice, report._snapshot_leaks)."""
    from ..profile import report
    from ..profile.leak_analysis import analyze_leaks

    if not len(source.entries):
        return {"steps": {"starts": [], "source": None, "describe": "the recording has no trace"},
                "rows": [], "heading": "", "growing": [], "lines": [], "json": None}
    data = _one_device(source)
    analysis = analyze_leaks(data, [source.device])
    steps = analysis.steps.get(source.device)
    rows, heading, growing = report._snapshot_leaks(data, analysis)
    found = {"starts": [int(x) for x in steps.starts] if steps else [],
             "source": steps.source if steps else None,
             "describe": steps.describe() if steps else "no steps"}
    return {"steps": found, "rows": rows, "heading": heading, "growing": growing,
            "lines": analysis.lines(LEAKS_SHOWN), "json": analysis.to_json()}


def leaks(source: Source) -> dict:
    """What the report lists under its leak heading for this device, with the steps it judged
    them over and the live bytes at each step against the first."""
    from ..profile.step_leaks import growth_per_step

    found = _analysis(source)
    steps = found["steps"]
    starts = steps["starts"]
    return {
        "heading": found["heading"],
        "lines": found["lines"],
        "steps": {"count": len(starts), "source": steps["source"], "describe": steps["describe"],
                  "t": source.t_of(starts).tolist() if starts else [],
                  "growth": growth_per_step(_one_device(source), source.device, starts)
                  if starts else []},
        "growing": [_leak_json(source, leak) for leak in found["growing"][:LEAKS_SHOWN]],
        "sites": [{"where": row.where, "count": row.count, "bytes": row.bytes,
                   "callers": row.callers[:8]} for row in found["rows"][:LEAKS_SHOWN]],
        "more_sites": max(0, len(found["rows"]) - LEAKS_SHOWN),
        "analysis": found["json"],
    }


def _leak_json(source: Source, leak) -> dict:
    """A growing site as the report's JSON has it, with the report's line."""
    row = leak.to_json()
    row["describe"] = leak.describe()
    return row


def _one_device(source: Source) -> dict:
    """The snapshot with only the device shown (the report's --device cut)."""
    data = source.data
    traces = data.get("device_traces") or []
    return {**data, "device_traces": [trace if index == source.device else []
                                      for index, trace in enumerate(traces)],
            "segments": [s for s in data.get("segments") or []
                         if s.get("device", 0) == source.device]}


def host(source: Source) -> dict:
    from .host import host_memory

    return host_memory(source)


MB = 1 << 20


def usage(source: Source) -> dict:
    """msprof's memory_record.csv beside the operators: each component's (PTA, GE, APP, ...)
    allocated and reserved bytes over time, on the timeline's axis; {"curves": []} where
    there is none. These are the totals the NPU's allocators kept, which the operators'
    allocations alone do not tell (no segments)."""
    from ..trace import TraceFormatError
    from ..trace.msprof import usage_curves

    path = source.loaded.usage
    if not path:
        return {"curves": [], "file": None}
    try:
        curves = usage_curves(path)
    except TraceFormatError as exc:
        return {"curves": [], "file": path, "error": str(exc)}
    out = []
    for (component, device), samples in curves.items():
        timed = [row for row in samples if row[0] is not None]
        out.append({"component": component, "device": device,
                    "t": [row[0] + source.offset for row in timed],
                    "allocated": [None if row[1] is None else int(row[1] * MB) for row in timed],
                    "reserved": [None if row[2] is None else int(row[2] * MB) for row in timed]})
    return {"curves": out, "file": path}
