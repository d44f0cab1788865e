"""Predictive pre-allocation for steps whose tensor shapes change (a sequence length drawn per
batch): the same requests in the same order, with other sizes. One plan holds the largest size
each varying slot has asked for; a longer sequence than any seen widens it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from npumem.alloc.settings import AllocatorSettings
from npumem.alloc.step_learner import StepLearner, Template, _scaled
from npumem.trace import read_trace
from npumem.whatif.replay import replay

from .test_predictive import (POOL_KINDS, STEP, assert_no_overlap, checked_with_lag, make_pool,
                              run_step)


def shaped(length: int, step=STEP) -> list[tuple[int, int]]:
    """`step` for a batch of sequence length `length` (4 is STEP itself): a third of its
    requests are weights-sized (fixed), a third grow with the length, a third with its square
    (attention scores)."""
    return [(size if index % 3 == 2 else
             size * length // 4 if index % 3 == 0 else size * length * length // 16, lifetime)
            for index, (size, lifetime) in enumerate(step)]


def run_lengths(pool, lengths, step=STEP, marked=True) -> list[float]:
    """One step per length (marked with `mark_step` if `marked`); the hit rate of each step."""
    rates, predictor = [], pool.predictor
    for length in lengths:
        before = (predictor.hits, predictor.misses) if predictor is not None else (0, 0)
        run_step(pool, shaped(length, step), check=assert_no_overlap)
        if marked:
            pool.mark_step()
        if predictor is not None:
            hits, misses = predictor.hits - before[0], predictor.misses - before[1]
            rates.append(hits / (hits + misses) if hits + misses else 0.0)
    return rates


def peak_reserved(lengths, expandable: bool, predictive: bool, step=STEP, marked=True) -> int:
    pool = make_pool(predictive=predictive, expandable=expandable)
    run_lengths(pool, lengths, step, marked)
    peak = pool.memory_stats()["reserved_bytes.all.peak"]
    pool.close()
    return peak


def random_lengths(count: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice([3, 4, 6]) for _ in range(count)]


LENGTHS = random_lengths(16, 7)
RECORDINGS = Path(__file__).parent / "data" / "cpu_recordings"


@POOL_KINDS
def test_marked_steps_of_varying_length_are_served_from_one_plan(expandable):
    pool = make_pool(expandable=expandable)
    rates = run_lengths(pool, LENGTHS)
    predictor = pool.predictor
    assert predictor.took_over_at is not None, predictor.note
    assert predictor.template.varies, "the slots that grow with the length vary"
    assert set(predictor.template.varies) == {slot for slot in range(len(STEP)) if slot % 3 != 2}
    assert min(rates[-8:]) == 1.0, rates
    assert pool.memory_stats()["allocated_bytes.all.current"] == 0
    pool.close()
    assert peak_reserved(LENGTHS, expandable, True) <= peak_reserved(LENGTHS, expandable, False)


@pytest.mark.parametrize("expandable", [True, False], ids=["expandable pool", "segment pool"])
def test_a_recorded_encoder_with_a_length_per_batch_is_served_from_one_plan(expandable):
    """bench/record_workloads.py's encoder_varlen (a PyTorch encoder trained 16 steps on
    batches of 48, 64 or 96 tokens, recorded on the CPU): served from one plan, never above
    the pool's own peak."""
    events = list(read_trace(RECORDINGS / "encoder_varlen.jsonl.gz"))
    default = replay(events, "pool", AllocatorSettings(expandable_segments=expandable))
    result = replay(events, "pool",
                    AllocatorSettings(predictive=True, expandable_segments=expandable))
    assert result.prediction_hit_rate >= 0.99, result.notes
    assert result.peak_reserved_bytes <= default.peak_reserved_bytes


def test_a_step_of_varying_length_is_found_without_marks():
    """Without marks the period is found where two batches of one length follow each other;
    the copies of the step before it, of other lengths, show which slots vary."""
    step = STEP * 4                  # long enough for GRAM + VERIFY inside one step
    lengths = random_lengths(20, 3)
    pool = make_pool()
    rates = run_lengths(pool, lengths, step, marked=False)
    predictor = pool.predictor
    assert predictor.took_over_at is not None, predictor.note
    assert len(step) % len(predictor.template) == 0 and predictor.template.varies
    assert min(rates[-6:]) == 1.0, rates
    pool.close()
    with_plan, without = (peak_reserved(lengths, True, predictive, step, marked=False)
                          for predictive in (True, False))
    assert with_plan <= without


