"""Predictive pre-allocation (NPUMEM_ALLOC_CONF=predictive:True): the pool learns the step the
program repeats and serves it from a plan (docs/predictive.md has the whole story; each rule
below moved a measured outcome, bench/predictive_cases.py switches it off).

1. **Learn** one stream's step (`StepLearner`, or `npumem.memory.step()` marks); the stream
   followed is the one asking for the most bytes.
2. **Prove**: the template must foresee 99% of half a followed step, while live bytes do not
   grow from boundary to boundary; else it is refused and learned again (five times at most).
3. **Plan** it, made again first with the lifetimes known by then (`_refresh`; the step the
   stream has since repeated exactly, if that is a little longer or shorter, or a later copy
   where the first steps made a block look older than two steps), around the pool's live
   blocks (`step_plan.lay_out`), cut where the stream is.
4. **Serve** under the peak reserved so far (`step_arena`): a request the plan expects next
   (or a few slots on; found again by its last sizes after a detour; counted while the stream
   repeats the window exactly, `_counted`) gets its slot's block. A layout cut between cuts
   serves only until the next cut, where the step is planned again. A block whose place is
   still held goes elsewhere in the arena (`place_elsewhere`); in a marked step a one-off
   request above the peak borrows a free run (`lend`). Anything else is the pool's. A planned
   block is handed out only when no live block overlaps it.
5. **Shapes that vary**: slots whose size changes from step to step hold the largest seen
   (`_widen`); a larger request stands the plan aside for the step; in a marked step requests
   at a slot's position take their slot (`_resize_to_strays`), and a grown plan that does not
   fit falls back to the one before (`_fall_back`).
6. **Stop**: a step under 50% hits drops the plan; reserved memory above the pre-plan peak ends
   prediction; a step at 99% ends learning. Learning costs time on every request: with no plan
   served in `QUIET` requests (or four steps of a step followed), it pauses (`_pause`): the
   pool only counts requests until the pause ends.
"""

from __future__ import annotations

import threading
import warnings
from bisect import bisect_left
from collections import Counter, deque

from ..planning import PlanError
from .block import Block
from .step_arena import PoolRangeArena, SegmentLine, SegmentsArena, StepArena
from .step_learner import StepLearner, Template, _scaled
from .step_plan import StepLayout, crossing_slots, cuts, lay_out

LOOKAHEAD = 32          # template slots a request may skip (requests the program left out)
RESYNC = 4              # requests in a row that find the place in the step again after a detour
KEPT = 0.8              # share of a detected step's requests that must be plannable
PROVEN, STALE = 0.99, 0.5   # step hit rates that end learning / drop the plan
GRAM_CHECK = 32         # requests followed before a template's record counts
MAX_REFUSALS = 5        # templates refused (strayed from, or too tall) before prediction stops
QUIET = 1 << 12         # requests learned with no plan serving before learning pauses
PAUSE = 1 << 17         # for this many requests, then twice as many each time,
MAX_PAUSE = 1 << 24     # up to this
PATIENCE = 1 << 18      # requests learned, at most, while only runs of sizes come back
_NOT_YET = object()


