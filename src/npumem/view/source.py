"""One opened input: the loaded snapshot, the device shown, its precomputed `Series`, its time
axis, and what /api/info says of it (OOM, steps, annotations, segments).

Time axis: the trace's time stamps (microseconds, as recorded) where it has them, made
non-decreasing (a trace's clock need not rise in entry order; each entry is placed at the
latest time seen so far), else the entry number ("entry").
"""

from __future__ import annotations

import threading

import numpy as np

from ..trace.snapshot.columns import SEGMENT_ADD, arrays, having
from .series import Series
from .errors import SourceError
from .sources import Loaded

ANNOTATIONS_SHOWN = 5000          # annotations /api/info lists at most
STEPS_SHOWN = 20000


class Source:
    def __init__(self, number: int, loaded: Loaded, device: int | None = None):
        from ..profile.analysis import start_of
        from ..trace import TraceFormatError
        from ..trace.snapshot import recording_from_data

        self.id, self.loaded = number, loaded
        self.path, self.kind, self.data = loaded.path, loaded.kind, loaded.data
        try:
            self.recording = recording_from_data(self.data, loaded.file, device)
        except TraceFormatError as exc:
            raise SourceError(str(exc)) from None
        self.device = self.recording.device
        # an allocation of more than any device holds: the file is damaged or made up, and
        # no curve drawn from it would mean anything (replay and plan refuse it too)
        self.recording.refuse_if_damaged()
        traces = self.data.get("device_traces") or []
        self.entries = traces[self.device] if self.device < len(traces) else []
        start_live, start_reserved = start_of(self.data, self.device) if len(self.entries) \
            else ([], 0)
        self.series = Series(self.entries, start_live, start_reserved)
        self.a = arrays(self.entries)
        times = self.a.time if len(self.a) else np.zeros(0)
        self.timed = bool(len(times)) and bool(np.any(times != times[0])) and \
            bool(np.all(np.isfinite(times)))
        if self.timed and not np.all(times[1:] >= times[:-1]):
            times = np.maximum.accumulate(times)      # (a copy only where the clock fell back)
        self.times = times if self.timed else None
        self.offset = 0.0          # added to this source's times to put it on the shared axis
        self.origin = 0.0          # the recorded time at 0 on that axis
        self.lock = threading.Lock()       # what is made on first use (flame names)
        self.analysis_lock = threading.Lock()     # the leak analysis (seconds, made once)
        self.extras: dict = {}
        self._info = self._describe()

    # --- the axis ---------------------------------------------------------------------------

    @property
    def time_unit(self) -> str:
        return "us" if self.timed else "entry"

    def t_of(self, positions) -> np.ndarray:
        """The axis value of entry positions (on the shared axis)."""
        positions = np.asarray(positions, dtype=np.int64)
        if self.times is None:
            return positions.astype(np.float64) + self.offset
        return self.times[np.clip(positions, 0, max(self.series.n - 1, 0))] + self.offset

    def positions_before(self, t) -> np.ndarray:
        """For each axis value, how many entries lie at or before it."""
        t = np.asarray(t, dtype=np.float64) - self.offset
        if self.times is None:
            return np.clip(np.floor(t) + 1, 0, self.series.n).astype(np.int64)
        return np.searchsorted(self.times, t, "right").astype(np.int64)

    def position_at(self, t: float) -> int:
        """The last entry at or before `t` (-1: before the first)."""
        return int(self.positions_before([t])[0]) - 1

    @property
    def t_range(self) -> tuple[float, float]:
        n = self.series.n
        if not n:
            return self.offset, self.offset
        return float(self.t_of([0])[0]), float(self.t_of([n - 1])[0])

    # --- /api/info --------------------------------------------------------------------------

    def info(self) -> dict:
        t_min, t_max = self.t_range
        steps = self._steps()
        info = dict(self._info, t_min=t_min, t_max=t_max, t_origin=self.origin,
                    time_unit=self.time_unit,      # (two sources may both go by entry)
                    steps=[dict(step, t=t) for step, t in
                           zip(steps, self.t_of([step["entry"] for step in steps]).tolist())],
                    steps_pending=self.extras.get("analysis") is None,
                    annotations=[
                        dict(note, t=float(self.t_of([note["entry"]])[0]) if "entry" in note
                             else note["t"] + self.offset)
                        for note in self._info["annotations"]
                        if "entry" in note or self.timed])
        if info["peak_entry"] is not None:
            info["peak_t"] = float(self.t_of([info["peak_entry"]])[0])
        if info["oom"] is not None:
            info["oom"] = dict(info["oom"], t=float(self.t_of([info["oom"]["entry"]])[0]))
            explained = self.extras.get("oom_explanation")
            if explained is not None:
                info["oom"]["explanation"] = explained
            info["oom"]["explanation_pending"] = explained is None
        return info

    def _describe(self) -> dict:
        from ..whatif.torch_replay import device_total

        s = self.series
        segments = [int(x) for x in s.segment_positions]
        adds = int(np.count_nonzero(having(self.a.action[s.segment_positions], *SEGMENT_ADD))) \
            if segments else 0
        host = any(key in self.data for key in ("host_segments", "host_traces"))
        return {
            "id": self.id, "path": self.path, "kind": self.kind, "file": self.loaded.file,
            "device": self.device, "entries": s.n, "time_unit": self.time_unit,
            "device_total": device_total(self.recording),
            "has_active": s.has_active,
            "categories": [c.name for c in s.categories],
            "segments": len(self.recording.segments), "segment_events": adds,
            "oom": self._oom(), "annotations": self._annotations(),
            "host": host, "flavour": self.recording.flavour,
            "usage": bool(self.loaded.usage),
            "devices": [number for number, trace in
                        enumerate(self.data.get("device_traces") or []) if len(trace)],
            "notes": list(self.loaded.notes) + list(self.data.get("npumem_notes") or [])
            + list(self.recording.read_notes),
            "peak_allocated": int(s.allocated.values.max()) if s.n else 0,
            # the report's peak: the first entry at the highest allocated (its moment is the
            # report's "live at the allocated peak")
            "peak_entry": int(np.argmax(s.allocated.values)) if s.n else None,
            "peak_reserved": int(s.reserved.values.max()) if s.n else 0,
        }

    def _oom(self) -> dict | None:
        from ..trace.snapshot import first_oom
        from ..trace.snapshot.schema import oom_device_free
        from ..units import format_size

        index = first_oom(self.entries) if len(self.entries) else None
        if index is None:
            return None
        entry = self.entries[index]
        message = (f"out of memory at trace entry {index}: asked for "
                   f"{format_size(entry.get('size', 0))} on stream {entry.get('stream', 0)}, "
                   f"the driver reported {format_size(oom_device_free(entry))} free")
        return {"entry": index, "message": message, "explanation": ""}

    def _steps(self) -> list[dict]:
        """The steps, once the background analysis (panels.analyze_later) has found them."""
        analysis = self.extras.get("analysis")
        if analysis is None:
            return []
        steps = analysis["steps"]
        return [{"entry": int(at), "label": f"step {number}", "source": steps["source"]}
                for number, at in enumerate(steps["starts"][:STEPS_SHOWN])]

    def _annotations(self) -> list[dict]:
        """The snapshot's external annotations, and 2.14's `annotate` trace entries (their
        user_metadata is the note)."""
        from ..trace.snapshot.columns import ACTION_CODE

        out = []
        notes = np.flatnonzero(self.a.action == ACTION_CODE["annotate"])[:ANNOTATIONS_SHOWN] \
            if len(self.a) else []
        for at in (notes.tolist() if len(notes) else []):
            extra = self.a.extras[int(self.a.extra[at])]
            text = extra.get("user_metadata") if isinstance(extra, dict) else None
            out.append({"t": float(self.times[at]) if self.times is not None else float(at),
                        "label": str(text or "annotate"), "entry": at})
        for note in self.recording.annotations[:ANNOTATIONS_SHOWN]:
            when = note.get("time_us")
            if not isinstance(when, (int, float)) or isinstance(when, bool):
                continue
            if self.times is None:                # an entry axis: the first entry at or after
                continue
            stage = note.get("stage")
            name = str(note.get("name", ""))
            if name == "npumem.memory.step" and isinstance(note.get("source"), str) and \
                    note["source"]:       # a profile's step, named by what marked it, as the
                name = note["source"]     # report names it ("marked by optimizer.step")
            out.append({"t": float(when), "label": name +
                        (f" ({str(stage).lower()})" if stage else "")})
        return out

    def explain_oom_later(self) -> None:
        """The report's OOM explanation (a replay under each setting tune knows), made in the
        background: too slow to hold the first view for on a long trace."""
        if self._info["oom"] is None:
            return

        def work():
            from ..profile.oom import explain_oom
            try:
                lines = explain_oom(self.data, self.loaded.file)
            except Exception as exc:        # shown on the page; the server goes on
                lines = [f"the out-of-memory could not be explained: {exc}"]
            self.extras["oom_explanation"] = "\n".join(lines)

        threading.Thread(target=work, name="npumem-view-oom", daemon=True).start()