@POOL_KINDS
def test_a_longer_sequence_than_any_seen_widens_the_plan(expandable):
    """The plan serves lengths 3 and 4; the first batch of length 6 outgrows it: the pool
    serves the rest of that step, and the plan is made again for 6 from then on."""
    lengths = [3, 4] * 5 + [6] * 5 + [3, 4]
    pool = make_pool(expandable=expandable)
    rates = run_lengths(pool, lengths)
    predictor = pool.predictor
    assert predictor.plans >= 2, predictor.note
    assert all(planned >= size for planned, (size, _) in zip(predictor.template.sizes, shaped(6)))
    assert min(rates[-4:]) == 1.0, rates
    assert pool.memory_stats()["allocated_bytes.all.current"] == 0
    pool.close()
    assert peak_reserved(lengths, expandable, True) <= peak_reserved(lengths, expandable, False)


@POOL_KINDS
@pytest.mark.parametrize("lengths", [[4, 4, 7, 6] * 2, [3, 3, 4, 3, 3, 3, 3, 4, 3, 3] * 2],
                         ids=["longer then shorter", "a longer one now and then"])
def test_a_marked_step_longer_than_the_plan_knew_is_the_pools_from_its_first_request(
        lengths, expandable):
    """A marked step that asks for more at its first request than the plan's block there: the
    plan stands aside before the pool serves it, so the pool packs the step as it would
    without a plan (a page above its peak when the two shared the range), and at the mark
    the template takes the step's sizes: every later step is served."""
    pool = make_pool(expandable=expandable)
    rates = run_lengths(pool, lengths)
    longer = lengths.index(max(lengths[:3]), 2)          # the first step longer than the plan
    assert min(rates[longer + 1:]) == 1.0, (rates, pool.predictor.note)
    pool.close()
    assert peak_reserved(lengths, expandable, True) <= peak_reserved(lengths, expandable, False)


@POOL_KINDS
def test_a_marked_step_shorter_than_the_plan_knew_is_served_from_its_blocks(expandable):
    """Shorter batches than the plan was made for: each request at its slot's position since
    the mark fits the slot's block, which serves it; the plan is not made again."""
    pool = make_pool(expandable=expandable)
    rates = run_lengths(pool, [4] * 6)
    plans = pool.predictor.plans
    rates = run_lengths(pool, [3] * 4 + [4, 3, 2])
    assert rates[0] >= 0.9 and min(rates[1:]) == 1.0, rates
    assert pool.predictor.plans == plans, pool.predictor.note
    assert pool.memory_stats()["allocated_bytes.all.current"] == 0
    pool.close()


def test_an_unmarked_longer_batch_that_takes_the_arenas_pages_does_not_end_prediction():
    """Unmarked steps of 2 units, then 7 and 6: the 7's first requests, which the step did not
    foresee, need memory above the peak, so the arena's idle pages go back for the pool to
    serve them, and the plan's next request finds its pages gone. That used to end prediction
    for good; it now refuses the template, as the unforeseen request would have, and the
    steps after are served from a plan sized for the largest batch."""
    pool = make_pool()
    rates = run_lengths(pool, [2, 2, 2, 2, 7, 6, 2] * 2, STEP * 2, marked=False)
    assert rates[-5:] == [1.0] * 5, (rates, pool.predictor.note)
    pool.close()