class Predictor:
    """The predictive part of one CachingAllocator (`pool`); called with the pool's lock held."""

    def __init__(self, pool, background: bool = True, time_limit: float = 2.0):
        self.pool = pool
        self.background, self.time_limit = background, time_limit
        # Planning in line (replays), a layout may still be handed over `lag` requests after
        # it was asked for, as from the program's planner thread (`held` until then: the
        # replay calls `hand_over_held`, off the pool's allocate path).
        self.lag, self.held, self.held_at = 0, None, 0
        self.stream = _NOT_YET              # the stream followed (see _choose_stream)
        self.stream_bytes: dict = {}        # bytes asked per stream, while it is chosen
        self.learner: StepLearner | None = StepLearner()
        self.template: Template | None = None      # the step being followed
        self.dropped: Template | None = None       # the last one given up (its sizes count)
        # Marked steps: where the stream is since the last mark (its requests, counted), and
        # the requests the template did not foresee there (position -> size): see _resize_to_strays
        self.mark_at = self.others = 0             # (others: requests of other streams)
        self.strays: dict[int, int] = {}
        self.fallback: Template | None = None      # served before a longer batch: see _fall_back
        self.pages_given = False    # idle arena pages went back this step for an unforeseen request
        self.layout: StepLayout | None = None      # its layout, once its arena serves
        self.ready: StepLayout | None = None       # a layout waiting to take over
        self.planning = False
        self.in_line = False        # plan the next layout in line: blocks moved into the last one
        self.cuts: tuple[int, ...] = (0,)          # the slots where steps are cut
        self.last_offset: int | None = None        # the template offset the request matched
        self.offset_pointers: dict[int, int] = {}  # offset -> the pool block it got last
        self.pointer_offsets: dict[int, int] = {}  # and back: a pointer reused by another
        self.pinned: set[int] = set()              # pool blocks the plan being made keeps
        self.cursor = 0
        self.recent: deque[int] = deque(maxlen=RESYNC)
        self.places: dict[tuple, int] = {}         # RESYNC sizes -> the slot after them
        self.arena: StepArena | None = None
        self.draining: list[StepArena] = []        # replaced arenas with blocks still live
        self.serving = False
        self.requests = self.hits = self.misses = self.plans = 0
        self.step_hits = self.step_misses = 0
        self.planning_seconds = 0.0
        self.peak_before = 0                        # peak reserved when the arena took over
        self.refused_periods: Counter[int] = Counter()   # times refused, since a proven step
        self.took_over_at: int | None = None       # requests seen when an arena first served
        self.boundary_live: int | None = None      # live bytes at the last step boundary seen
        self.between_cuts = True                    # a plan may take over between cuts
        self.quiet, self.quiet_since = QUIET, 0     # see _pause
        self.patience, self.learning_since = PATIENCE, 0    # and _repeating
        self.pause, self.wake_at = PAUSE, None      # while paused: the request that ends it
        self.rest_until = 0         # paused: the pool counts requests up to this one itself
        self.marked = False                         # a step was marked (mark_step)
        self.note = "learning"

    # --- called by the pool ---------------------------------------------------------------

    def take(self, nbytes: int, size: int, stream) -> Block | None:
        """The planned block for this request (`nbytes` asked, `size` once rounded), or None
        (the pool serves it)."""
        self.requests += 1
        if self.wake_at is not None:          # paused: the pool's, at the pool's cost
            if self.requests < self.wake_at:
                self.misses += self.took_over_at is not None and (
                    stream is self.stream or stream == self.stream)
                return None
            self._wake()
        if not self.serving and self.learner is not None:
            if self.requests - self.quiet_since >= self.quiet and not self._repeating():
                self._pause()
                return None
            if self.template is None:
                self._choose_stream(stream, size)
        if stream is not self.stream and stream != self.stream:
            return self._other_stream(size, stream)
        self.misses += self.took_over_at is not None and not self.serving   # the pool's, now
        template = self.template
        if template is None:
            return None
        self.recent.append(nbytes)
        slot = self.cursor
        offset = self._counted(template) if self.learner is not None else None
        if offset is not None:         # the stream repeats the window exactly: count
            slot = bisect_left(template.offsets, offset)
            if slot == len(template) or template.offsets[slot] != offset:
                self.cursor = slot if slot < len(template) else 0
                if not self.serving:
                    self.last_offset = offset
                return self._miss(size, stream, foreseen=True)      # a request the template leaves out
        other_size = template.requested[slot] != nbytes
        if other_size:
            extra = template.extras.get((slot, nbytes))
            if extra is not None:                     # foreseen, but left to the pool
                if not self.serving:
                    self.last_offset = extra
                return self._miss(size, stream, foreseen=True)
        if other_size and not self._resized(template, slot, size):
            if template.marked and self._at_its_position(template, slot):
                self.strays[self._position()] = size   # the slot's, at another length
                if self.serving and size > self.arena.blocks[slot].size:
                    # the pool serves it; if it needs new memory, the plan stands aside
                    self.cursor = slot + 1 if slot + 1 < len(template) else 0
                    if not self.pool._strategy.serves_from_cache(size, stream):
                        self._stand_aside_for(size)
                    return self._miss(size, stream, unforeseen=True)
            else:
                slot = self._find(nbytes, self.cursor)
                if slot < 0:
                    return self._miss(size, stream, unforeseen=True)
        elif slot in self.cuts or (not self.serving and self._may_take_over_here(template, slot)):
            if slot in self.cuts:      # a step's first request, where expected: a boundary
                self._step_began(slot)
            else:                      # proven between cuts: serve from here until a cut
                self._plan_and_take_over(slot, provisional=True)
                if not (self.serving or self.planning or self.ready is not None):
                    self.between_cuts = False     # one try per template; then at cuts
            if self.template is not template:     # dropped, or made again (_refresh)
                if self.template is None:
                    return None
                template, slot = self.template, self.cursor
        self.cursor = slot + 1 if slot + 1 < len(template) else 0
        if not self.serving:           # following the step until a plan serves it
            self.step_hits += 1
            self.last_offset = template.offsets[slot]
            return None
        block = self.arena.place(slot)
        if block is None:
            # its place is still held, or its pages are not there: another (a search, so only
            # while the step follows, or where a request it did not foresee took them: a block
            # lent holds the place, or the arena's idle pages went back for the pool to serve it)
            displaced = self.arena.lent_over(slot) or self.pages_given
            if displaced or self.step_misses <= self.template.step_slots // 100:
                block = self.arena.place_elsewhere(slot)
            if block is None:
                return self._miss(size, stream, displaced=displaced)
        self.hits += 1
        self.step_hits += 1
        return block

    def hand_over_held(self) -> None:
        """A replay with a planner lag, after each request: the layout held back is ready once
        `lag` requests have passed since it was asked for, as from a planner thread."""
        if self.held is not None and self.requests - self.held_at >= self.lag:
            self.ready, self.held, self.planning = self.held, None, False

    def _resized(self, template: Template, slot: int, size: int) -> bool:
        """Whether a request of another size is still the slot's: the slot's size changes from
        step to step (`Template.varies`: another sequence length). Until a plan serves, the
        slot grows to the largest size asked; a serving plan's block holds what fits in it,
        and a larger request stops the plan for the rest of the step (`_outgrown`)."""
        if slot not in template.varies:
            return False
        if not self.serving:
            if size > template.sizes[slot] and not self.planning and self.ready is None \
                    and self.layout is None:        # (a layout made is for the sizes it knew)
                self.template = _grown(template, slot, size)
            return True
        if size > self.arena.blocks[slot].size:
            self._outgrown(template, slot, size)
        return True

    def _outgrown(self, template: Template, slot: int, size: int) -> None:
        """A request larger than its slot's planned block (a longer sequence than any seen):
        the plan stops serving, its unused ranges go back to the pool, which serves the rest
        of the step as it would without a plan, and the step is followed with the slot's new
        size, to be planned again at the next boundary."""
        self._stand_aside()
        self.template = _grown(template, slot, size)
        self.note = (f"a request of {size} bytes outgrew its planned block of "
                     f"{template.sizes[slot]}: planning the step again at the next boundary")

    def _stand_aside(self) -> None:
        """Stop serving, and follow the step again (its sizes changed): the pool serves, and
        the step is planned again once judged."""
        self._retire_arena()
        self.layout = None

    def _choose_stream(self, stream, size: int) -> None:
        """Until a step is found, follow the stream that has asked for the most bytes (twice
        the followed one's, so two alike never take turns): a side stream (data prefetch,
        collectives) may allocate first, and the compute stream's activations are the memory
        worth planning."""
        asked = self.stream_bytes
        asked[stream] = asked.get(stream, 0) + size
        if stream is self.stream or stream == self.stream:
            return
        if self.stream is _NOT_YET or asked[stream] > 2 * asked.get(self.stream, 0):
            if self.stream is not _NOT_YET:
                self._learn_afresh()
            self.stream = stream

    def _other_stream(self, size: int, stream) -> None:
        """A request on a stream not followed: the pool serves it, and the step's judgement
        leaves it out; while a plan serves, it must not take memory past the peak either."""
        self.others += 1
        if self.serving:
            self._keep_under_peak(size, stream)
        return None

    def _counted(self, template: Template) -> int | None:
        """The request's offset in `template`, counted, while the learner's confirmed period is
        the template's step (the stream repeats the window exactly since); else None. Sizes
        alone cannot tell a request the template leaves out from the expected one of the same
        size."""
        learner = self.learner
        if learner is None or template.marked or learner.confirmed != template.step_period:
            return None
        return (learner.allocations - template.first) % template.period

    def learn(self, pointer: int, nbytes: int, size: int, stream) -> None:
        """Record an allocation (hit or miss) while learning."""
        if stream is self.stream or stream == self.stream:
            offset, self.last_offset = self.last_offset, None
            if offset is not None:
                self.offset_pointers[offset] = pointer
                self.pointer_offsets[pointer] = offset
            template = self.learner.on_alloc(pointer, nbytes, size)
            if template is not None:
                self._consider(template)

    def learn_free(self, pointer: int, stream) -> None:
        """Record a free (of a block of `stream`) while learning."""
        if stream is self.stream or stream == self.stream:
            self.learner.on_free(pointer)

    @property
    def refusals(self) -> int:
        """Templates refused since a proven step."""
        return sum(self.refused_periods.values())

    @property
    def settled(self) -> bool:
        """Whether the layout serving is cut at a step boundary (one cut between cuts serves only
        until the next cut, and then hands over)."""
        return self.serving and not self.layout.provisional

    def awaited_free(self, pointer: int) -> None:
        """The pool freed a block while the arena waits for pinned ones."""
        if pointer in self.arena.awaited:
            self.arena.on_free(pointer)

    def merge_and_add(self, block: Block) -> None:
        """A planned block was freed (the pool returns it to its segment's free list: here)."""
        arena = block.segment.arena
        arena.remove(block)
        if arena is not self.arena and arena in self.draining:
            if arena.live_starts:
                arena.shrink()
            else:
                self.draining.remove(arena)
                arena.release()

    def mark_step(self) -> None:
        """npumem.memory.step(): a step ended here."""
        template = self.template
        if template is not None and template.marked:
            if self.strays and (self.learner is None or self.took_over_at is not None):
                self._resize_to_strays()     # (before a plan served, the learner knows more)
            step = template.step_slots          # the next step is the template's next one
            self.cursor = step if template.repeats > 1 and 0 < self.cursor <= step else 0
            self._step_began(self.cursor)
        self.mark_at, self.strays = self.requests - self.others, {}
        if self.wake_at is not None and not self.marked:
            self._wake()                        # the program says where its steps end, at last
        self.marked = True
        if self.learner is not None:
            template = self.learner.mark()
            if template is not None:
                self._consider(template)

    # --- learning and planning ------------------------------------------------------------

    def _pause(self) -> None:
        """No plan served in `quiet` requests of learning (or four of the followed step's, if
        more): the program does not repeat, or not in a way a plan can serve (its live bytes
        grow every step, say). Learning costs time on every request; pause it for `pause`
        requests, twice as many each time, and then learn from scratch."""
        learned = self.requests - self.quiet_since
        if self.template is not None:
            self._drop("", relearn=False)
        self.learner, self.wake_at = None, self.requests + self.pause
        # The pool counts the requests before the one that wakes it (`rest_until`) without
        # calling take(), whose call is most of what a paused request costs; not after a plan
        # has served, when take() counts the followed stream's requests as misses.
        self.rest_until = self.wake_at - 1 if self.took_over_at is None else 0
        self.note = (f"no plan served in {learned} requests of learning; learning paused for "
                     f"the next {self.pause}")
        self.pause = min(2 * self.pause, MAX_PAUSE)

    def _repeating(self) -> bool:
        """At the end of a quiet stretch: whether to learn on. With no step followed, while
        runs of request sizes still come back (the learner put a period under test in the
        last `quiet` requests: a step longer than the stretch may yet be found), for another
        stretch, up to `patience` requests since learning began. A step followed had four of
        its steps (`_follow`) to be planned."""
        learner = self.learner
        if self.template is None and learner.allocations - learner.tested <= self.quiet \
                and self.requests - self.learning_since < self.patience:
            self.quiet_since = self.requests
            return True
        return False

    def _wake(self) -> None:
        self._learn_afresh()
        self.wake_at, self.rest_until, self.note = None, 0, "learning"

    def _learn_afresh(self) -> None:
        """A new learner, from the middle of a step (strict after two refusals), with a new
        stretch of `quiet` requests to find a step in."""
        self.learner = StepLearner(strict=self.refusals > 1, mid_step=True)
        self.quiet_since = self.learning_since = self.requests

    def _consider(self, template: Template) -> None:
        """A template from the learner: plan it if it is the step (see _is_the_step). One with
        the lifetimes of the last template given up is that step at another length: it takes
        its sizes (so holds the peak if it did)."""
        known = self.dropped
        if known is not None and (known.starts, known.ends) == (template.starts, template.ends):
            widened = template.widened([known.sizes])
            if widened is not template:
                widened.holds_peak = template.holds_peak or known.holds_peak
                template = widened
        if self.planning or not self._is_the_step(template):
            if self.template is None:       # nothing followed: offer the period again later
                self.learner.forget_period()
            return
        self._retire_arena()
        self._follow(template)

    def _follow(self, template: Template) -> None:
        self.template, self.layout, self.cursor = template, None, template.cursor
        # the step found: learning is worth four of its steps (to prove and plan it), no more
        self.quiet_since = self.requests + max(4 * template.step_period - self.quiet, 0)
        # the blocks the stream holds, so that a plan made at the next cut can pin them
        self.pointer_offsets = self.learner.live_offsets(template)
        self.offset_pointers = {offset: pointer for pointer, offset in self.pointer_offsets.items()}
        self.cuts, self.places, self.boundary_live = cuts(template), {}, None
        self.step_hits = self.step_misses = 0
        self.between_cuts = True
        self.note = (f"found a step of {template.step_period} allocations; "
                     "planning once it is proven")

    def _refresh(self, boundary: int) -> int:
        """Before planning at slot `boundary`: make the template again with the lifetimes the
        learner knows now (blocks still live when it was made were left out). Returns the
        boundary in the template now followed, whose slots are found by their offsets."""
        old, learner = self.template, self.learner
        template = learner.refreshed(old) if learner is not None else old
        if template is old:
            return boundary
        if template.step_period != old.step_period or (
                template.first != old.first and learner.confirmed != old.step_period):
            # the step the stream repeats exactly, not the first one's length, or a recent
            # copy of it (the first steps' lifetimes misled), whose place in the stream is not
            # counted: follow it, and plan it at its own cut
            self._follow(template)
            self.between_cuts = False
            return None
        if learner.confirmed == old.step_period:
            # the stream has repeated the window exactly since: where it is, and which block
            # holds which place, follow from counting (a request of the same size as the one
            # expected may have been one the template leaves out)
            self.template, self.cuts, self.places = template, cuts(template), {}
            self.pointer_offsets = learner.live_offsets(template)
            self.offset_pointers = {offset: pointer for pointer, offset in self.pointer_offsets.items()}
            self.cursor = template.slot_at(learner.allocations - template.first)
            return self.cursor
        at = old.offsets[boundary]
        if template.repeats > old.repeats:
            # made two steps long: the stream is in its first step at `at`, so the blocks of
            # the step that just ended (offsets after `at`) are in its second
            step = template.period // 2
            self.offset_pointers = {offset + step if offset > at else offset: pointer
                                    for offset, pointer in self.offset_pointers.items()}
            self.pointer_offsets = {pointer: offset + step if offset > at else offset
                                    for pointer, offset in self.pointer_offsets.items()}
        self.template, self.cuts, self.places = template, cuts(template), {}
        self.cursor = bisect_left(template.offsets, at)     # a slot in both
        return self.cursor

    def _start_planning(self, template: Template, boundary: int, provisional: bool = False) -> None:
        """Plan `template`, cut at slot `boundary` (where the stream is), around the blocks
        live now in the stream's range (expandable pools) or segments (`SegmentLine`), in
        the background."""
        self.note = f"planning a step of {template.step_period} allocations"
        self.planning = True
        range_, line = self._range(), None
        if range_ is not None:
            pinned = self._pinned(template, boundary, {range_})
            self.pinned = set(pinned.values())
            taken = [(block.start - range_.base, block.size)
                     for block in self.refine(range_.blocks())     # an arena's: its live blocks
                     if block.allocated and block.start not in self.pinned]
            pinned = {slot: pointer - range_.base for slot, pointer in pinned.items()}
        else:
            strategy = self.pool._strategy
            line = SegmentLine([segment for segment in strategy.segments.values()
                                if segment.stream == self.stream])
            pinned = self._pinned(template, boundary, set(line.segments))
            self.pinned = set(pinned.values())
            taken = line.taken(self.pinned, self.refine)
            pinned = {slot: line.offset(pointer) for slot, pointer in pinned.items()}
        if self.background and not self.in_line:
            threading.Thread(target=self._plan, name="npumem-step-planner", daemon=True,
                             args=(template, taken, pinned, boundary, line, provisional)).start()
        else:
            as_thread, self.in_line = self.lag and not self.in_line, False
            self._plan(template, taken, pinned, boundary, line, provisional)
            if as_thread and self.ready is not None:     # handed over `lag` requests on
                self.held, self.held_at = self.ready, self.requests
                self.ready, self.planning = None, True

    def _pinned(self, template: Template, boundary: int, containers) -> dict[int, int]:
        """Crossing slots whose block from the step just ended is live in the pool, in one of
        `containers`: {slot: its address}. The plan keeps them there, so the block and its
        planned place are one."""
        pinned, allocated, arena = {}, self.pool._allocated, self.arena
        for slot in crossing_slots(template, boundary):
            if arena is not None and arena.blocks[slot].allocated:
                pinned[slot] = arena.blocks[slot].start   # handing over from it (_step_began)
                continue
            offset = template.offsets[slot]
            pointer = self.offset_pointers.get(offset)
            block = allocated.get(pointer)
            if block is not None and block.segment in containers \
                    and block.size == template.sizes[slot] and self.pointer_offsets.get(pointer) == offset:
                pinned[slot] = pointer
        return pinned

    def _range(self):
        """The stream's expandable address range in the pool (None for segment pools)."""
        strategy = self.pool._strategy
        if not strategy.expandable:
            return None
        return strategy.arenas.get(self.stream) or strategy._arena(self.stream)

    def _is_the_step(self, template: Template) -> bool:
        """Layers repeat inside a step before the step does. A detected template is the step if
        most of its requests can be planned (a layer's outputs outlive it) and it holds the
        stream's peak of live bytes (a backward layer does not). Until a plan serves, a longer
        period replaces a template the program strays from (the first step often differs:
        optimizer state is made).
        A marked step is planned when no plan is followed (at first, or after a poor step)."""
        if template.marked:             # the program says where steps end: keep a plan that works
            return self.template is None
        if len(template) < KEPT * template.period:
            return False
        if self.template is None:
            return template.holds_peak
        followed = self.step_hits + self.step_misses
        doing_well = self.serving or (
            followed >= GRAM_CHECK and self.step_hits >= PROVEN * followed)
        if template.varies and not self.template.varies and (
                not doing_well or self.template.period % template.period == 0):
            return True                   # the step whose sizes vary, not a run of them
        if doing_well:
            return False                  # the template in use does well: a multiple of it
        return template.period > self.template.period      # would only take longer to prove

    def _plan(self, template: Template, taken, pinned, boundary: int, line,
              provisional: bool) -> None:
        try:
            layout = lay_out(template, self.time_limit, taken, pinned, boundary)
            layout.line, layout.provisional = line, provisional
            self.planning_seconds += layout.seconds
        except PlanError as error:         # never used: a plan must not overlap live blocks
            warnings.warn(f"npumem predictive pool: a step plan failed validation ({error}); "
                          "serving from the normal pool", RuntimeWarning, stacklevel=2)
            self.note = f"plan rejected: {error}"
            layout = None
        self.ready = layout
        self.planning = False

    def _take_over(self, boundary: int) -> None:
        """Serve from the ready layout: carve its ranges out of the pool's (pages come as blocks
        need them), or out of the stream's segments and a new one (`_take_over_segments`), if
        that fits under the peak reached so far."""
        layout, pool = self.ready, self.pool
        if layout.template is not self.template:      # replaced while it was planned
            if not _same_blocks(layout.template, self.template):
                self.ready = None
                return
            layout.template = self.template   # (only which slots vary changed: a shorter batch)
        if layout.boundary != boundary:     # planned for the template's other step: wait for it
            return
        self.peak_before = pool.stats.peak("reserved_bytes")
        range_ = self._range()
        if range_ is not None:
            blocks = self.refine(range_.blocks())     # an arena handing over: its live blocks
            if PoolRangeArena.blocked(blocks, [range_.base + offset for offset in layout.offsets],
                                      layout, self.pinned):
                self.ready = None             # blocks moved in since it was planned: plan again
                self.in_line = True
                self.note = "pool blocks moved into the planned ranges; planning again"
                return
            shift = pool._strategy.shift
            mapped_here = range_.mapped.count(1) << shift
            need = PoolRangeArena.bytes_needed(range_, blocks, layout, shift)
            if pool.stats.current("reserved_bytes") - mapped_here + need > self.peak_before:
                self._not_taking_over(layout, f"the plan needs {need} bytes of pages with the "
                                      f"pool's live blocks, more than the peak of {self.peak_before}")
                return
            self._retire_arena()            # a layout cut between cuts hands over (_step_began)
            self.arena = PoolRangeArena(pool, layout, self.stream, self, range_, self.pinned)
            pool.release_idle_cache()         # pages neither the plan nor a live block touches
        elif not self._take_over_segments(layout):
            return
        self.ready, self.layout, self.serving, self.fallback = None, layout, True, None
        self.plans += 1
        self.step_hits = self.step_misses = 0
        if self.took_over_at is None:
            self.took_over_at = self.requests
        varying = len(layout.template.varies)
        self.note = (f"serving a step of {len(layout.template)} planned blocks"
                     + (f", {varying} of them sized for the largest batch seen" if varying else "")
                     + f" ({layout.algorithm}, {layout.height} bytes high)")

    def _take_over_segments(self, layout: StepLayout) -> bool:
        """Segment pools: carve the layout out of the stream's segments (`layout.line`) and a
        new segment for what lies past them, if that fits under the peak. Whether it did."""
        pool, line = self.pool, layout.line
        strategy = pool._strategy
        if not line.still_there(strategy) or PoolRangeArena.blocked(
                self.refine(block for segment in line.segments for block in segment.blocks()),
                line.addresses(layout, None), layout, self.pinned):
            self.ready = None               # segments went back, or blocks moved in: plan again
            self.in_line = True
            self.note = "the pool's segments changed since the plan was made; planning again"
            return False
        pool.release_idle_cache(keep=set(line.segments))
        extension_bytes = line.extension_bytes(layout)
        if pool.stats.current("reserved_bytes") + extension_bytes > self.peak_before:
            self._not_taking_over(layout, f"the plan needs a {extension_bytes}-byte segment beside "
                                  f"the pool's, more than the peak of {self.peak_before} allows")
            return False
        extension = None
        if extension_bytes:
            extension = strategy._new_segment(extension_bytes, self.stream, False, extension_bytes)
            if extension is None:
                self.note = f"no device memory for a {extension_bytes}-byte segment; waiting"
                return False
            extension.free.add(extension.first)     # free, until the arena carves it
        self._retire_arena()
        self.arena = SegmentsArena(pool, layout, self.stream, self, line, extension, self.pinned)
        return True

    def _not_taking_over(self, layout: StepLayout, why: str) -> None:
        """The ready layout does not fit under the peak. One cut between cuts (or the hand-over
        from one) is not a refusal of the template: it waits for a cut, or serves on."""
        if not (layout.provisional or self.serving):
            if self.fallback is not None and layout.template is not self.fallback:
                self._fall_back(layout.boundary, why)
            else:
                self._refused(why)
            return
        self.ready = None
        if self.serving:
            self.layout.provisional = False         # the layout serving stays
        else:
            self.between_cuts = False
        self.note = f"{why}; {'serving on' if self.serving else 'waiting for a cut'}"

    def _fall_back(self, boundary: int, why: str) -> None:
        """The template grown to a longer batch's sizes (`_resize_to_strays`) has no plan that
        fits under the peak: plan again the one that served the shorter batches, and leave
        longer ones to the pool when they come."""
        self.template, self.fallback, self.ready = self.fallback, None, None
        self._plan_and_take_over(boundary)
        self.note = f"{why}; {self.note} (a longer batch goes to the pool)"

    def _refused(self, why: str) -> None:
        """The template cannot take over (the program strays from it, or its plan does not fit
        under the peak). It may come from a first step that differed (optimizer state made in
        it): learn the step again from the steps since, a few times. A period refused twice
        is part of the step (a micro-batch of gradient accumulation): a longer one is."""
        self.refused_periods[self.template.period] += 1
        if self.refusals >= MAX_REFUSALS:
            self._drop(f"{why}; not taking over (tried {self.refusals} plans)")
            self.learner = None
        else:
            self._drop(f"{why}; learning the step again")

    def _retire_arena(self) -> None:
        """Stop serving from the arena; it goes back once its last block is freed."""
        self.serving = False
        arena, self.arena = self.arena, None
        if arena is not None:
            if arena.live_starts:
                arena.shrink()
                self.draining.append(arena)
            else:
                arena.release()

    # --- following the step ---------------------------------------------------------------

    def _find(self, nbytes: int, slot: int) -> int:
        """The slot for a request the cursor did not expect: a few slots on (the program
        skipped some), or where the last RESYNC requests say we are; -1 if neither. In a marked
        step, only a few slots on before the step's end, and never at its first request: the
        mark says where the stream is."""
        requested = self.template.requested
        count = len(requested)
        if self.template.marked:
            if self._position() == 0:
                return -1
            step = self.template.step_slots
            for candidate in range(slot + 1, min((slot // step + 1) * step, slot + LOOKAHEAD)):
                if requested[candidate] == nbytes:
                    return candidate
            return -1
        # Skip no more than the step's first request (the cut): a request the template left
        # out (a block that outlives a step) must not carry the cursor far past a step
        # boundary. A step that left out just that one is followed from its second request;
        # its boundary is judged at the next cut.
        for skip in range(1, min(LOOKAHEAD, count) if slot not in self.cuts else 2):
            candidate = slot + skip
            if candidate >= count:
                candidate -= count
            if requested[candidate] == nbytes:
                return candidate
            if candidate in self.cuts:
                break
        if len(self.recent) == RESYNC:
            if not self.places:
                self._index_places()
            found = self.places.get(tuple(self.recent), 0) - 1
            step = self.template.step_slots
            if found >= 0 and step < count:       # two steps: the copy in the one under way
                found = min(found, found + step, key=lambda candidate: (candidate - slot) % count)
            return found
        return -1

    def _index_places(self) -> None:
        """Map each run of RESYNC sizes that occurs once in a step to the slot ending it (in
        the template's first step)."""
        requested, seen = self.template.requested, {}
        count = self.template.step_slots
        for end in range(count):
            key = tuple(requested[(end - RESYNC + 1 + i) % count] for i in range(RESYNC))
            seen[key] = -1 if key in seen else end + 1
        self.places = {key: slot for key, slot in seen.items() if slot > 0}

    def _miss(self, size: int, stream, foreseen: bool = False, unforeseen: bool = False,
              displaced: bool = False) -> Block | None:
        """A request the plan could not serve, or one the step did not foresee (`unforeseen`):
        the pool serves it (`_keep_under_peak`), unless that needs new memory above the peak and
        a free run of the arena holds it (`StepArena.lend`: the block returned). A `foreseen`
        one (a template extra, which outlives steps) is the pool's and counts as followed in
        the step's judgement. A `displaced` one (its place lent to an unforeseen request, or its
        pages given back for the pool to serve one) is judged as that request would have been."""
        if foreseen:
            self.step_hits += 1
        elif unforeseen and self.template.marked:
            self.strays[self._position()] = size
        lent = None
        if not self.serving:
            self.step_misses += not foreseen
        else:
            self.misses += 1
            if not foreseen and self.template.marked and self._above_peak(size, stream):
                lent = self.arena.lend(size, self.cursor)
            unforeseen_by = ("the step did not foresee" if unforeseen else
                             "whose place went to one the step did not foresee" if displaced
                             else None)
            if lent is None and not self._keep_under_peak(size, stream, unforeseen_by):
                return None
            self.step_misses += not foreseen
            if self.step_misses > 2 * len(self.template.requested):     # lost for good
                self._step_began(self.cursor)
        return lent

    def _above_peak(self, size: int, stream) -> bool:
        """Whether the pool would need new memory above the peak for this request (its cache
        has no block for it)."""
        pool = self.pool
        return pool.stats.current("reserved_bytes") + size > self.peak_before \
            and not pool._strategy.serves_from_cache(size, stream)

    def _keep_under_peak(self, size: int, stream, unforeseen_by: str | None = None) -> bool:
        """Before the pool serves a request beside the plan: if it needs new memory above the
        peak, the arena's idle pages go back first, since the pool's holes and the arena's must
        not add up; if that is not enough, the plan is given up (False). A request the step did
        not foresee (`unforeseen_by` says how: a batch of a length not seen, before the sizes
        were known to vary) refuses the template, to be learned again, rather than ending
        prediction."""
        pool = self.pool
        if self._above_peak(size, stream):
            self.arena.unmap_idle_pages()
            self.pages_given = self.pages_given or unforeseen_by is not None
            if pool.stats.current("reserved_bytes") + size > self.peak_before:
                if unforeseen_by is None or self.layout.provisional:
                    self._give_up()
                elif self._varies(self.cursor):     # more sizes vary than the plan knew
                    self._stand_aside()
                    self.step_hits = self.step_misses = 0    # judged after a step followed
                    return True
                else:
                    self._refused(f"a request of {size} bytes {unforeseen_by} needs memory "
                                  f"above the peak of {self.peak_before} bytes")
                return False
        return True

    def _step_began(self, boundary: int) -> None:
        """A step boundary (at slot `boundary`): judge the last step; give idle pool pages back;
        a ready layout takes over here, where the fewest of the step's blocks are live in the
        pool."""
        template = self.template
        self.pages_given = False
        if self.arena is None and template is not None and not self.planning:
            followed = self.step_hits + self.step_misses
            live, before = self._live_bytes_now_and_a_step_ago(template)
            if followed < template.step_slots // 2:
                pass                                      # not a whole step seen yet
            elif self.step_hits < PROVEN * followed:
                if not self._varies(boundary):           # the program does not repeat it
                    self._refused(f"the last step followed the template for only "
                                  f"{self.step_hits / followed:.1%} of its requests")
                    return
                # (the sizes vary: follow a step with them before planning)
            elif live > before:
                # memory kept from step to step (a list of losses, say): the pool would have
                # to grow beside the plan, and the two would leave more holes than the pool alone
                self.note = (f"the stream's live bytes grew by {live - before} over the last "
                             "step: waiting for a step that keeps no memory")
            else:
                self._plan_and_take_over(boundary)
        elif self.serving:
            if self.arena.awaited:               # frees that were pending on other streams
                self.arena.claim()
            requests = self.step_hits + self.step_misses
            rate = self.step_hits / requests if requests else 1.0
            if self.pool.stats.peak("reserved_bytes") > self.peak_before:
                self.misses += 1                   # this request: the pool serves it
                self._give_up()
                return
            if rate < STALE:
                # a refusal: a period that is part of the step (a micro-batch) would be learned,
                # served and dropped again every step
                self._refused(f"the last step hit {rate:.0%}")
                return
            proven = rate >= PROVEN and requests >= self.template.step_slots // 2
            if proven:                         # refusals count those in a row
                self.refused_periods.clear()
            counting = self.template.extras and self._counted(self.template) is not None
            if proven and not counting:
                self.learner = None            # proven: stop paying for learning
            # (unless requests the template leaves out are told from others by counting)
            if self.layout.provisional and not self.planning:
                # served from a layout cut where it was proven, mid-step: plan the step again
                # cut here, where the fewest of its bytes are live, and hand over to it
                if self.ready is None:
                    self._start_planning(self.template, boundary)
                if self.ready is not None:
                    self._take_over(boundary)
            self.pool.release_idle_cache()
        self.step_hits = self.step_misses = 0

    def _position(self) -> int:
        """The request under way's position in a marked step: the followed stream's requests
        since the mark."""
        return self.requests - self.others - self.mark_at - 1

    def _at_its_position(self, template: Template, slot: int) -> bool:
        """Whether a request of another size than the marked step's `slot` expects is that
        slot's, in a batch of another length: it comes at the slot's position since the mark,
        and is the step's first or the step has strayed so already (`strays`, see
        _resize_to_strays)."""
        position = self._position()
        return template.offsets[slot] % template.step_period == position \
            and bool(self.strays or position == 0)

    def _stand_aside_for(self, size: int) -> None:
        """A request of a marked step larger than its slot's block needs new memory (a batch
        longer than the plan knew): the pool serves the rest of the step as it would without a
        plan, before its blocks and the plan's are mixed in the range (they would leave holes
        neither can use). The step is judged at the mark."""
        self._stand_aside()
        self.note = (f"a request of {size} bytes, larger than the block the step planned there, "
                     "needs new memory: the pool serves the rest of the step")

    def _resize_to_strays(self) -> None:
        """At a mark: if the step made as many requests as the template's, and those it did not
        foresee (`strays`) are its slots' at their positions, their sizes changed by a few
        factors (as `StepLearner` tells copies of a step), it was the step at another length.
        The template takes those sizes and the step counts as followed; a plan whose blocks
        are too small for them stands aside, to be planned again now."""
        template, strays = self.template, self.strays
        slots = {offset: slot for slot, offset in enumerate(template.offsets)}
        made = self._position() + 1                  # requests since the mark
        if made != template.step_period \
                or any(position not in slots for position in strays) \
                or not _scaled([template.sizes[slots[position]] for position in strays],
                               list(strays.values())):
            return
        sizes = list(template.sizes)
        for position, size in strays.items():
            for offset in range(position, template.period, made):    # each step it holds
                sizes[slots[offset]] = size
        grown = template.widened([sizes])
        if grown.sizes != template.sizes:       # a longer batch: planned again if it fits
            self.fallback = template
            if self.serving:
                self._stand_aside()
        self.template = grown
        self.step_hits, self.step_misses = made, 0
        self.note = (f"the step's sizes vary in {len(grown.varies)} of its {len(grown)} slots; "
                     + ("its planned blocks hold them" if self.serving else "planning the largest"))

    def _varies(self, boundary: int) -> bool:
        """The step strayed from the template: if only in sizes (the same requests in the same
        order, with another sequence length), follow the template made again with the slots
        whose sizes vary (`StepLearner._widen`), while more are found to. Whether it did."""
        if self.learner is None:
            return False
        known = self.template.varies
        self._refresh(boundary)
        if not self.template.varies > known:
            return False
        self.note = (f"the step's sizes vary in {len(self.template.varies)} of its "
                     f"{len(self.template)} slots; following the largest")
        return True

    def _may_take_over_here(self, template: Template, slot: int) -> bool:
        """Between cuts, while no arena serves: whether a layout planned for this slot is ready,
        or the template is proven (half a step followed at 99%, live bytes not growing): then
        it need not wait for a cut (a recording of two steps ends before the next one)."""
        if self.arena is not None or self.planning:
            return False
        if self.ready is not None:     # (made at a slot that is no cut once the template was
            return self.ready.boundary == slot      # made again: it takes over there)
        if not self.between_cuts or self.refused_periods or self.learner is None:
            return False               # (a program that strayed once is judged at cuts)
        followed = self.step_hits + self.step_misses
        if followed < template.step_slots // 2 or self.step_hits < PROVEN * followed:
            return False
        before = self.learner.live_allocations_ago(template.step_period)
        return before is None or self.learner.live_bytes <= before

    def _plan_and_take_over(self, boundary: int, provisional: bool = False) -> None:
        """Plan the template cut at slot `boundary` (where the stream is), unless blocks of it
        are live with lifetimes still unknown; take over if the layout is ready (in line)."""
        if self.ready is None:
            boundary = self._refresh(boundary)
            if boundary is None:
                return
            if self.template.unknown:
                # a plan that left them to the pool would need room beside it
                self.note = (f"waiting a step for the lifetimes of {self.template.unknown} "
                             "blocks still live")
                return
            self._start_planning(self.template, boundary, provisional)
        if self.ready is not None:
            self._take_over(boundary)

    def _live_bytes_now_and_a_step_ago(self, template: Template) -> tuple[int, int]:
        """At a step boundary: the stream's live bytes now and at the last boundary (or, if
        none was seen, a step's allocations ago); equal when unknown (learning stopped)."""
        learner = self.learner
        if learner is None:
            return 0, 0
        live, before = learner.live_bytes, self.boundary_live
        if before is None:
            before = learner.live_allocations_ago(template.step_period)
        self.boundary_live = live
        return live, live if before is None else before

    def _give_up(self) -> None:
        """The pool's own blocks leave holes the arena cannot use (state made during the first
        step, between its temporaries): with the arena, reserved memory would pass the peak. A
        layout cut in mid-step, from half a followed step, may be the template's fault: a
        refusal."""
        if self.layout is not None and self.layout.provisional:
            self._refused(f"the layout cut in mid-step would raise peak reserved memory above "
                          f"{self.peak_before} bytes")
            return
        self._drop(f"prediction would raise peak reserved memory above {self.peak_before} bytes "
                   "(the pool's blocks leave holes the arena cannot use): the normal pool "
                   "serves from now on")
        self.learner = None

    def _drop(self, why: str, relearn: bool = True) -> None:
        self._retire_arena()
        self.dropped, self.fallback = self.template, None
        self.template = self.layout = self.ready = None
        self.step_hits = self.step_misses = 0
        self.note = why
        if relearn:                 # a pause (_pause) learns nothing until it ends
            self._learn_afresh()

    # --- the pool's other needs -----------------------------------------------------------

    def release_if_idle(self) -> int:
        """empty_cache / out of memory: give back the arena if no planned block is live (the
        layout takes over again at the next step boundary). Bytes released."""
        if self.arena is None or self.arena.live_starts:
            return 0
        before = self.pool.stats.current("reserved_bytes")
        self.arena.release()
        self.arena, self.ready, self.layout, self.serving = None, self.layout, None, False
        return before - self.pool.stats.current("reserved_bytes")

    def retire(self) -> None:
        """predictive turned off: stop serving; the arena goes when its last block is freed."""
        self._drop("predictive pre-allocation is off")
        self.learner = None

    def close(self) -> None:
        """The pool closes (every block has been freed)."""
        for arena in self.arenas():
            arena.release()
        self.arena, self.draining, self.serving = None, [], False

    def arenas(self) -> list[StepArena]:
        return ([self.arena] if self.arena is not None else []) + self.draining

    def views(self):
        return [view for arena in self.arenas() for view in arena.views()]

    def refine(self, blocks):
        for arena in self.arenas():
            blocks = arena.refine(blocks)
        return blocks

    def stats(self) -> dict:
        served = self.hits + self.misses
        return {"prediction.hits": self.hits, "prediction.misses": self.misses,
                "prediction.hit_rate": self.hits / served if served else 0.0,
                "prediction.plans": self.plans,
                "prediction.arena_bytes": sum(arena.size for arena in self.arenas())}


def _grown(template: Template, slot: int, size: int) -> Template:
    """`template` with slot `slot` grown to `size` bytes (a new template: a layout holds the old)."""
    sizes = list(template.sizes)
    sizes[slot] = size
    return template.widened([sizes])


def _same_blocks(template: Template, other: Template) -> bool:
    """Whether a layout of `template` places `other`'s blocks too (the same sizes, lifetimes
    and step)."""
    return (template.sizes, template.starts, template.ends, template.length) == \
        (other.sizes, other.starts, other.ends, other.length)
