"""What-if: one allocator setting replayed through the model of PyTorch's allocator
(whatif.torch_replay's cores: the native model where it covers the recording), drawn as its
reserved curve over the recorded one, with tune's verdict on it.

The curve needs the model's segment events with the entry that caused each, which
`replay_recording` does not keep (it keeps peaks); so the replay is driven here, the same way
it drives it (the same core, the same start state and device limit, the same handling of
segment entries and recorded OOMs), stopping after each alloc that made segment events. The
verdict is tune's own: `tune_recording` on the recorded settings and this one.
"""

from __future__ import annotations

import numpy as np

from .errors import RequestError
from .source import Source

POINTS = 8000             # points of the replayed curve, at most (each kept point a local peak)


def check_setting(source: Source, text: str):
    """The setting parsed on top of the recording's own, as PyTorch parses it; RequestError
    (400) with the parser's message otherwise."""
    from ..alloc.torch_model import parse_config
    from ..errors import InvalidParamError

    if len(source.entries) == 0:
        raise RequestError(f"{source.path} has no trace entries to replay")
    text = text.strip()
    base = source.recording.base_config()
    try:
        return parse_config(text, base=base) if text else base
    except InvalidParamError as exc:
        raise RequestError(exc.message) from None


def run_whatif(source: Source, config, text: str, job) -> dict:
    def progress(fraction: float) -> None:
        with job.lock:
            job.progress = max(job.progress, min(fraction, 0.99))

    positions, reserved, oom, start_reserved = replay_curve(
        source, config, lambda done: progress(0.5 * done))
    verdict, answer, peak, recorded_peak = _tune_verdict(
        source, config, text, lambda done: progress(0.5 + 0.5 * done))
    t, levels = _curve(source, positions, reserved, start_reserved)
    result = {"setting": config.describe(), "t": t, "reserved": levels,
              "peak_reserved": peak, "recorded_peak_reserved": recorded_peak,
              "verdict": verdict, "answer": answer, "oom": None}
    if oom is not None:
        result["oom"] = {"t": float(source.t_of([oom["index"]])[0]), "entry": oom["index"],
                         "message": oom["message"]}
    return result


def replay_curve(source: Source, config, progress=None):
    """(entry positions, reserved bytes after each, the model's OOM record or None, reserved
    at the start) of the recording replayed under `config` (replay_recording's replay, with
    the limit it infers from the recording)."""
    from ..whatif.torch_replay import replay_recording

    recording = source.recording
    length = max(1, len(source.a))
    events: list = []
    result = replay_recording(recording, config, events=events,
                              progress=None if progress is None else
                              lambda index: progress(index / length))
    start_reserved = recording.start_state(config).reserved
    sign = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    moves = [(at, sign.get(e.action, 0) * e.size) for at, e in events if e.action in sign]
    positions = np.array([at for at, _ in moves], dtype=np.int64)
    reserved = start_reserved + np.cumsum(np.array([n for _, n in moves], dtype=np.int64))
    return positions, reserved, result.oom, start_reserved


def _curve(source: Source, positions, reserved, start_reserved: int):
    """The step curve on the timeline's axis: the level at the first entry, then after each
    change (the last of each entry), thinned to POINTS by keeping each stretch's highest."""
    if len(positions):
        last = np.r_[positions[1:] != positions[:-1], True]
        positions, reserved = positions[last], reserved[last]
    if len(positions) > POINTS:
        stretch = -(-len(positions) // POINTS)
        starts = np.arange(0, len(positions), stretch)
        highest = np.maximum.reduceat(reserved, starts)
        at = starts + np.array([int(np.argmax(reserved[s:s + stretch])) for s in starts.tolist()])
        positions, reserved = positions[at], highest
    t = [float(source.t_range[0])] + source.t_of(positions).tolist()
    levels = [int(start_reserved)] + reserved.tolist()
    t.append(float(source.t_range[1]))
    levels.append(levels[-1])
    return t, levels


def _tune_verdict(source: Source, config, text: str, progress):
    """(tune's verdict on the setting, tune's answer line, its peak reserved, the recorded
    peak reserved): tune_recording on the recorded settings and this one."""
    from ..whatif.torch_tune import tune_recording

    def update(done: int, total: int, events: int = 0) -> None:
        progress(done / total if total else 0.0)

    tuning = tune_recording(source.recording, candidates=("", text), workers=1,
                            progress=update)
    chosen = next((c for c in tuning.candidates
                   if c.config.describe() == config.describe()), tuning.recorded)
    return (_verdict(tuning, chosen), tuning.answer(),
            int(chosen.decisive.peak_reserved_bytes), tuning.recorded_peak_reserved_bytes)


def _verdict(tuning, chosen) -> str:
    """tune's verdict on the setting, as tune's table gives it: where no --memory was given
    and both finish (a run that did not die, a CPU profile), "fits" would mean nothing, so
    what the setting saves against the settings the run used, as tune's table says."""
    from ..units import format_size

    if tuning.memory is not None or not all(c.finishes for c in tuning.candidates):
        return chosen.verdict()
    if chosen.as_recorded:
        return "as recorded"
    saving = (tuning.recorded.decisive.peak_reserved_bytes
              - chosen.decisive.peak_reserved_bytes)
    return (f"saves {format_size(saving)} against the recorded settings" if saving >= 0 else
            f"reserves {format_size(-saving)} more than the recorded settings")
