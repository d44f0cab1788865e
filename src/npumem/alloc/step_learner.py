"""Finding the step a program repeats, from the requests its pool sees.

Training and serving loops make the same requests in the same order every step. `StepLearner`
watches one stream's allocations and frees and hands out a `Template`: one step's requests with
their lifetimes, which `step_plan` turns into an arena layout.

A step is found in one of two ways:

- **marked**: `mark()` (called by `npumem.memory.step()`) ends a step; the requests since the
  previous mark are the template.
- **detected**: every run of `GRAM` request sizes is remembered with where it last ended. When the
  run ending now was seen before, `P` allocations ago, the stream may be repeating with period `P`;
  the hypothesis holds if the next `VERIFY` requests match the ones `P` earlier. A longer period
  replaces a shorter one under test: a layer repeats inside a step before the step repeats. A
  confirmed period is checked at every allocation; while it holds, only longer ones are tested.

A block that lives into the next step (and not past it) makes the template two steps long
(`Template.twice`); requests the template leaves to the pool are kept as `extras`. Copies of
the step elsewhere in the history that differ only in sizes (another sequence length) make
those slots `varies`, at the largest size seen (`_widen`).

Times are event numbers (allocations and frees of the stream), as in `planning.problem_from_trace`.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field, replace

GRAM = 16                 # request sizes that identify a position in the step
VERIFY = 16               # requests that must repeat before a detected period is believed
MIN_PERIOD = 4            # shorter periods are runs of one or two sizes, not steps
SHAPE_FACTORS = 4        # factors by which sizes may change when tensor shapes do
COPIES = 8               # copies of a step on either side that `_widen` compares
MAX_ALLOCATIONS = 1 << 18  # history kept; a step with more allocations than half this is not learned


@dataclass
class Template:
    """One step's requests, in order (slot i is the step's i-th allocation).

    `starts[i]`/`ends[i]` are the event times of slot i's allocation and free, counted from slot
    0's allocation. `offsets[i]` is its allocation number counted from the window's first
    (`first`, counted from the stream's first), so a live block maps to its place in the step.
    Blocks that outlived two steps or were never freed are left out; `extras` maps them, as
    (the slot they come before, requested bytes), to their offsets, so that following the step
    knows them from a detour. `length` is the step's duration in events, `cursor` the slot the
    stream's next allocation corresponds to, `marked` whether steps are marked by
    `npumem.memory.step()`."""

    requested: list[int]
    sizes: list[int]
    starts: list[int]
    ends: list[int]
    length: int
    cursor: int
    period: int = 0          # allocations in one step, those left out included
    marked: bool = False
    holds_peak: bool = False  # the stream's highest live bytes so far were reached in it
    unknown: int = 0          # blocks left out only because they are still live, and young
    short: int = 0            # left out as outliving two steps, though freed within two steps'
                              # allocations: the window has fewer events than later steps
    repeats: int = 1          # steps the template holds: 2 when a block outlives its step
    extras: dict = field(default_factory=dict)
    first: int = 0
    offsets: list[int] = field(default_factory=list)
    varies: frozenset = frozenset()   # slots whose size changes from step to step (see _widen)

    def __len__(self) -> int:
        return len(self.requested)

    @property
    def step_slots(self) -> int:
        """Slots in one step (the template may hold two)."""
        return len(self.requested) // self.repeats

    @property
    def step_period(self) -> int:
        """Allocations in one step, those left out included."""
        return self.period // self.repeats

    def slot_at(self, offset: int) -> int:
        """The first slot at or after allocation `offset` of the template (wrapping)."""
        slot = bisect_left(self.offsets, offset % self.period)
        return slot if slot < len(self.offsets) else 0

    def widened(self, copies) -> "Template":
        """This template with `copies` of it (the sizes at its slots in other steps; None: not
        a copy) folded in: the slots whose sizes differ vary (`varies`), and take the largest
        size seen, so that one plan holds every copy."""
        sizes, varies = list(self.sizes), set(self.varies)
        for copy in copies:
            for slot, size in enumerate(copy or ()):
                if size != sizes[slot]:
                    varies.add(slot)
                    sizes[slot] = max(sizes[slot], size)
        if varies == self.varies and sizes == self.sizes:
            return self
        return replace(self, sizes=sizes, varies=frozenset(varies))

    def twice(self) -> "Template":
        """Two steps in one template, so that a block living into the next step (the batch a
        training loop replaces only once the next one is made) is planned with its own
        lifetime: its two instances alternate, and every lifetime is shorter than the template."""
        length, count = self.length, len(self.requested)
        return replace(self, requested=self.requested * 2, sizes=self.sizes * 2,
                       starts=self.starts + [start + length for start in self.starts],
                       ends=self.ends + [end + length for end in self.ends],
                       length=2 * length, period=2 * self.period, repeats=2,
                       extras={**self.extras, **{(slot + count, size): offset + self.period
                                                 for (slot, size), offset in self.extras.items()}},
                       offsets=self.offsets + [offset + self.period for offset in self.offsets],
                       varies=self.varies | {slot + count for slot in self.varies})


def _scaled(sizes: list[int], others: list[int]) -> bool:
    """Whether `others` are `sizes` with other tensor shapes: the sizes that differ change by
    a few factors (a sequence length, its square, the batch), not each by its own."""
    factors = {round(other / max(size, 1), 2)
               for size, other in zip(sizes, others) if other != size}
    return len(factors) <= SHAPE_FACTORS


class StepLearner:
    """Records a stream's allocations (requested bytes, pool bytes, event time, free time).
    A `strict` learner (after two templates were refused) confirms a period only once a whole
    period has repeated: gradient accumulation's micro-batches repeat for a while at
    distances that are not the step. One made `mid_step` (after a refusal, or to follow
    another stream) takes its first mark (`npumem.memory.step()`) as a step's start only."""

    def __init__(self, strict: bool = False, mid_step: bool = False):
        self.strict, self.mid_step = strict, mid_step
        self.requested: list[int] = []
        self.sizes: list[int] = []
        self.times: list[int] = []
        self.frees: list[int | None] = []
        self.live: dict[int, int] = {}          # pointer -> allocation number
        self.events = 0
        self.dropped = 0                        # allocations trimmed from the history's front
        self.live_bytes = self.peak_bytes = 0
        self.live_before: list[int] = []        # live bytes just before each allocation
        self.peak_at = 0                        # allocation number at which live bytes peaked
        self.grams: dict[tuple, int] = {}       # GRAM sizes -> allocation number they last ended at
        self.marks: list[int] = []              # allocation numbers where step() was called
        self.pending: tuple[int, int] | None = None   # a marked step waiting for its frees:
        self.awaited: set[int] = set()                # its blocks still live at the mark
        self.period = 0                         # hypothesis under test (0: none)
        self.confirmed = 0                      # confirmed, and holding: test only longer ones
        self.matched = 0                        # requests that repeated under it so far
        self.tested = -(1 << 62)                # allocation number of the last period put under test

    def on_free(self, pointer: int) -> None:
        """A block of the stream was freed. One made before the learner began is an event too,
        so that a step's events are counted alike in every copy of it."""
        self.events += 1
        index = self.live.pop(pointer, None)
        if index is not None:
            self.frees[index] = self.events
            self.live_bytes -= self.sizes[index]
        self.awaited.discard(pointer)

    def on_alloc(self, pointer: int, requested: int, size: int) -> Template | None:
        """Record an allocation; returns a template when a detected period was just confirmed."""
        if len(self.requested) >= MAX_ALLOCATIONS:
            self._trim()
        n = len(self.requested)
        self.events += 1
        self.requested.append(requested)
        self.sizes.append(size)
        self.times.append(self.events)
        self.frees.append(None)
        self.live[pointer] = n
        self.live_before.append(self.live_bytes)
        self.live_bytes += size
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes, self.peak_at = self.live_bytes, n
        if self.marks:                          # steps are marked: no guessing
            return self._made(n)
        confirmed = self.confirmed
        if confirmed and self.requested[n - confirmed] != requested:
            # the stream stopped repeating with that period: a first step that differed
            # (optimizer state made in it) fooled the test; any period may be tested again
            self.confirmed, self.pending = 0, None
        period = self.period
        if period:
            if self.requested[n - period] != requested:
                self.period = 0
            else:
                self.matched += 1
                if self.matched >= (max(VERIFY, period) if self.strict else VERIFY):
                    self.period, self.confirmed = 0, period
                    self._await(self.anchor, self.anchor + period)
        if n + 1 >= GRAM:
            gram = tuple(self.requested[n + 1 - GRAM:])
            seen = self.grams.get(gram)
            self.grams[gram] = n
            if seen is not None and n - seen > max(self.period, self.confirmed, MIN_PERIOD - 1):
                # the GRAM sizes ending at `seen` came back: test period n - seen, whose first
                # whole copy starts at the first of those sizes
                self.period, self.matched, self.tested = n - seen, 0, n + self.dropped
                self.anchor = seen + 1 - GRAM
        return self._made(n)

    def forget_period(self) -> None:
        """The template was not the step (its window did not hold the peak yet, say): test
        its period again, so that a newer window is offered."""
        self.confirmed = 0

    def _made(self, n: int) -> Template | None:
        """The step awaited (`_await`), at allocation `n`, once its blocks still live then are
        freed, or GRAM + VERIFY allocations on (it may be short). Blocks still live then are
        left out for now; `refreshed` adds them once they are freed."""
        if self.pending is None:
            return None
        first, end = self.pending
        if self.awaited and n + 1 - end < GRAM + VERIFY:
            return None
        self.pending = None
        if self.marks:
            return self._template(first, end, n + 1, marked=True)
        return self._folded(self._template(first, end, n + 1), n + 1)

    def _folded(self, template: Template | None, following: int) -> Template | None:
        """A detected period may be two or three steps whose sizes differ (sequence lengths
        that came back in the same order): then the step is one part, whose sizes vary."""
        if template is None:
            return None
        period = template.step_period
        first = template.first - self.dropped
        for parts in (2, 3):
            part = period // parts
            if period % parts or part < MIN_PERIOD:
                continue
            step = self._template(first, first + part, following)
            if step is None or not step.varies:
                continue
            own = self.sizes_at(step, template.first)
            copies = [self.sizes_at(step, template.first + k * part) for k in range(1, parts)]
            if own is not None and all(copy is not None and _scaled(own, copy) for copy in copies):
                step.holds_peak = template.holds_peak
                return step
        return template

    def mark(self) -> Template | None:
        """A step ended (npumem.memory.step()). Its template is made at an allocation of the
        next step, once the step's blocks still live now are freed (gradients dropped by the
        next zero_grad, say), or GRAM + VERIFY allocations in; a template still waiting from
        the step before is returned now."""
        n = len(self.requested)
        begin = self.marks[-1] if self.marks else 0
        self.marks, self.period = [n], 0
        if self.mid_step:                   # [begin, n) is the end of a step only
            self.mid_step = False
            return None
        waiting = self.pending
        self.pending = None
        if n > begin:
            self._await(begin, n)
        return self._template(*waiting, n, marked=True) if waiting is not None else None

    def _await(self, first: int, end: int) -> None:
        """Make allocations [first, end) a template when `_made` says (a block's lifetime is
        known at its free)."""
        self.pending = (first, end)
        self.awaited = {pointer for pointer, index in self.live.items()
                        if index is not None and first <= index < end}

    def _template(self, first: int, end: int, following: int, marked: bool = False) -> Template | None:
        """Allocations [first, end) as one step; `following` is the allocation number the
        stream's next request gets. Slots whose block outlives two steps (or was never freed)
        are left out: they are not the same memory from step to step, and a template without
        them keeps the requests that follow in line. A block that outlives one step makes the
        template two steps long (`Template.twice`)."""
        origin = self.times[first]
        length = (self.times[end] if end < len(self.times) else self.events + 1) - origin
        template = Template([], [], [], [], length, 0, end - first, marked,
                            first <= self.peak_at < end, first=first + self.dropped)
        outlives, extras = False, {}
        for index in range(first, end):
            free = self.frees[index]
            start = self.times[index] - origin
            if free is None or free - origin - start >= 2 * length:
                if free is None and self.events - self.times[index] < 2 * length:
                    template.unknown += 1           # may yet be freed within two steps
                elif free is not None and bisect_left(self.times, free) - index < 2 * (end - first):
                    # short: its window counts fewer events than later steps' (the program's
                    # first frees no blocks of a step before it)
                    template.short += 1
                extras[len(template.requested), self.requested[index]] = index - first
                continue
            outlives = outlives or free - origin - start >= length
            template.requested.append(self.requested[index])
            template.sizes.append(self.sizes[index])
            template.starts.append(start)
            template.ends.append(free - origin)
            template.offsets.append(index - first)
        if not template.requested:
            return None
        template.extras = {(slot % len(template), size): offset
                           for (slot, size), offset in extras.items()}
        template = self._widen(template, first, end)
        if outlives:
            template = template.twice()
        template.cursor = template.slot_at(following - first)
        return template

    def _widen(self, template: Template, first: int, end: int) -> Template:
        """Steps whose tensor shapes change (another sequence length or batch size) make the
        same requests in the same order, with other sizes: `template` (allocations [first,
        end)) widened to the copies of its window in the history that do (`sizes_at`). It
        holds the peak of live bytes if one of them does (the longest sequence's step)."""
        period = end - first
        # (the earliest may have begun before the history: a learner made in mid-step)
        starts = range(first - period * min(COPIES, first // period + 1),
                       min(len(self.requested) - 1, first + COPIES * period) + 1, period)
        copies = {start: self.sizes_at(template, start + self.dropped)
                  for start in starts if start != first}
        widened = template.widened(copies.values())
        if widened is not template:
            widened.holds_peak = template.holds_peak or any(
                start <= self.peak_at < start + period for start, sizes in copies.items() if sizes)
        return widened

    def sizes_at(self, template: Template, start: int) -> list[int] | None:
        """The sizes of the allocations at `template`'s slots in the window of the history that
        begins at allocation `start` (numbered as `allocations` counts), if that window makes
        and frees them in the template's order (blocks still live not yet due); else None: a
        window with any other difference (a first step that made optimizer state) is not a
        copy of the step. A window cut short, under way or begun before the history (a
        learner made in mid-step, after a template was refused), counts if it holds half the
        slots; the template's sizes stand for the rest."""
        first = start - self.dropped
        offsets, count = template.offsets, len(self.requested)
        low = bisect_left(offsets, -first)               # slots made before the history
        high = bisect_left(offsets, count - first)       # slots made so far
        if (low or high < len(template)) and (high - low < len(template) // 2 or low >= high):
            return None
        times, frees = self.times, self.frees
        base = times[first + offsets[low]] - template.starts[low]   # the window's slot 0
        sizes = template.sizes[:low]
        for offset, begin, end in zip(offsets[low:high], template.starts[low:high],
                                      template.ends[low:high]):
            index = first + offset
            free = frees[index]
            if times[index] - base != begin or (
                    free - base != end if free is not None else base + end <= self.events):
                return None
            sizes.append(self.sizes[index])
        return sizes + template.sizes[high:]

    def refreshed(self, template: Template) -> Template:
        """`template` made again from its window with the frees seen since: blocks that were
        still live when it was made have lifetimes now, and are slots (the cursor is not
        set: the stream may not repeat with the window's length). Slots keep the largest
        size `template` knew. Where the stream has since repeated a step of another length
        exactly, that step instead (`_exact_step`); where the window misjudges lifetimes, a
        recent copy (`_short_window`)."""
        exact = self._exact_step(template)
        if exact is not None:
            return exact
        first = template.first - self.dropped
        if first < 0 or first + template.step_period > len(self.requested):
            return template                     # the window is not (or no longer) all here
        made = self._template(first, first + template.step_period,
                              len(self.requested), template.marked)
        if made is None:
            return template
        if made.short and not (template.marked or template.varies):
            recent = self._short_window(made, template)
            if recent is not None:
                return recent
        made.holds_peak = template.holds_peak
        known = dict(zip(template.offsets, template.sizes))    # sizes it has grown to since
        return made.widened([[known.get(offset, size)
                              for offset, size in zip(made.offsets, made.sizes)]])

    def _short_window(self, made: Template, template: Template) -> Template | None:
        """`made` (`template`'s window made again) leaves out blocks freed within two steps as
        older (`Template.short`: the program's first steps free nothing of a step before them,
        so they count fewer events than later ones): a recent copy of the step, or None, with
        those blocks counted as unknown, so that the plan waits for one."""
        recent = self._recent_copy(template.step_period, template)
        if recent is None:
            made.unknown += made.short
        return recent

    def _exact_step(self, template: Template) -> Template | None:
        """The step the stream has repeated exactly since `template` was made, if it is a
        little longer or shorter (`template` came from a first step that differed: optimizer
        or loss-scaler state made in it), made from a recent copy (tried an eighth of a step
        apart, newest first) whose blocks are all freed or known to outlive two steps; else
        None."""
        period, step = self.confirmed, template.step_period
        if not 0.8 * step <= period <= 1.25 * step or period == step or template.marked \
                or template.varies:
            return None
        return self._recent_copy(period, template)

    def _recent_copy(self, period: int, template: Template) -> Template | None:
        """A step of `period` allocations made from a recent copy (tried an eighth of a step
        apart, newest first) whose blocks are all freed or known to outlive two steps."""
        count = len(self.requested)
        for first in range(count - period, max(count - 3 * period, -1), -max(1, period // 8)):
            made = self._template(first, first + period, count)
            if made is not None and made.unknown == 0 and made.short == 0:
                made.holds_peak = template.holds_peak
                return made
        return None

    def live_allocations_ago(self, count: int) -> int | None:
        """The live bytes just before the allocation `count` allocations before the next one
        (None if the history is shorter)."""
        return self.live_before[-count] if 0 < count <= len(self.live_before) else None

    @property
    def allocations(self) -> int:
        """Allocations recorded since the stream's first (the next one's number)."""
        return len(self.requested) + self.dropped

    def live_offsets(self, template: Template) -> dict[int, int]:
        """{pointer: offset in the template} for the stream's live blocks made since the window
        of a template just made (the stream repeated it since)."""
        return {pointer: (index + self.dropped - template.first) % template.period
                for pointer, index in self.live.items()
                if index is not None and index + self.dropped >= template.first}

    def _trim(self) -> None:
        """Keep the newer half of the history."""
        drop = len(self.requested) // 2
        for name in ("requested", "sizes", "times", "frees", "live_before"):
            setattr(self, name, getattr(self, name)[drop:])
        self.live = {pointer: None if index is None or index < drop else index - drop
                     for pointer, index in self.live.items()}
        self.grams.clear()
        self.dropped += drop
        self.marks = [max(mark - drop, 0) for mark in self.marks]
        self.pending = None                     # its window may have been cut: wait for a mark
        self.peak_at -= drop
        self.period = 0
