"""The rest of a run that died, played on from what it repeated.

A recording that ends in an out-of-memory holds the run only up to the request that failed. A
setting that gets past that request may still run out later in the run. Training loops repeat
a step; serving and generation loops repeat a pattern of requests. Where the recording's
allocations and frees repeat, the run is played on from there:

- The period is the shortest one that repeats over the longest stretch of the recording's end
  (two periods or more). An event's shape is its action, its stream, and for a free how many
  events back its allocation was. Sizes are left out of the shape, so requests whose sizes vary
  (another sequence length, another batch of requests) still repeat.
- Each played-on event copies the one a period earlier. A free releases the block allocated one
  period after the block its model released.
- A position whose size varies between repetitions is played at the largest size the
  recording shows there: the largest mix.
- A period that frees less than half of what it takes is not a step of a loop but the layers
  of one step's forward pass: it is played on once, not for every step asked.

The played-on run is an estimate, and every verdict drawn from it says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..trace.snapshot import SEGMENT_REMOVE, Recording, died_at

STEPS = 3                   # periods played on past the failed request
MIN_EVENTS = 4              # a shorter period is a run of one or two requests, not a step
_PRE = -1                   # a free of a block allocated before the trace began
GIVES_BACK = 2              # a period that frees less than 1/2 of what it takes is not a step
SHORT = 64                  # periods up to this many events are all tried, longer ones divide


@dataclass
class Extension:
    recording: Recording        # the recording up to the failed request, then played on
    period: int                 # events (allocations and frees) in one repetition
    repetitions: int            # whole periods the recording's end repeats
    steps: int                  # periods played on
    exact: bool                 # whether the sizes repeat exactly (else played at the largest)
    failed_at: int              # the trace entry of the failed request
    played_from: int            # the entry of `recording` where the played-on events begin
    growing: bool = False       # what repeats frees little of what it takes: played on once

    def describe(self) -> str:
        sizes = "the same sizes" if self.exact else "the largest size each request had"
        if self.growing:
            return (f"the recording's end repeats {self.period} events that free little of "
                    f"what they take (the layers of one step, say): the run was played on for "
                    f"one more of them, at {sizes}; how far the step grows past that is unknown")
        return (f"the run was played on for {self.steps} more periods of {self.period} "
                f"events (the recording repeats its last {self.repetitions} periods; "
                f"played at {sizes})")


@dataclass
class _Event:
    entry: dict
    alloc: bool
    size: int
    stream: int
    back: int            # for a free: events since its allocation (_PRE: before the trace)


def _events(recording: Recording, cut: int) -> list[_Event]:
    """The allocations and frees before entry `cut`, then the request that failed there."""
    free_action = recording.free_action
    events: list[_Event] = []
    allocated_at: dict[int, int] = {}
    for entry in recording.entries[:cut]:
        action = entry["action"]
        stream = int(entry.get("stream") or 0)
        if action == "alloc":
            allocated_at[entry["addr"]] = len(events)
            events.append(_Event(entry, True, entry.get("size", 0), stream, 0))
        elif action == free_action:
            at = allocated_at.pop(entry.get("addr"), None)
            back = _PRE if at is None else len(events) - at
            events.append(_Event(entry, False, entry.get("size", 0), stream, back))
    failed = recording.entries[cut]
    events.append(_Event(failed, True, failed.get("size", 0), int(failed.get("stream") or 0), 0))
    return events


def _shape(event: _Event) -> tuple:
    return event.alloc, event.stream, event.back


def _periodic(shapes: list[tuple], period: int, length: int) -> bool:
    """Whether the last `length` shapes repeat with `period`."""
    end = len(shapes)
    return all(shapes[i] == shapes[i - period] for i in range(end - length + period, end))


def find_period(shapes: list[tuple]) -> tuple[int, int] | None:
    """(period, whole periods the end repeats) of the shortest period that repeats over the
    longest stretch that ends the sequence; None when its end does not repeat twice."""
    n = len(shapes)
    longest = None
    for period in range(n // 2, MIN_EVENTS - 1, -1):
        if shapes[n - 1 - period] == shapes[n - 1] and _periodic(shapes, period, 2 * period):
            longest = period
            break
    if longest is None:
        return None
    stretch = 2 * longest
    # the shortest period of that stretch: any short one, then the divisors of the long one
    # (a period that divides no other is long, and checking every length would take too long)
    for shorter in range(MIN_EVENTS, longest + 1):
        if (shorter <= SHORT or longest % shorter == 0) and _periodic(shapes, shorter, stretch):
            longest = shorter
            break
    start = n - 1                           # walk back while the shapes repeat: one pass
    while start >= longest and shapes[start] == shapes[start - longest]:
        start -= 1
    return longest, (n - 1 - start + longest) // longest


def extend(recording: Recording, steps: int = STEPS) -> tuple[Extension | None, str]:
    """The recording played on past its first out-of-memory, or None and why not: it has no
    out-of-memory, its end does not repeat, or what repeats only grows."""
    cut = died_at(recording.entries)
    if cut is None:
        return None, "the run did not end in an out-of-memory"
    if steps < 1:
        return None, "--steps 0: the run was not played on"
    events = _events(recording, cut)
    shapes = [_shape(event) for event in events]
    found = find_period(shapes)
    if found is None:
        return None, ("the run died before its end repeated itself twice (in its first step, "
                      "say)")
    period, repetitions = found
    n = len(events)
    window = events[n - 1 - period:n - 1]          # the last period before the failed request
    taken = sum(e.size for e in window if e.alloc)
    given = sum(e.size for e in window if not e.alloc)
    # A loop of steps frees what it takes (but for what it keeps: a loss a step, a cache that
    # grows). What frees little is the layers of one step's forward pass: the step goes on
    # growing past the failure, at least by one more layer, but how far is unknown.
    growing = given * GIVES_BACK < taken
    if growing:
        steps = 1
    sizes = [max(events[n - period + p - k * period].size for k in range(repetitions))
             for p in range(period)]
    exact = all(events[n - period + p - k * period].size == sizes[p]
                for p in range(period) for k in range(repetitions))
    free_action = recording.free_action
    base = max([e.get("addr", 0) for e in recording.entries] + [0]) + (1 << 40)
    addresses = [e.entry.get("addr") for e in events]
    addresses[-1] = base                      # the failed request never got an address
    freed = {i - e.back for i, e in enumerate(events) if not e.alloc and e.back != _PRE}
    time_us = float(events[-1].entry.get("time_us", 0) or 0)
    played: list[dict] = []
    for i in range(n, n + steps * period):
        alloc, stream, back = shapes[n - period + (i - n) % period]
        size = sizes[(i - n) % period]
        if alloc:
            addresses.append(base + 512 * (i - n + 1))
            played.append({"action": "alloc", "addr": addresses[i], "size": size,
                           "stream": stream, "time_us": time_us})
            continue
        addresses.append(None)
        owner = i - back if back != _PRE else -1
        if owner < 0 or owner in freed or (owner < n and not events[owner].alloc):
            continue                  # allocated before the trace, or not one to free now
        freed.add(owner)
        played.append({"action": free_action, "addr": addresses[owner], "size": size,
                       "stream": stream, "time_us": time_us})
    prefix = list(recording.entries[:cut])
    while prefix and prefix[-1]["action"] in SEGMENT_REMOVE:   # the failed request's retry
        prefix.pop()
    failed = recording.entries[cut]
    prefix.append({"action": "alloc", "addr": base, "size": failed.get("size", 0),
                   "stream": int(failed.get("stream") or 0), "time_us": time_us})
    extended = Recording(recording.path, recording.device, recording.flavour, recording.settings,
                         recording.segments, prefix + played, recording.annotations,
                         continues=recording, shared=len(prefix) - 1)
    return Extension(extended, period, repetitions, steps, exact, cut, len(prefix),
                     growing), ""
