"""The leak analysis of a recording: the one that `report` (text and --json), `profile`, `tune`,
`estimate` and the viewer's "Leaks and steps" panel all show, so that no two of them tell a
user different stories.

    from npumem.profile.leak_analysis import analyze_leaks

    analysis = analyze_leaks(snapshot)        # a PyTorch-format snapshot dict
    analysis.lines()                          # the text report's section
    analysis.to_json()                        # {"steps": {...}, "leaks": [...]}

Steps come from the run's marks, else are inferred where the recording repeats a step, else
there are none and leaks are not judged (`steps`). A leak is a site whose live bytes at the
step boundaries rise as a trend (`step_leaks`, `trend`); each claim says whether the steps it
rests on were inferred.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..units import format_size
from .step_leaks import StepLeak, step_leaks
from .step_inference import find_steps
from .steps import NO_STEPS, Steps
from .trend import MIN_POINTS


@dataclass
class LeakAnalysis:
    """Each traced device's steps, and the leaks found on them, fastest first."""

    steps: dict[int, Steps] = field(default_factory=dict)
    leaks: list[StepLeak] = field(default_factory=list)

    def judged(self, device: int) -> bool:
        steps = self.steps.get(device)
        return steps is not None and len(steps.starts) >= MIN_POINTS

    @property
    def any_judged(self) -> bool:
        return any(self.judged(device) for device in self.steps)

    def verdict(self, device: int) -> str:
        """One line on a device's steps and what they allow."""
        steps = self.steps[device]
        if not steps.starts:
            return steps.reason or NO_STEPS
        if not self.judged(device):
            return (f"{steps.describe()}: too few to judge leaks (a trend needs "
                    f"{MIN_POINTS} step boundaries)")
        return f"judged at the boundaries of {steps.describe()}"

    def headline(self) -> str | None:
        """The fastest leak in one sentence (tune says it first), or None."""
        if not self.leaks:
            return None
        leak = self.leaks[0]
        inferred = " (steps inferred)" if leak.inferred else ""
        total = sum(other.per_step for other in self.leaks if other.device == leak.device)
        if total <= leak.per_step * 1.001:
            return f"the run grows by {format_size(leak.per_step)} a step at {leak.where}{inferred}"
        return (f"the run grows by {format_size(total)} a step{inferred}, "
                f"{format_size(leak.per_step)} of it at {leak.where}")

    def lines(self, limit: int = 10) -> list[str]:
        """The text report's leak section, without its heading."""
        out = []
        for device in sorted(self.steps):
            prefix = f"device {device}: " if len(self.steps) > 1 else ""
            out.append(f"{prefix}{self.verdict(device)}")
        if self.any_judged and not self.leaks:
            out.append("no leak: nothing grew step over step")
        for leak in self.leaks[:limit]:
            out.append(leak.describe())
            t = leak.trend
            if t is not None:
                shown = ", ".join(format_size(v) for _, v in leak.series[:6])
                out.append(f"    evidence: live at the step boundaries {shown}"
                           f"{', ...' if len(leak.series) > 6 else ''} "
                           f"({len(leak.series)} in --json); "
                           f"growth per step {format_size(max(t.low, 0))} to "
                           f"{format_size(t.high)} (95%), p={t.p_value:.2g}, "
                           f"confidence {t.confidence}")
            out += [f"    called from {frame}" for frame in leak.stack[:8]]
        if len(self.leaks) > limit:
            out.append(f"... and {len(self.leaks) - limit} more growing site(s)")
        return out

    def to_json(self) -> dict:
        devices = sorted(self.steps)
        main = next((d for d in devices if self.steps[d].starts), devices[0] if devices else None)
        steps = self.steps[main].to_json() if main is not None else {
            "count": 0, "source": None, "marker": None, "reason": "the recording has no trace"}
        steps["judged"] = main is not None and self.judged(main)
        if main is not None:
            steps["device"] = main
        out = {"steps": steps, "leaks": [leak.to_json() for leak in self.leaks]}
        if len(devices) > 1:
            out["steps_by_device"] = {str(d): dict(self.steps[d].to_json(),
                                                   judged=self.judged(d)) for d in devices}
        return out


def analyze_leaks(snapshot: dict, devices: list[int] | None = None) -> LeakAnalysis:
    """The leak analysis of `snapshot` (PyTorch's snapshot format, as npumem reads any trace),
    over `devices` (default: every device with a trace). The public entry point."""
    traces = snapshot.get("device_traces") or []
    if devices is None:
        devices = [d for d, trace in enumerate(traces) if len(trace)]
    analysis = LeakAnalysis()
    for device in devices:
        steps = find_steps(snapshot, device)
        analysis.steps[device] = steps
        if len(steps.starts) >= MIN_POINTS:
            analysis.leaks += step_leaks(snapshot, device, steps)
    analysis.leaks.sort(key=lambda leak: (-leak.per_step, leak.where))
    return analysis


def analyze_recording(recording) -> LeakAnalysis:
    """The leak analysis of a `Recording` (one device's entries and annotations, as replay and
    tune load a trace): the same as `analyze_leaks` of the snapshot it came from."""
    device = getattr(recording, "device", 0) or 0
    traces: list = [[] for _ in range(device)] + [recording.entries]
    return analyze_leaks({"device_traces": traces,
                          "external_annotations": list(recording.annotations or [])}, [device])