def crossing_batch_loop(lengths, predictive: bool, lag: int = 0) -> tuple[list[int], int]:
    """A marked loop whose batch outlives its step (made before the last one is freed), with
    40 activations, two thirds of them growing with the length; a plan is handed over `lag`
    requests after it was asked for. The requests served from the plan in each step, and the
    peak reserved."""
    activations = [(i % 7 + 1) * 65536 + i * 512 for i in range(40)]
    pool, batch, served = make_pool(predictive=predictive), None, []
    if predictive:
        pool.predictor.lag = lag
    for length in lengths:
        hits = pool.predictor.hits if predictive else 0
        new = pool.allocate((1 << 18) * length)
        if batch is not None:
            pool.deallocate(batch)
        batch, blocks = new, []
        for i, size in enumerate(activations):
            blocks.append(pool.allocate(size if i % 3 == 2 else size * length // 4))
            if predictive:
                pool.predictor.hand_over_held()
        for pointer in reversed(blocks):
            pool.deallocate(pointer)
        pool.mark_step()
        served.append(pool.predictor.hits - hits if predictive else 0)
    pool.deallocate(batch)
    peak = pool.memory_stats()["reserved_bytes.all.peak"]
    pool.close()
    return served, peak


def test_a_longer_batch_whose_plan_does_not_fit_leaves_the_shorter_ones_theirs():
    """Five steps of 4 units, one of 6, then 4s and 3s: the plan for the 6's sizes, placed
    around the batch the pool holds, needs a page more than the pool's peak; the plan that
    served the 4s is made again, and serves every step after the 6 (it was refused, and
    learned again, before). Handed over 30 requests late, as from a planner thread, a plan
    serves again by the end (none did: each shorter batch made the template anew, and the
    layout waiting for it was thrown away though its blocks were the same)."""
    lengths = [4] * 5 + [6] + [4] * 3 + [3] * 3
    served, peak = crossing_batch_loop(lengths, True)
    assert served[6:] == [41] * 6, served
    assert peak <= crossing_batch_loop(lengths, False)[1]
    served, peak = crossing_batch_loop(lengths, True, lag=30)
    assert served[-1] == 41, served
    assert peak <= crossing_batch_loop(lengths, False)[1]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 8), min_size=2, max_size=10), expandable=st.booleans())
@example(lengths=[3, 3, 4, 3, 3], expandable=True)
def test_marked_steps_of_any_lengths_never_raise_the_peak(lengths, expandable):
    """Marked steps at random lengths, the sequence played twice: the peak reserved with
    prediction is never above the pool's own (before the plan stood aside for a longer batch,
    it was a page above on 6 of 1,200 such programs)."""
    lengths = lengths * 2
    assert peak_reserved(lengths, expandable, True, STEP * 2) <= \
        peak_reserved(lengths, expandable, False, STEP * 2)


@POOL_KINDS
def test_runs_of_one_length_cost_steps_only_at_the_first_change(expandable):
    """Batches bucketed by length come in runs. A plan proven on the first run is refused at
    the second; the template learned again keeps the sizes of the one given up, so later
    changes of length cost nothing."""
    pool = make_pool(expandable=expandable)
    rates = run_lengths(pool, [4] * 6 + [3] * 6 + [4, 3] * 3)
    assert min(rates[1:6]) == 1.0 and min(rates[10:]) == 1.0, rates
    pool.close()


def learned(steps, skip: int = 0) -> StepLearner:
    """A learner that saw `steps` (each a list of (size, lifetime in requests), everything
    freed at its end), each marked; made after the first `skip` allocations (in mid-step)."""
    learner, pointer = StepLearner(mid_step=skip > 0), 0
    for step in steps:
        due: dict[int, list[int]] = {}
        for index, (size, lifetime) in enumerate(step):
            for freed in due.pop(index, []):
                learner.on_free(freed)
            pointer += 1
            if pointer > skip:
                learner.on_alloc(pointer, size, size)
            due.setdefault(index + lifetime, []).append(pointer)
        for freed in sorted(pointer for pointers in due.values() for pointer in pointers):
            learner.on_free(freed)
        learner.mark()
    return learner


def test_the_learner_widens_a_template_to_its_copies_and_refuses_other_steps():
    learner = learned(shaped(length) for length in [4, 6, 3, 4])
    template = learner.refreshed(learner._template(len(STEP), 2 * len(STEP), 0, marked=True))
    assert template.varies == {slot for slot in range(len(STEP)) if slot % 3 != 2}
    assert template.sizes == [size for size, _ in shaped(6)]
    assert [size for size, _ in shaped(6)] == learner.sizes_at(template, len(STEP))
    # a window whose blocks live otherwise is not a copy
    assert learner.sizes_at(template, len(STEP) + 1) is None


def test_a_copy_begun_before_the_learner_counts_where_it_was_seen():
    """A learner made in mid-step (after a template was refused) sees only the end of the step
    under way, a batch of another length: a copy of the step, with its sizes where it saw them,
    if it saw half the step's slots."""
    longer, first = [size for size, _ in shaped(6)], len(STEP) - 3
    shorter = [size for size, _ in shaped(4)]
    learner = learned([shaped(6), shaped(4), shaped(4)], skip=3)
    template = learner._template(first, first + len(STEP), 0, marked=True)
    assert learner.sizes_at(template, first - len(STEP)) == shorter[:3] + longer[3:]
    assert template.sizes[3:] == longer[3:] and min(template.varies) == 3
    learner = learned([shaped(6), shaped(4), shaped(4)], skip=len(STEP) - 3)
    late = learner._template(3, 3 + len(STEP), 0, marked=True)
    assert learner.sizes_at(late, 3 - len(STEP)) is None and not late.varies      # 3 slots seen


def test_two_halves_with_unrelated_sizes_are_not_one_step_of_varying_shape():
    assert _scaled([100, 200, 300, 7], [150, 300, 450, 7])          # one factor: a length
    assert _scaled([100, 200, 7], [150, 450, 7])                    # a length and its square
    assert not _scaled(list(range(1, 21)), list(range(21, 41)))     # each its own


def test_widening_marks_the_slots_that_differ_and_keeps_the_largest_size():
    template = Template([10, 20], [10, 20], [0, 1], [1, 2], 2, 0, 2)
    widened = template.widened([[10, 30], None, [10, 15]])           # None: not a copy
    assert widened.sizes == [10, 30] and widened.varies == {1}
    assert template.widened([[10, 20]]) is template                  # nothing differs


@POOL_KINDS
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(1, 8), min_size=4, max_size=14),
       detours=st.lists(st.tuples(st.integers(0, 13), st.integers(0, 11), st.integers(1, 4 << 20),
                                  st.integers(1, 30)), max_size=4),
       marked=st.booleans(), lag=st.sampled_from([0, 0, 30]))
@example(lengths=[1, 2, 6, 3], detours=[], marked=True, lag=0)
def test_varying_lengths_and_detours_stay_correct(lengths, detours, marked, lag, expandable):
    """Steps of random lengths, some with an extra request at a random place, kept for a few
    requests or past the planned blocks after it (a block the arena lent it then holds
    theirs), plans handed over at once or `lag` requests later (as from a planner thread): no
    two live blocks ever overlap, and everything frees cleanly. (The example is the first plan
    that needed a new segment beside the stream's: its block was carved before it was free.)"""
    step = STEP * 2
    pool = make_pool(expandable=expandable)
    pool.predictor.lag = lag
    for number, length in enumerate(lengths * 2):
        body = shaped(length, step)
        for at_step, index, size, lifetime in detours:
            if at_step == number:
                body.insert(index, (size, lifetime))
        run_step(pool, body, check=checked_with_lag)
        if marked:
            pool.mark_step()
    stats = pool.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0 and stats["allocation.all.current"] == 0
    pool.close()


@settings(max_examples=60, deadline=None)
@given(step=st.lists(st.tuples(st.integers(1, 1 << 20), st.integers(1, 12), st.booleans()),
                     min_size=4, max_size=30),
       factors=st.lists(st.integers(1, 5), min_size=2, max_size=5))
def test_copies_of_a_step_vary_exactly_where_their_sizes_scale(step, factors):
    """A random step (size, lifetime in requests, whether the size scales with the length)
    repeated at random lengths and marked: the template made again from the history varies at
    exactly the scaling slots whose sizes differed, and holds the largest size each had."""
    steps = [[(size * factor if scales else size, lifetime) for size, lifetime, scales in step]
             for factor in factors]
    runs = [[size for size, _ in run] for run in steps]
    learner = learned(steps)
    template = learner.refreshed(learner._template(0, len(step), 0, marked=True))
    assert template.varies == {slot for slot in range(len(step))
                               if len({run[slot] for run in runs}) > 1}
    assert template.sizes == [max(run[slot] for run in runs) for slot in range(len(step))]
