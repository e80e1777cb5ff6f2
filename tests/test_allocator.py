"""Caching-allocator model (rules of CUDACachingAllocator.cpp) and the meta-device training-step trace."""
from __future__ import annotations

import numpy as np
import pytest

from perf4sight.features.aggregate import FEATURE_NAMES, SIM_FEATURES, feature_matrix, network_features
from perf4sight.features.alloc_trace import (attach_simulation, ensure_simulation, record_events, record_runs,
                                             simulate, with_blas_workspaces)
from perf4sight.features.allocator import (_ALLOC_FREE, ALLOC, FREE, STEP, AllocTrace, CachingAllocator, _fused,
                                          _repeat_plan, round_size, segment_size)
from perf4sight.ir.schema import NetworkDescription, Node

MIB = 1 << 20


def test_rounding_and_segment_sizes():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    assert segment_size(MIB) == 2 * MIB            # small pool
    assert segment_size(MIB + 512) == 20 * MIB     # 1-10 MiB: 20 MiB segment
    assert segment_size(11 * MIB) == 12 * MIB      # large: rounded up to 2 MiB


def test_small_pool_packs_and_reuses():
    a = CachingAllocator()
    blocks = [a.malloc(1000) for _ in range(4)]    # 4 x 1024 B in one 2 MiB segment
    assert a.reserved == 2 * MIB and a.allocated == 4 * 1024
    a.free(blocks[1])
    a.free(blocks[2])                              # merged with its free neighbour: a 2048 B hole
    b = a.malloc(2000)
    assert b.ptr == blocks[1].ptr and a.reserved == 2 * MIB


def test_large_pool_best_fit_split_and_no_split_rule():
    a = CachingAllocator()
    x = a.malloc(3 * MIB)                          # carves a 20 MiB segment; 17 MiB left cached
    assert a.reserved == 20 * MIB and a.allocated == 3 * MIB
    y = a.malloc(16 * MIB + 1)                     # remainder of 1 MiB - 512 B is not split off: whole block
    assert a.reserved == 20 * MIB and a.allocated == 3 * MIB + 17 * MIB
    a.free(y)
    a.free(x)
    assert a.allocated == 0 and a.reserved == 20 * MIB   # cached, never returned
    z = a.malloc(12 * MIB)                         # served from the merged 20 MiB block, split
    assert a.reserved == 20 * MIB and z.size == 12 * MIB
    a.malloc(30 * MIB)
    assert a.reserved == 50 * MIB and a.peak_reserved == 50 * MIB



def test_a_split_block_s_rest_takes_its_place_among_the_free_blocks_by_size_then_address():
    """A request served from a free block larger than it leaves the rest free, in the pool's order (size, then
    address) whether the rest is at least the request (it takes the block's place) or smaller (it goes before the
    blocks it is smaller than); best fit then finds the smallest, lowest block."""
    a = CachingAllocator()
    held = [a.malloc(n * MIB) for n in (12, 14, 3, 16)]  # 12 and 14 MiB segments; a 20 MiB one, all of it held
    for handle in held[:2]:
        a.free(handle)  # free whole segments of 12 and 14 MiB

    def free_blocks() -> list[tuple[int, int]]:
        large = a._pools[0]
        assert large == sorted(large) and set(large) | set(a._pools[1]) == set(a._free)
        return [(key >> 48, a._free[key][0]) for key in large]

    seg12, seg14 = held[0].ptr, held[1].ptr
    assert free_blocks() == [(12 * MIB, seg12), (14 * MIB, seg14)]
    low = a.malloc(4 * MIB)  # the 12 MiB block split: its 8 MiB rest (> 4 MiB) in its place, before the 14 MiB one
    assert low.ptr == seg12 and free_blocks() == [(8 * MIB, seg12 + 4 * MIB), (14 * MIB, seg14)]
    high = a.malloc(9 * MIB)  # the 14 MiB block split: its 5 MiB rest (< 9 MiB) before the 8 MiB one
    assert high.ptr == seg14 and free_blocks() == [(5 * MIB, seg14 + 9 * MIB), (8 * MIB, seg12 + 4 * MIB)]
    assert a.malloc(5 * MIB).ptr == seg14 + 9 * MIB and free_blocks() == [(8 * MIB, seg12 + 4 * MIB)]

def test_empty_cache_returns_only_wholly_free_segments():
    a = CachingAllocator()
    kept, gone = a.malloc(1000), a.malloc(12 * MIB)   # a 2 MiB small segment, a 12 MiB large one
    part = a.malloc(3 * MIB)                           # 20 MiB segment, 17 MiB of it left free
    a.free(gone)
    a.empty_cache()
    assert a.reserved == 2 * MIB + 20 * MIB and a.peak_reserved == 34 * MIB   # peaks keep their values
    large, small = a._pools  # the free blocks left: the rest of each segment in use, in its pool
    assert [key >> 48 for key in large] == [17 * MIB] and [key >> 48 for key in small] == [2 * MIB - 1024]
    assert set(large) | set(small) == set(a._free)
    a.free(part)
    a.empty_cache()
    assert a.reserved == 2 * MIB and a.allocated == kept.size


def test_a_replay_refuses_addresses_past_its_keys_range():
    a = CachingAllocator()
    a._next_ptr = (1 << 48) - 4 * MIB  # a free block's key keeps its address below 2**48: past it, an error
    with pytest.raises(OverflowError, match="256 TiB"):
        a.malloc(12 * MIB)


def test_an_allocation_freed_at_once_is_one_event_of_the_replay():
    """An ALLOC whose next event frees its tensor is one event of the replay, with the ALLOC's size, and so is one
    whose FREE follows FREEs of other tensors alone (its FREE first: FREEs commute); an ALLOC freed after another
    ALLOC is not."""
    kinds = [STEP, ALLOC, FREE, ALLOC, ALLOC, FREE, FREE, ALLOC, FREE, ALLOC, ALLOC, FREE, FREE, FREE]
    ids = [0, 1, 1, 2, 3, 2, 3, 4, 4, 5, 6, 7, 9, 6]
    fused_kinds, fused_ids, index = _fused(kinds, ids, list(range(14)))
    assert fused_kinds == [STEP, _ALLOC_FREE, ALLOC, _ALLOC_FREE, FREE, _ALLOC_FREE, ALLOC, _ALLOC_FREE, FREE, FREE]
    assert fused_ids == [0, 1, 2, 3, 2, 4, 5, 6, 7, 9] and index.tolist() == [0, 1, 3, 4, 5, 7, 9, 10, 11, 12]


def test_an_allocation_freed_at_once_leaves_the_allocator_as_the_two_events_do():
    """Random requests of both pools, each either kept a while or freed at once: run as an ALLOC and a FREE, or as
    one :data:`_ALLOC_FREE`, the allocator ends in the same state with the same peaks after every event, new
    segments (cached whole), blocks handed out whole and zero-byte requests included."""
    rng = np.random.default_rng(7)
    apart, fused = CachingAllocator(), CachingAllocator()
    live_apart: dict = {}
    live_fused: dict = {}
    kept: list[int] = []
    pairs = 0
    for t in range(1, 3000):
        size = int(round_size(int(rng.choice([0, 300, 5000, 700_000, 3 * MIB, 15 * MIB + 7, 40 * MIB])
                                  * rng.uniform(0.5, 1.0)))) if rng.random() > 0.02 else 0
        if kept and rng.random() < 0.45:
            gone = kept.pop(int(rng.integers(len(kept))))
            apart.run([FREE], [gone], [0], live_apart)
            fused.run([FREE], [gone], [0], live_fused)
        elif rng.random() < 0.4:
            pairs += 1
            apart.run([ALLOC, FREE], [t, t], [size, 0], live_apart)
            fused.run([_ALLOC_FREE], [t], [size], live_fused)
        else:
            kept.append(t)
            apart.run([ALLOC], [t], [size], live_apart)
            fused.run([ALLOC], [t], [size], live_fused)
        assert fused.snapshot(live_fused) == apart.snapshot(live_apart)
        assert (fused.peak_reserved, fused.peak_allocated) == (apart.peak_reserved, apart.peak_allocated)
        assert fused._next_ptr == apart._next_ptr
    assert pairs > 500 and apart.peak_reserved > 100 * MIB


def _replayed_event_by_event(trace: AllocTrace, batch: int) -> tuple[float, float]:
    """The trace's figures (bytes) under its protocol with each event run on its own through ``malloc_rounded`` and
    ``free``, every repeat of the last step spelled out (a step that frees only what it allocates)."""
    sizes = [int(round_size(s)) if s > 0 else 0 for s in trace.sizes(batch).tolist()]
    kinds, ids = trace.kind.tolist(), trace.tensor.tolist()
    marks = [i for i, k in enumerate(kinds) if k == STEP]
    spans = [(0, marks[0])] + list(zip(marks, marks[1:] + [len(kinds)]))
    spans += [spans[-1]] * trace.repeat_last
    alloc, live, peaks = CachingAllocator(), {}, []
    for n, (start, end) in enumerate(spans):
        alloc.reset_peaks()
        if n > 0 and trace.protocol == "perf4sight":
            alloc.empty_cache()
            alloc.reset_peaks()
        for i in range(start, end):
            if kinds[i] == ALLOC and sizes[i]:
                live[ids[i]] = alloc.malloc_rounded(sizes[i])
            elif kinds[i] == FREE and ids[i] in live:
                alloc.free(live.pop(ids[i]))
        if n > 0:
            peaks.append((alloc.peak_reserved, alloc.peak_allocated))
    if trace.protocol == "run_peak":
        return float(max(p[0] for p in peaks)), float(max(p[1] for p in peaks))
    weights = [2.0 if n == 0 and trace.protocol == "perf4sight" else 1.0 for n in range(len(peaks))]
    return tuple(float(np.dot(weights, [p[k] for p in peaks]) / sum(weights)) for k in (0, 1))


@pytest.mark.parametrize("zoo, side", [("small_swin_v2", 36), ("small_maxvit", 64), ("resnet18", 32)])
def test_the_replay_gives_the_figures_of_its_events_run_one_by_one(zoo, side):
    """The replay (its steps' allocations freed at once as single events, a steady step's repeats cut short) gives
    the peaks of every event run on its own through the allocator, at batch sizes that put the activations in
    either pool."""
    from perf4sight.networks.zoo import describe_zoo
    small = {"small_swin_v2": lambda: _small_swin(side, True), "small_maxvit": lambda: _small_maxvit(side)}
    desc = small[zoo]() if zoo in small else describe_zoo(zoo, [3, side, side], num_classes=10)
    trace = simulate(desc, method="model")
    assert _fused(trace.kind, trace.tensor, np.arange(len(trace.kind)))[0].count(_ALLOC_FREE) > 20
    for batch in (1, 6, 40):
        assert trace.replay(batch) == _replayed_event_by_event(trace, batch)


def test_the_backward_pass_orders_a_node_s_temporaries_sums_and_gradients_as_written_down():
    """The allocation model's backward pass, written as one loop for speed: a node's temporaries before its first
    gradient (freed once it is allocated), each gradient's own temporaries (freed last first, after its kernel), its
    scratch after the gradients, a broadcast input's gradient summed down after them (input order, not the
    computing order), then the incoming gradient and the saved tensors dropped, and AccumulateGrad marks; every id
    and size spelled out."""
    from perf4sight.features.alloc_backward import _backward
    from perf4sight.features.alloc_values import ACCUMULATED, FLOAT, _GradFn, _Memory

    mem = _Memory()
    saved = mem.new(32, "saved")  # id 1, held by the root node alone
    leaf = _GradFn([], [("param", 0)], [40], ["aten.k0"], [0], [None])
    root = _GradFn([saved], [("fn", 0), None, ("param", 1)], [100, 0, 8], ["aten.a", None, "aten.b"], [2, 0, 1],
                   [120, None, 64], before=[(16, "aten.pre")], around=[[(4, "aten.t1"), (5, "aten.t2")], [], []],
                   scratch=[(12, "aten.scr")])
    grads = _backward([leaf, root], 1, mem)
    assert grads == {1: 10, 0: 11}
    assert mem.events == [(ALLOC, 1, 32, "saved"), (ALLOC, 2, FLOAT, "aten.ones_like.default"),
                          (ALLOC, 3, 16, "aten.pre"), (ALLOC, 4, 64, "aten.b"), (FREE, 3, 0, ""),
                          (ALLOC, 5, 4, "aten.t1"), (ALLOC, 6, 5, "aten.t2"), (ALLOC, 7, 120, "aten.a"),
                          (FREE, 6, 0, ""), (FREE, 5, 0, ""),
                          (ALLOC, 8, 12, "aten.scr"), (FREE, 8, 0, ""),
                          (ALLOC, 9, 100, "aten.sum.dim_IntList"), (FREE, 7, 0, ""),
                          (ALLOC, 10, 8, "aten.sum.dim_IntList"), (FREE, 4, 0, ""),
                          (FREE, 1, 0, ""), (ACCUMULATED, 1, 0, ""),
                          (ALLOC, 11, 40, "aten.k0"), (FREE, 9, 0, ""), (ACCUMULATED, 0, 0, ""),
                          (FREE, 2, 0, "")]


def test_contiguous_strides_are_remembered_for_tuples_and_given_for_lists():
    """The allocation model's contiguous strides, remembered per shape (a MaxViT asks 1,900 times for a few hundred
    shapes): a list gives what its tuple gives, and every shape its own strides."""
    from perf4sight.features.alloc_strides import _strides

    assert _strides((2, 3, 4, 5)) == _strides([2, 3, 4, 5]) == (60, 20, 5, 1)
    assert _strides((5, 4, 3, 2)) == (24, 6, 2, 1)
    assert _strides(()) == ()
    assert _strides([7]) == (1,)


def test_the_remembered_layout_helpers_answer_as_they_work_it_out():
    """_view, _normal, _iterated_full and _ordered remember their answers (a MaxViT's step asks them 800 times for
    about a hundred layouts, a DenseNet-201's _ordered 3,600 times): for every permutation of three small shapes'
    dimensions, each reshape into merged or split dimensions, the answer remembered, asked again and asked with lists
    is the one worked out afresh."""
    from itertools import permutations

    from perf4sight.features.alloc_strides import (_iterated_full, _iterated_full_of, _normal, _normal_of, _ordered,
                                                   _ordered_of, _strided_view, _strides, _view)
    assert _view((2, 3, 4), (12, 1, 3), (6, 4)) == (False, None)  # a transpose: no view merges it
    assert _view((2, 3, 4), (12, 4, 1), (6, 4)) == (True, None)
    assert not _ordered((2, 3, 4), (12, 1, 3)) and _ordered((2, 3, 4), (12, 4, 1)) and _ordered((2, 3, 4), None)
    assert _ordered((2, 1, 4), (4, 1, 1)) and _ordered((2, 1, 4), (4, 9, 1))  # a dimension of size 1: no matter
    for shape in [(2, 3, 4, 5), (2, 1, 4, 5), (6, 1, 1)]:
        for perm in permutations(range(len(shape))):
            laid = _strides(tuple(shape[d] for d in perm))
            strides = tuple(laid[perm.index(d)] for d in range(len(shape)))
            news = [(shape[0] * shape[1], *shape[2:]), (*shape[:-2], shape[-2] * shape[-1]), (shape[0], 1, *shape[1:]),
                    (prod_of(shape),)]
            for new in news:
                fresh = _strided_view.__wrapped__(shape, strides, new)
                assert _view(shape, strides, new) == _view(shape, strides, new) == fresh
                assert _view(list(shape), list(strides), list(new)) == fresh
            fresh = _normal_of.__wrapped__(shape, strides)
            assert _normal(shape, strides) == _normal(shape, strides) == fresh
            assert _normal(list(shape), list(strides)) == (None if fresh is None else list(strides))  # given back
            operands = [strides, None]
            fresh = _iterated_full_of.__wrapped__(shape, operands)
            assert _iterated_full(shape, operands) == _iterated_full(list(shape), operands) == fresh
            assert _iterated_full(shape, [list(strides), None]) == fresh
            fresh = _ordered_of.__wrapped__(shape, strides)
            assert _ordered(shape, strides) == _ordered(list(shape), list(strides)) == fresh
            hits = _ordered_of.cache_info().hits
            assert _ordered(shape, strides) == fresh and _ordered_of.cache_info().hits == hits + 1


def prod_of(shape: tuple[int, ...]) -> int:
    out = 1
    for size in shape:
        out *= size
    return out


def test_the_collector_is_paused_while_the_model_writes_events_and_the_replay_runs(monkeypatch):
    """The cyclic garbage collector does not run while the allocation model writes a step down or the replay runs it
    (tens of thousands of small objects: a collection every few hundred), and runs again after, unless it was off."""
    import gc

    from perf4sight.features import alloc_trace
    from perf4sight.networks.zoo import describe_zoo
    seen = []
    real_run, real_modelled = CachingAllocator.run, alloc_trace._modelled
    monkeypatch.setattr(CachingAllocator, "run", lambda self, *a: seen.append(gc.isenabled()) or real_run(self, *a))
    monkeypatch.setattr(alloc_trace, "_modelled", lambda *a: seen.append(gc.isenabled()) or real_modelled(*a))
    desc = describe_zoo("resnet18", [3, 32, 32], num_classes=10)
    assert gc.isenabled()
    record_events(desc, 2, method="model")
    simulate(desc, method="model").replay(37)  # a batch size no other test replays: not in the trace's memo
    assert len(seen) > 2 and not any(seen) and gc.isenabled()
    gc.disable()
    try:
        simulate(desc, method="model").replay(38)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_is_paused_while_the_events_become_the_trace_s_arrays_and_are_dropped(monkeypatch):
    """simulate turns the recorded events into arrays and drops them with the collector paused (a dozen young
    collections there before, in a process holding torch's objects), and it runs again after."""
    import gc

    from perf4sight.features import alloc_trace
    from perf4sight.networks.zoo import describe_zoo
    seen = []
    real_trace = alloc_trace.AllocTrace
    monkeypatch.setattr(alloc_trace, "AllocTrace", lambda *a, **k: seen.append(gc.isenabled()) or real_trace(*a, **k))
    desc = describe_zoo("resnet18", [3, 32, 32], num_classes=7)  # a description no other test simulates: not cached
    assert gc.isenabled()
    trace = simulate(desc, method="model")
    assert seen == [False] and gc.isenabled() and isinstance(trace, real_trace) and len(trace.kind) > 100


def test_the_collector_stays_paused_from_the_model_s_events_to_the_trace_s_arrays(monkeypatch):
    """simulate keeps the collector paused from the allocation model's first event until its events are the trace's
    arrays and dropped (a young collection walked every event as the model's pause ended, ~0.5 ms of a MaxViT's);
    a network the model does not cover is traced with the collector as the caller has it, on, and that trace is
    the one simulate gives."""
    import gc

    from torch import nn

    from perf4sight.features import alloc_trace
    from perf4sight.ir.from_torch import describe
    from perf4sight.networks.zoo import describe_zoo
    seen = []
    real_modelled, real_record, real_trace = alloc_trace._modelled, alloc_trace._record, alloc_trace.AllocTrace
    real_enable = gc.enable
    monkeypatch.setattr(alloc_trace, "_modelled", lambda *a: seen.append(("model", gc.isenabled())) or
                        real_modelled(*a))
    monkeypatch.setattr(alloc_trace, "_record", lambda *a: seen.append(("trace", gc.isenabled())) or real_record(*a))
    monkeypatch.setattr(alloc_trace, "AllocTrace", lambda *a, **k: seen.append(("arrays", gc.isenabled())) or
                        real_trace(*a, **k))
    monkeypatch.setattr(gc, "enable", lambda: seen.append(("collector on", True)) or real_enable())
    desc = describe_zoo("resnet18", [3, 32, 32], num_classes=9)  # a description no other test simulates: not cached
    assert len(simulate(desc).kind) > 100
    assert seen == [("model", False), ("arrays", False), ("collector on", True)] and gc.isenabled()
    seen.clear()
    module = nn.Sequential(nn.Conv2d(3, 8, 3), nn.LocalResponseNorm(5), nn.Flatten(), nn.Linear(8 * 14 * 14, 5))
    lrn = describe(module, [3, 16, 16], "lrn_net")
    trace = simulate(lrn)  # the model refuses the norm at once; then the trace, the collector on
    assert seen == [("model", False), ("collector on", True), ("trace", True), ("arrays", False),
                    ("collector on", True)]
    traced = [(k, t, size, "") for k, t, size, _ in record_events(lrn, 65521, method="trace")]
    assert _as_replayed(_events_of(trace)) == _as_replayed(traced)


def _events_of(trace: AllocTrace) -> list:
    """A trace's events at its probe batch, as record_events gives them (the aten ops left empty)."""
    sizes = trace.sizes(65521).tolist()
    return [(k, t, s, "") for k, t, s in zip(trace.kind.tolist(), trace.tensor.tolist(), sizes)]


def test_a_replay_leaves_no_cycles_for_the_collector():
    """The replay's blocks, linked to their neighbours both ways, are unlinked when it is done: they go with their
    last reference, none left for the cyclic collector (thousands of blocks, a few milliseconds a MaxViT's 4 batch
    sizes in a process holding torch's objects)."""
    import gc

    from perf4sight.networks.zoo import describe_zoo
    base = simulate(describe_zoo("resnet18", [3, 32, 32], num_classes=10), method="model")
    for protocol in ("run_peak", "perf4sight"):
        trace = AllocTrace("cycles", base.kind, base.tensor, base.const, base.per_sample, protocol=protocol)
        gc.collect()
        gc.disable()
        try:
            assert trace.replay(9) and gc.collect() == 0
        finally:
            gc.enable()


@pytest.mark.parametrize("zoo", ["small_swin_v2", "small_maxvit", "resnet18"])
def test_a_repeat_that_meets_its_steps_run_stops_there_with_the_figures_of_every_event(zoo, monkeypatch):
    """A repeat of the last step that finds the allocator, at one of the looks (every ``_MARK_EVENTS`` events, here
    16), as the step's run left it there, stops: its peaks are those of its events so far and of the run's from
    there. Under each protocol, the figures are those of every event run one by one; some repeats stop part way (the
    repeats that find the small segments their step made, which would run no event, run as the others)."""
    from perf4sight.features import allocator
    from perf4sight.networks.zoo import describe_zoo
    monkeypatch.setattr(allocator, "_MARK_EVENTS", 16)
    monkeypatch.setattr(allocator, "_grown_by_whole_segments", lambda *a: False)
    ran = []
    real_run = CachingAllocator.run
    monkeypatch.setattr(CachingAllocator, "run", lambda self, kinds, *a: ran.append(len(kinds)) or real_run(
        self, kinds, *a))
    small = {"small_swin_v2": lambda: _small_swin(36, True), "small_maxvit": lambda: _small_maxvit(64)}
    desc = small[zoo]() if zoo in small else describe_zoo(zoo, [3, 32, 32], num_classes=10)
    base = simulate(desc, method="model")
    trace = AllocTrace("marks", base.kind, base.tensor, base.const, base.per_sample)  # a memo of its own
    runs = trace._fused_runs()
    through, step = sum(len(kinds) for kinds, _, _ in runs), len(runs[-1][0])  # events to the last step's end
    part_way = 0
    for protocol in ("run_peak", "perf4sight", "step_mean"):
        view = trace.with_protocol(protocol)
        for batch in (1, 6, 40, 64):
            expected = _replayed_event_by_event(view, batch)
            ran.clear()
            assert view.replay(batch) == pytest.approx(expected, rel=1e-12)
            part_way += through < sum(ran) < through + step
    assert part_way > 0


class _BothLooks:
    """A look at the allocator as the replay takes it (the untouched first tensors left out) beside the whole state:
    each comparison checks that both give the same answer."""

    def __init__(self, short: tuple, whole: tuple, verdicts: list[bool]):
        self.short, self.whole, self.verdicts = short, whole, verdicts

    def __getitem__(self, index: int | slice) -> object:  # the replay's other readers of a look read the short one
        return self.short[index]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _BothLooks):
            return False
        verdict = self.short == other.short
        assert verdict == (self.whole == other.whole)
        self.verdicts.append(verdict)
        return verdict


@pytest.mark.parametrize("zoo", ["small_maxvit", "resnet18"])
def test_looks_that_leave_out_the_untouched_tensors_compare_as_the_whole_state(zoo, monkeypatch):
    """The replay's looks at the allocator (before each run of the last step, every ``_MARK_EVENTS`` events of its
    runs, here 16) leave out the first live tensors that no event of the last step or of its repeats touches (weights,
    gradients kept, momentum), and those within a run the list of live tensors (a repeat that began with the marked
    run's): every comparison of two looks answers as the whole states' comparison does, under each protocol, with
    gradients kept and with gradients freed; some looks are shorter and some match."""
    from perf4sight.features import allocator
    from perf4sight.features.step_runtime import StepRuntime
    from perf4sight.networks.zoo import describe_zoo
    monkeypatch.setattr(allocator, "_MARK_EVENTS", 16)
    verdicts: list[bool] = []
    left_out: list[int] = []
    real_snapshot = CachingAllocator.snapshot

    def both(self, live, skip=0, tensors=True):  # noqa: ANN001, ANN202
        left_out.extend(list(live)[:skip])
        return _BothLooks(real_snapshot(self, live, skip, tensors), real_snapshot(self, live), verdicts)

    monkeypatch.setattr(CachingAllocator, "snapshot", both)
    desc = _small_maxvit(64) if zoo == "small_maxvit" else describe_zoo(zoo, [3, 32, 32], num_classes=10)
    for update in ({}, StepRuntime(foreach=False, grads_to_none=True).traced_update()):
        base = simulate(desc, method="model", **update)
        trace = AllocTrace("looks", base.kind, base.tensor, base.const, base.per_sample, update=base.update)
        left_out.clear()
        for protocol in ("run_peak", "perf4sight", "step_mean"):
            for batch in (1, 6, 40):
                trace.with_protocol(protocol).replay(batch)
        last_step = set(trace.tensor[np.flatnonzero(trace.kind == STEP)[-1]:].tolist())  # a repeat's are the same
        assert left_out and not last_step & set(left_out)
    assert True in verdicts and False in verdicts


def test_the_untouched_prefix_ends_at_the_first_tensor_touched():
    """The looks leave out the live tensors before the first one that an event to come touches, and no more."""
    from perf4sight.features.allocator import _untouched_prefix
    live = {tensor: [tensor * 512, 512, True, True, None, None] for tensor in (4, 9, 2, 7, 5)}
    assert _untouched_prefix(live, {2, 5}) == 2
    assert _untouched_prefix(live, {4}) == 0
    assert _untouched_prefix(live, {11}) == 5
    assert _untouched_prefix({}, {1}) == 0


@pytest.mark.parametrize("zoo", ["small_swin_v2", "small_maxvit", "resnet18", "mobilenet_v2"])
def test_a_repeat_that_finds_the_small_segments_its_step_made_runs_no_event_with_the_figures_of_every_event(
        zoo, monkeypatch):
    """A repeat of the last step that finds the allocator as the step's run found it but for small segments the run
    made, free and whole, runs none of its events: its peaks are the run's. Under each protocol, the figures are
    those of every event run one by one, and some repeats, found so, run no event."""
    from perf4sight.features import allocator
    from perf4sight.networks.zoo import describe_zoo
    ran, found = [], []
    real_run, real_found = CachingAllocator.run, allocator._grown_by_whole_segments
    monkeypatch.setattr(CachingAllocator, "run", lambda self, kinds, *a: ran.append(len(kinds)) or real_run(
        self, kinds, *a))
    monkeypatch.setattr(allocator, "_grown_by_whole_segments", lambda *a: found.append(real_found(*a)) or found[-1])
    small = {"small_swin_v2": lambda: _small_swin(36, True), "small_maxvit": lambda: _small_maxvit(64)}
    desc = small[zoo]() if zoo in small else describe_zoo(zoo, [3, 32, 32], num_classes=10)
    base = simulate(desc, method="model")
    trace = AllocTrace("found", base.kind, base.tensor, base.const, base.per_sample)  # a memo of its own
    # events to the last step's end, but for the setup's first ones that every replay starts from (_setup_start)
    through = sum(len(kinds) for kinds, _, _ in trace._fused_runs()) - trace._setup_start()[2]
    none_run = 0
    for protocol in ("run_peak", "perf4sight", "step_mean"):
        view = trace.with_protocol(protocol)
        for batch in (1, 6, 40, 64, 100):
            expected = _replayed_event_by_event(view, batch)
            ran.clear()
            found.clear()
            assert view.replay(batch) == pytest.approx(expected, rel=1e-12)
            none_run += found == [True] and sum(ran) == through
    assert none_run > 0


def test_a_repeat_takes_the_shortcut_only_where_its_figures_are_the_steps_spelled_out(monkeypatch):
    """ConvNeXt T at 64x64 with the gradients freed, under perf4sight's protocol at a batch of 64: a repeat let take
    the shortcut of a step that grew the cache by small segments wherever its step ran before it gives other
    figures; the replay's are those of the steps spelled out."""
    from perf4sight.features import allocator
    from perf4sight.features.step_runtime import StepRuntime
    from perf4sight.networks.zoo import describe_zoo
    desc = describe_zoo("convnext_tiny", [3, 64, 64], num_classes=10)
    base = simulate(desc, method="model", **StepRuntime(foreach=False, grads_to_none=True).traced_update())
    spelled = record_events(desc, 64, steps=4, method="model", set_to_none=True)
    spelled_trace = AllocTrace("spelled", np.array([e[0] for e in spelled], dtype=np.int8),
                               np.array([e[1] for e in spelled]), np.array([float(e[2]) for e in spelled]),
                               np.zeros(len(spelled)), repeat_last=0, protocol="perf4sight")

    def replayed() -> tuple[float, float]:
        return AllocTrace("freed", base.kind, base.tensor, base.const, base.per_sample, protocol="perf4sight",
                          update=base.update).replay(64)

    assert replayed() == spelled_trace.replay(64)
    monkeypatch.setattr(allocator, "_grown_by_whole_segments", lambda *a: True)
    assert replayed() != spelled_trace.replay(64)


def test_an_allocator_grown_only_by_whole_small_segments_is_told_apart():
    """The repeat's shortcut holds where the allocator differs from the run's start only by small segments the run
    made, each free and whole, and their bytes reserved: not where a large segment was made, a small one is still in
    use, the segments were there before the run, or more bytes are reserved."""
    from perf4sight.features.allocator import _grown_by_whole_segments

    def after(requests: list[int], keep_last: bool = False) -> tuple[tuple, int, tuple]:
        """Looks at an allocator before and after ``requests`` are made and freed (the last kept with ``keep_last``),
        and the address of its next segment before."""
        alloc, live = CachingAllocator(), {}
        alloc.run([ALLOC, ALLOC], [1, 2], [4 * MIB, 4096], live)  # a large and a small segment
        start, start_next = alloc.snapshot(live), alloc._next_ptr
        ids = list(range(10, 10 + len(requests)))
        alloc.run([ALLOC] * len(ids), ids, requests, live)
        freed = ids[:-1] if keep_last else ids
        alloc.run([FREE] * len(freed), freed, [0] * len(freed), live)
        return start, start_next, alloc.snapshot(live)

    start, start_next, grown = after([MIB] * 4)  # the first in the small segment there, then two segments made
    assert grown[0] == start[0] + 2 * 2 * MIB and _grown_by_whole_segments(start, start_next, grown)
    assert _grown_by_whole_segments(*after([MIB // 2, 3 * 512]))  # nothing made: as it was
    assert not _grown_by_whole_segments(*after([17 * MIB]))  # a large segment made
    assert not _grown_by_whole_segments(*after([MIB] * 4, keep_last=True))  # a small one still in use
    assert not _grown_by_whole_segments(start, start_next + 16 * MIB, grown)  # segments made before
    assert not _grown_by_whole_segments(start, start_next, (grown[0] + 2 * MIB,) + grown[1:])  # more reserved


def test_an_allocator_grown_by_whole_large_segments_is_told_apart_by_what_the_run_found():
    """A run that made a large segment (20 MiB, for a request of 3 MiB) and left it free and whole: the repeat's
    shortcut holds where no request of the run, before the segment was made, found a larger block that the segment
    fits too (a repeat would take the segment there instead), as the run's record of its requests tells; without the
    record it does not hold."""
    from perf4sight.features.allocator import _grown_by_whole_segments

    def after(first: int) -> tuple:
        """Looks at an allocator with a free 40 MiB segment before and after a run of ``first`` bytes, what is left
        of that segment, and 3 MiB (freed), and the run's record."""
        alloc, live, record = CachingAllocator(), {}, []
        alloc.run([ALLOC, FREE], [1, 1], [40 * MIB, 0], live)
        start, start_next = alloc.snapshot(live), alloc._next_ptr
        alloc.run([ALLOC, ALLOC, ALLOC], [10, 11, 12], [first, 40 * MIB - first, 3 * MIB], live, record)
        alloc.run([FREE] * 3, [10, 11, 12], [0] * 3, live)
        return start, start_next, alloc.snapshot(live), record, alloc._free

    start, start_next, grown, record, free = after(40 * MIB)  # the whole 40 MiB, then nothing: the segment made
    assert record == [3 * MIB, -20 * MIB] and grown[0] == start[0] + 20 * MIB
    assert _grown_by_whole_segments(start, start_next, grown, record, free)
    assert not _grown_by_whole_segments(start, start_next, grown)  # no record
    assert not _grown_by_whole_segments(*after(2 * MIB))  # 2 MiB found in 40 MiB: a repeat takes the new 20 MiB


def test_a_repeat_that_finds_large_segments_its_step_made_runs_no_event_with_the_figures_of_every_event(monkeypatch):
    """ResNet-18 at 64x64, batches of 24 and 32: the last step's run makes 20 MiB segments and leaves them free and
    whole; its repeat, which finds them so, runs none of its events (it ran them all before 2026-12-01), and every
    protocol's figures are those of every event run one by one."""
    from perf4sight.networks.zoo import describe_zoo
    ran = []
    real_run = CachingAllocator.run
    monkeypatch.setattr(CachingAllocator, "run", lambda self, kinds, *a: ran.append(len(kinds)) or real_run(
        self, kinds, *a))
    base = simulate(describe_zoo("resnet18", [3, 64, 64], num_classes=10), method="model")
    trace = AllocTrace("large", base.kind, base.tensor, base.const, base.per_sample)  # a memo of its own
    for protocol in ("run_peak", "step_mean"):  # perf4sight's empties the cache: no segment is found again
        view = trace.with_protocol(protocol)
        through = sum(len(kinds) for kinds, _, _ in view._fused_runs()) - view._setup_start()[2]
        for batch in (24, 32):
            expected = _replayed_event_by_event(view, batch)
            ran.clear()
            assert view.replay(batch) == pytest.approx(expected, rel=1e-12)
            assert sum(ran) == through


def test_a_repeat_after_a_step_that_frees_the_gradients_meets_the_repeat_before_it(monkeypatch):
    """With ``zero_grad(set_to_none=True)`` a repeat of the last step runs other events than the step (it frees the
    gradients its previous run left): the second repeat looks for the first's course (here every 16 events). The
    figures are those of the steps spelled out, every protocol."""
    from perf4sight.features import allocator
    from perf4sight.features.step_runtime import StepRuntime
    from perf4sight.networks.zoo import describe_zoo
    monkeypatch.setattr(allocator, "_MARK_EVENTS", 16)
    desc = describe_zoo("resnet18", [3, 32, 32], num_classes=10)
    base = simulate(desc, method="model", **StepRuntime(foreach=False, grads_to_none=True).traced_update())
    freed = AllocTrace("marks", base.kind, base.tensor, base.const, base.per_sample)  # a memo of its own
    looked = []
    real_marked_run = allocator._marked_run
    monkeypatch.setattr(allocator, "_marked_run", lambda *a, **k: looked.append(1) or real_marked_run(*a, **k))
    for batch in (1, 8, 40):
        spelled = record_events(desc, batch, steps=4, method="model", set_to_none=True)
        spelled_trace = AllocTrace("spelled", np.array([e[0] for e in spelled], dtype=np.int8),
                                   np.array([e[1] for e in spelled]), np.array([float(e[2]) for e in spelled]),
                                   np.zeros(len(spelled)), repeat_last=0)
        for protocol in ("run_peak", "perf4sight", "step_mean"):
            assert freed.with_protocol(protocol).replay(batch) == spelled_trace.with_protocol(protocol).replay(batch)
    assert looked


@pytest.mark.parametrize("foreach", [False, True])
def test_a_repeat_after_a_step_that_frees_the_gradients_meets_the_step_s_course(foreach, monkeypatch):
    """With ``zero_grad(set_to_none=True)`` the first repeat of the last step frees other gradients than the step did
    (the step's own), then runs the step's events: where it finds the allocator, at a look (every 16 events here), as
    the step's run left it there, the rest runs as the step's did, and so do the later repeats: it stops there. Some
    repeats stop before their end, and the figures are those of the steps spelled out, every protocol."""
    from perf4sight.features import allocator
    from perf4sight.features.step_runtime import StepRuntime
    from perf4sight.networks.zoo import describe_zoo
    monkeypatch.setattr(allocator, "_MARK_EVENTS", 16)
    ran = []
    real_run = CachingAllocator.run
    monkeypatch.setattr(CachingAllocator, "run", lambda self, kinds, *a: ran.append(len(kinds)) or real_run(
        self, kinds, *a))
    desc = describe_zoo("resnet18", [3, 32, 32], num_classes=10)
    update = StepRuntime(foreach=foreach, grads_to_none=True).traced_update()
    base = simulate(desc, method="model", **update)
    freed = AllocTrace("marks", base.kind, base.tensor, base.const, base.per_sample, update=base.update)
    runs = freed._fused_runs()
    assert runs[-1] is not freed._repeat_run()  # it frees the gradients the previous run left
    stopped = 0
    for batch in (1, 8, 40):
        spelled = record_events(desc, batch, steps=4, method="model", **update)
        spelled_trace = AllocTrace("spelled", np.array([e[0] for e in spelled], dtype=np.int8),
                                   np.array([e[1] for e in spelled]), np.array([float(e[2]) for e in spelled]),
                                   np.zeros(len(spelled)), repeat_last=0)
        for protocol in ("run_peak", "perf4sight", "step_mean"):
            view, expected = freed.with_protocol(protocol), spelled_trace.with_protocol(protocol).replay(batch)
            view._setup_start()
            ran.clear()
            assert view.replay(batch) == expected
            through = sum(len(kinds) for kinds, _, _ in runs) - view._setup_start()[2]
            stopped += sum(ran) < through + len(runs[-1][0])  # the first repeat stopped before its end
    assert stopped > 0


@pytest.mark.parametrize("foreach", [False, True])
def test_a_repeat_that_finds_the_segments_its_step_made_from_a_look_on_stops_there(foreach, monkeypatch):
    """With ``zero_grad(set_to_none=True)`` the first repeat of the last step may find the allocator, at a look, as the
    step's run left it there but for the segments that run made later, each free and whole: it then takes the step's
    course from there (each request that made a segment finds it) and stops. ResNet-18 at 32x32, looks every 16
    events: some repeats stop so, and run fewer events than with that shortcut barred; every protocol's figures are
    those of the steps spelled out either way."""
    from perf4sight.features import allocator
    from perf4sight.features.step_runtime import StepRuntime
    from perf4sight.networks.zoo import describe_zoo
    monkeypatch.setattr(allocator, "_MARK_EVENTS", 16)
    ran, met = [], []
    real_run, real_grown_from = CachingAllocator.run, allocator._grown_from
    monkeypatch.setattr(CachingAllocator, "run", lambda self, kinds, *a: ran.append(len(kinds)) or real_run(
        self, kinds, *a))
    desc = describe_zoo("resnet18", [3, 32, 32], num_classes=10)
    update = StepRuntime(foreach=foreach, grads_to_none=True).traced_update()
    base = simulate(desc, method="model", **update)
    fewer = 0
    for batch in (1, 8, 40):
        spelled = record_events(desc, batch, steps=4, method="model", **update)
        spelled_trace = AllocTrace("spelled", np.array([e[0] for e in spelled], dtype=np.int8),
                                   np.array([e[1] for e in spelled]), np.array([float(e[2]) for e in spelled]),
                                   np.zeros(len(spelled)), repeat_last=0)
        for protocol in ("run_peak", "perf4sight", "step_mean"):
            expected, counts = spelled_trace.with_protocol(protocol).replay(batch), []
            for grown_from in (lambda *a: met.append(real_grown_from(*a)) or met[-1], lambda *a: False):
                monkeypatch.setattr(allocator, "_grown_from", grown_from)
                trace = AllocTrace("found", base.kind, base.tensor, base.const, base.per_sample, protocol=protocol,
                                   update=base.update)  # a memo of its own
                ran.clear()
                assert trace.replay(batch) == expected
                counts.append(sum(ran))
            fewer += counts[0] < counts[1]
    assert True in met and fewer > 0


def test_the_last_step_runs_without_looks_where_its_repeat_is_expected_to_find_the_allocator_as_it_was(monkeypatch):
    """Where the first repeat of the last step finds the allocator as the step's run found it (every repeat the same),
    that run's looks go unused: under perf4sight's protocol (the cache emptied before every step) the run takes none,
    until a repeat does not find it so. Where that guess is wrong (forced here), the repeat runs with the looks
    instead: every protocol's figures are those of every event run one by one either way."""
    from perf4sight.features import allocator
    from perf4sight.networks.zoo import describe_zoo
    marked = []
    real_marked_run = allocator._marked_run
    monkeypatch.setattr(allocator, "_marked_run", lambda *a, **k: marked.append(1) or real_marked_run(*a, **k))
    base = simulate(describe_zoo("resnet18", [3, 32, 32], num_classes=10), method="model")
    for protocol in ("perf4sight", "run_peak", "step_mean"):
        trace = AllocTrace("looks", base.kind, base.tensor, base.const, base.per_sample, protocol=protocol)
        for batch in (1, 6, 40):
            expected = _replayed_event_by_event(trace, batch)
            for guess in (True, False):
                trace._memo.clear()
                trace._returns = guess
                marked.clear()
                assert trace.replay(batch) == expected
                assert guess or marked  # no guess: the step's run takes looks
                if protocol == "perf4sight":
                    assert (marked == []) == guess and trace._returns == guess  # a guess made held


def test_a_repeat_that_finds_the_marked_runs_state_but_for_segments_made_later_stops_at_that_look(monkeypatch):
    """A repeat that does not find the allocator as the marked run found it (that run made a 30 MiB segment that a
    12 MiB request before it would take) may find it, at a look (every 2 events here), as that run left it there but
    for the segments it made later, free and whole, which no later request would take before they were made: the rest
    runs as the marked run did, each segment found where it was made, so it stops there. Every protocol's figures are
    those of every event run one by one; under run_peak and step_mean the repeat stops after its first two events."""
    from perf4sight.features import allocator
    monkeypatch.setattr(allocator, "_MARK_EVENTS", 2)
    ran = []
    real_run = CachingAllocator.run
    monkeypatch.setattr(CachingAllocator, "run", lambda self, kinds, *a: ran.append(len(kinds)) or real_run(
        self, kinds, *a))
    # step 1 leaves a free 40 MiB segment; the last step: 12 MiB taken and freed, then 32 MiB from the 40 and 30 MiB in
    # a segment of its own (a repeat finds it for the 12 MiB, then again for the 30)
    events = [(ALLOC, 1, 4096), (STEP, 0, 0), (ALLOC, 2, 40 * MIB), (FREE, 2, 0), (STEP, 0, 0), (ALLOC, 3, 12 * MIB),
              (FREE, 3, 0), (ALLOC, 4, 32 * MIB), (ALLOC, 5, 30 * MIB), (FREE, 4, 0), (FREE, 5, 0)]
    kind, tensor, const = (np.array(column) for column in zip(*events))
    for protocol in ("run_peak", "step_mean", "perf4sight"):
        trace = AllocTrace("later", kind.astype(np.int8), tensor, const.astype(float), np.zeros(len(kind)),
                           protocol=protocol)
        expected = _replayed_event_by_event(trace, 1)
        ran.clear()
        assert trace.replay(1) == expected
        if protocol != "perf4sight":  # setup 1, step 1 2 (a pair), the last step 5 (two pairs), the repeat 2
            assert ran == [1, 2, 2, 2, 1, 2]


def test_a_large_segment_made_later_is_a_better_fit_only_between_a_request_and_what_it_took():
    """A large segment a run made, free and whole at the next run's look, is taken by a request before it was made
    (a repeat's course differs) where it fits the request and is smaller than the block the request found or the
    segment it made; a segment of any size (not 20 MiB alone) is told so from the run's record of its requests."""
    from perf4sight.features.allocator import _no_better_fit
    made_24 = [23 * MIB, -24 * MIB]  # a request of 23 MiB made a segment of 24 MiB
    assert _no_better_fit(made_24, [24 * MIB])
    assert _no_better_fit([12 * MIB, 30 * MIB] + made_24, [24 * MIB]) is False  # 12 MiB took 30: 24 fits better
    assert _no_better_fit([25 * MIB, 30 * MIB] + made_24, [24 * MIB])  # 25 MiB: 24 does not fit
    assert _no_better_fit([12 * MIB, 24 * MIB] + made_24, [24 * MIB])  # as large as what it found: it loses the tie
    assert _no_better_fit(made_24 + [12 * MIB, 30 * MIB], [24 * MIB])  # found after the segment was made
    three_made_20 = [3 * MIB, -20 * MIB]
    assert _no_better_fit(three_made_20 + [12 * MIB, -12 * MIB], [20 * MIB, 12 * MIB]) is False  # 12 < 20: better
    assert _no_better_fit([12 * MIB, -12 * MIB] + three_made_20, [20 * MIB, 12 * MIB])
    assert _no_better_fit(made_24, [20 * MIB]) is False  # the record made other segments


def _two_step_trace(protocol: str) -> AllocTrace:
    """Setup 1000 B; step 1 (the warm-up) 16 MiB at batch 8, freed; step 2 4 MiB at batch 8, freed."""
    kind = np.array([ALLOC, STEP, ALLOC, FREE, STEP, ALLOC, FREE], dtype=np.int8)
    tensor = np.array([1, 0, 2, 2, 0, 3, 3])
    const = np.array([1000.0, 0, 0, 0, 0, 0, 0])
    per = np.array([0.0, 0, 2 * MIB, 0, 0, MIB // 2, 0])
    return AllocTrace("t", kind, tensor, const, per, repeat_last=0, protocol=protocol)


def test_trace_replay_follows_the_profilers_protocol():
    # step 1: a 16 MiB segment; step 2 splits 4 MiB from the cached block, unless the cache was emptied
    res, alloc = _two_step_trace("run_peak").replay(8)          # the peak over the run
    assert (res, alloc) == (2 * MIB + 16 * MIB, 1024 + 16 * MIB)
    res, alloc = _two_step_trace("step_mean").replay(8)         # the mean of the per-step peaks
    assert (res, alloc) == (2 * MIB + 16 * MIB, 1024 + (16 * MIB + 4 * MIB) / 2)
    # perf4sight: the cache emptied before step 2, whose 4 MiB needs a new 20 MiB segment; own peaks,
    # the warm-up read twice
    res, alloc = _two_step_trace("perf4sight").replay(8)
    assert res == (2 * (2 * MIB + 16 * MIB) + (2 * MIB + 20 * MIB)) / 3
    assert alloc == 1024 + (2 * 16 * MIB + 4 * MIB) / 3
    tr = _two_step_trace("run_peak")
    assert tr.peaks_mb([8]).shape == (1, 2) and tr.with_protocol("run_peak") is tr
    assert tr.with_protocol("perf4sight").replay(8) == _two_step_trace("perf4sight").replay(8)
    assert tr.replay(8) == (2 * MIB + 16 * MIB, 1024 + 16 * MIB)  # a view's memo is its own
    with pytest.raises(ValueError, match="protocol"):
        tr.with_protocol("max")


def test_a_protocol_view_is_made_once_and_keeps_its_replays(monkeypatch):
    """A trace under another protocol is one object however often it is asked for (each fit asks again), so its
    memo holds: the second ask replays nothing."""
    tr = _two_step_trace("run_peak")
    first = tr.with_protocol("perf4sight").replay(8)
    runs = []
    real_run = CachingAllocator.run
    monkeypatch.setattr(CachingAllocator, "run", lambda self, *a: runs.append(1) or real_run(self, *a))
    again = tr.with_protocol("perf4sight")
    assert again is tr.with_protocol("perf4sight") and again.replay(8) == first and runs == []
    assert again.replay(16) and runs  # a batch size not replayed before is
    assert again.with_protocol("run_peak") is tr  # back to the trace itself, from the view


def _tiny(relu: str = "relu") -> NetworkDescription:
    nodes = [Node("input", "input", [], {}, [3, 16, 16]),
             Node("conv", "conv2d", ["input"], {"in_channels": 3, "out_channels": 8, "kernel_size": [3, 3],
                                                "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1],
                                                "groups": 1, "bias": False}, [8, 16, 16]),
             Node("bn", "batchnorm2d", ["conv"], {"num_features": 8}, [8, 16, 16]),
             Node("act", relu, ["bn"], {}, [8, 16, 16]),
             Node("pool", "adaptiveavgpool2d", ["act"], {"output_size": [1, 1]}, [8, 1, 1]),
             Node("flat", "flatten", ["pool"], {"start_dim": 1}, [8]),
             Node("fc", "linear", ["flat"], {"in_features": 8, "out_features": 10, "bias": True}, [10])]
    return NetworkDescription(name=f"tiny_{relu}", network="tiny", input_shape=[3, 16, 16], num_classes=10,
                              params=3 * 8 * 9 + 16 + 90, nodes=nodes, output="fc")


@pytest.mark.parametrize("relu", ["relu", "relu6"])
def test_meta_trace_is_linear_in_batch_and_balanced(relu):
    desc = _tiny(relu)
    ev = record_events(desc, 3)
    allocs = [e for e in ev if e[0] == ALLOC]
    assert sum(e[0] == STEP for e in ev) == 2
    assert any(e[3] == "aten.convolution.default" for e in allocs)
    assert not any("clone" in e[3] and e[2] == 3 * 8 * 16 * 16 * 4 for e in allocs)  # in-place ReLU6: no input copy
    tr = simulate(desc)
    act = tr.sizes(5)[(tr.kind == ALLOC)]
    assert (act == 5 * 8 * 16 * 16 * 4).any()       # conv output at batch 5, never traced at 5
    weights = tr.const[(tr.kind == ALLOC) & (tr.per_sample == 0)]
    assert weights.sum() >= 4 * desc.params         # weights (+ grads, momentum) do not scale
    res8, alloc8 = tr.replay(8)
    assert res8 >= alloc8 > 3 * 4 * desc.params and res8 % (2 * MIB) == 0


def test_features_carry_simulation():
    desc = _tiny()
    nf = network_features(desc)
    cols = [FEATURE_NAMES.index(n) for n in SIM_FEATURES]
    assert (feature_matrix(nf, [4])[0, cols] == 0).all()    # not simulated -> 0
    ensure_simulation([nf], ("one", "mem_analytic_mb"))       # model does not use it: nothing attached
    assert nf.sim is None
    ensure_simulation([nf], ("one", "sim_reserved_mb"))
    assert nf.sim is not None
    F = feature_matrix(attach_simulation(nf, desc), [4, 64])
    assert (F[:, cols] > 0).all() and F[1, cols[1]] > F[0, cols[1]]
    assert nf.sim.protocol == "run_peak"
    ensure_simulation([nf], ("one", "sim_reserved_mb"), "perf4sight")   # another profiler's reading: replaced
    assert nf.sim.protocol == "perf4sight" and nf.sim.tensor is simulate(desc).tensor   # the trace is reused


@pytest.mark.parametrize("zoo", ["resnet18", "mobilenet_v2", "squeezenet1_0", "shufflenet_v2_x1_0"])
def test_shape_only_kernels_leave_the_events_unchanged(zoo):
    """The trace's shortcuts (stand-ins for slow meta kernels, the SGD step written down, the second step
    derived from the first) record exactly the events of the full meta kernels with every step run
    through the real optimizer: same ops, same order, same bytes."""
    from perf4sight.networks.zoo import describe_zoo
    desc = describe_zoo(zoo, [3, 32, 32], num_classes=10)
    fast, full = record_events(desc, 3, fast=True, method="trace"), record_events(desc, 3, fast=False)
    assert len(fast) > 100 and fast == full
    # one model built once and run at two batch sizes: each run as if on a fresh model
    assert record_runs(desc, (3, 5), method="trace") == [fast, record_events(desc, 5, fast=False)]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_trace_of_a_description_with_frozen_parameters_runs_and_derives_its_steps(optimizer):
    """A description with frozen parameters (``frozen_parameters``, rebuilt frozen by to_torch) failed in the meta trace
    (where the allocation model leaves a network to it: then a spectral_norm hook's, say): the fast trace hooked every
    parameter's gradient ("cannot register a hook on a tensor that doesn't require gradient"), so its features could
    not be made. The frozen weight gets no gradient; the derived steps are the run ones, event for event."""
    from torch import nn

    from perf4sight.ir.from_torch import describe

    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                        nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    net[0].weight.requires_grad_(False)
    desc = describe(net, [3, 8, 8], name="frozen")
    assert desc.extra["frozen_parameters"] == ["_0.weight"]
    fast = record_events(desc, 2, steps=3, method="trace", optimizer=optimizer)
    assert fast == record_events(desc, 2, steps=3, fast=False, optimizer=optimizer)
    weight = 8 * 3 * 9 * 4
    assert not any(kind == ALLOC and size == weight and op == "aten.convolution_backward.default"
                   for kind, _, size, op in fast)  # no gradient of the frozen weight


def test_more_derived_steps_match_more_run_steps():
    from perf4sight.networks.zoo import describe_zoo
    desc = describe_zoo("mobilenet_v2", [3, 32, 32], num_classes=10)
    fast, full = record_events(desc, 2, steps=3, method="trace"), record_events(desc, 2, steps=3, fast=False)
    assert sum(e[0] == STEP for e in fast) == 3 and fast == full


@pytest.mark.parametrize("set_to_none", [False, True])
def test_derived_steps_add_a_restrided_gradient_into_the_grad_as_run_steps_do(set_to_none):
    """A ConvNeXt downsampling convolution's weight gradient is channels-last: the first step copies it to the
    weight's strides to make the ``.grad`` (``new_empty_strided``); a later step adds it into the ``.grad`` (no copy),
    unless ``zero_grad(set_to_none=True)`` freed that. The derived later steps are the run ones, event for event."""
    desc = _small_convnext()
    fast = record_events(desc, 2, steps=3, method="trace", set_to_none=set_to_none)
    full = record_events(desc, 2, steps=3, fast=False, set_to_none=set_to_none)
    copies = []  # per step
    for kind, _, _, op in fast:
        if kind == STEP:
            copies.append(0)
        elif op == "aten.new_empty_strided.default":
            copies[-1] += 1
    assert copies == ([1, 1, 1] if set_to_none else [1, 0, 0])
    assert fast == full


@pytest.mark.parametrize("zoo", ["mobilenet_v2", "squeezenet1_0", "shufflenet_v2_x1_0"])
def test_one_prime_batch_trace_equals_two_batch_solve(zoo):
    """The default trace (one run at a prime batch, sizes split by divisibility, SGD events written down)
    equals the exact two-batch solve through the full meta kernels and the real optimizer."""
    from perf4sight.networks.zoo import describe_zoo
    desc = describe_zoo(zoo, [3, 32, 32], num_classes=10)
    fast, exact = simulate(desc, method="trace"), simulate(desc, (2, 4), fast=False)
    for field in ("kind", "tensor", "const", "per_sample"):
        assert np.array_equal(getattr(fast, field), getattr(exact, field)), field
    assert (fast.per_sample > 0).sum() > 50 and (fast.const > 0).sum() > 50


def test_replay_stops_repeating_a_step_that_leaves_the_allocator_unchanged():
    """A replay with the steady step repeated (``repeat_last``) gives the figures of a trace that
    spells every repeat out, whether or not the step's first run still grows the cache."""
    from perf4sight.networks.zoo import describe_zoo
    tr = simulate(describe_zoo("mobilenet_v2", [3, 32, 32], num_classes=10))
    last = int(np.flatnonzero(tr.kind == STEP)[-1])
    spelled = AllocTrace("spelled", *(np.concatenate([a, a[last:], a[last:]]) for a in
                                      (tr.kind, tr.tensor, tr.const, tr.per_sample)), repeat_last=0)
    for bs in (1, 5, 16, 33):
        assert tr.replay(bs) == spelled.replay(bs)


def _as_replayed(events):
    """Events as the replay sees them: zero-byte allocations dropped (they get no block), storages
    renumbered in allocation order, each run of consecutive frees taken as a set (frees commute).
    The allocating aten op is kept."""
    zero = {t for k, t, s, _ in events if k == ALLOC and s == 0}
    names: dict[int, int] = {}
    out, frees = [], set()
    for kind, t, size, op in events:
        if t in zero and kind != STEP:
            continue
        if kind == FREE:
            frees.add(names[t])
            continue
        if frees:
            out.append(("free", frozenset(frees)))
            frees = set()
        if kind == ALLOC:
            names[t] = len(names)
            out.append(("alloc", size, op))
        else:
            out.append(("step",))
    return out + ([("free", frozenset(frees))] if frees else [])


def _edge_cases():
    """Ops and patterns beside the zoo's: pooling the input (no gradient there), a convolution with bias,
    dropout, a non-global adaptive pool, a three-way cat from one input, an add of two branches,
    ReLU6, linear layers with and without bias."""
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Edge(nn.Module):
        def __init__(self):
            super().__init__()
            self.pool = nn.MaxPool2d(2)
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.Dropout(0.3))
            self.branches = nn.ModuleList([nn.Conv2d(8, 4, 1),
                                           nn.Sequential(nn.Conv2d(8, 4, 3, padding=1), nn.BatchNorm2d(4)),
                                           nn.AvgPool2d(3, 1, 1)])
            self.fuse = nn.Sequential(nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU6(inplace=True))
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 16, bias=False), nn.ReLU(),
                                      nn.Linear(16, 10))

        def forward(self, x):
            x = self.stem(self.pool(x))
            y = self.fuse(torch.cat([b(x) for b in self.branches], 1))
            return self.head(y + x)

    import torch
    return describe(Edge(), [3, 16, 16], "edge")


@pytest.mark.parametrize("zoo", ["resnet18", "mobilenet_v2", "squeezenet1_0", "densenet121", "googlenet", "vgg11",
                                 "resnext50_32x4d", "mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2_x1_0",
                                 "regnet_y_400mf", "lraspp_mobilenet_v3_large", "edge"])
def test_allocation_model_writes_down_the_traced_events(zoo):
    """The events worked out from the description (no torch) are the ones the meta-device run records,
    step by step, and replay to the same peaks."""
    from perf4sight.networks.zoo import describe_zoo
    desc = _edge_cases() if zoo == "edge" else describe_zoo(zoo, [3, 64, 64], num_classes=10)
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert len(model) > 50 and _as_replayed(model) == _as_replayed(traced)
    sims = [simulate(desc, method=m) for m in ("model", "trace")]
    assert sims[0].peaks_mb([1, 7, 64]).tolist() == sims[1].peaks_mb([1, 7, 64]).tolist()


@pytest.mark.parametrize("zoo", ["mobilenet_v2", "edge"])
def test_relu6_that_keeps_a_clone_of_its_input_is_written_down_as_this_torch_traces_it(zoo):
    """PyTorch >= 1.10 runs an in-place ReLU6 (``hardtanh_``) keeping a clone of its input for the backward
    (pytorch/pytorch#95432; seen on an H100: mobilenet_v2's allocated peak was 31% above the replay of the
    old rule). The model writes that down as the meta trace of this torch records it, and it costs one
    activation per ReLU6 more than the old rule, which the trace carries."""
    from perf4sight.networks.zoo import describe_zoo
    desc = _edge_cases() if zoo == "edge" else describe_zoo(zoo, [3, 64, 64], num_classes=10)
    model = record_events(desc, 3, steps=3, method="model", relu6_clone=True)
    traced = record_events(desc, 3, steps=3, method="trace", relu6_clone=True)
    assert _as_replayed(model) == _as_replayed(traced)
    def clones(events):
        return sum(e[3] == "aten.clone.default" for e in events)  # the SGD's momentum buffers are clones too
    n_relu6 = sum(n.op == "relu6" for n in desc.nodes)
    assert n_relu6 > 0 and clones(model) - clones(record_events(desc, 3, steps=3, method="model")) == 3 * n_relu6
    new, old = simulate(desc, relu6_clone=True), simulate(desc)
    assert new.relu6_clone and not old.relu6_clone
    if zoo == "mobilenet_v2":  # a ReLU6 after each expansion: the clones raise the allocated peak
        assert new.peaks_mb([64])[0][1] > 1.2 * old.peaks_mb([64])[0][1]


def _leaky_discriminator(inplace: bool) -> NetworkDescription:
    """A GAN discriminator's layers: leaky ReLUs in place and not, as a module and as calls."""
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Discriminator(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 16, 4, 2, 1), nn.Conv2d(16, 32, 4, 2, 1)
            self.c3, self.bn, self.fc = nn.Conv2d(16, 32, 1, 2), nn.BatchNorm2d(32), nn.Linear(32, 1)
            self.act = nn.LeakyReLU(0.2, inplace=inplace)

        def forward(self, x):
            x = self.act(self.c1(x))
            y = F.leaky_relu(self.bn(self.c2(x)), 0.1)
            return self.fc(F.leaky_relu(y + self.c3(x), 0.3, inplace=True).mean((2, 3)))

    return describe(Discriminator(), [3, 32, 32], "disc")


@pytest.mark.parametrize("inplace", [True, False])
def test_allocation_model_writes_down_a_leaky_relu_as_traced(inplace):
    """A leaky ReLU keeps its input for the backward, or its result where it runs in place, as torch runs it."""
    desc = _leaky_discriminator(inplace)
    assert [n.attrs.get("inplace", False) for n in desc.nodes if n.op == "leaky_relu"] == [inplace, False, True]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)


@pytest.mark.parametrize("op", ["leaky_relu", "elu", "selu", "celu", "hardtanh", "mish",
                                "threshold", "rrelu"])
def test_allocation_model_writes_down_an_activation_in_place_on_a_copy_as_traced(op):
    """An activation in place on a copy of its input (``on_copy``) is the copy (a clone, whose backward hands the
    gradient on), then the activation written into it, keeping the copy (a mish's, a threshold's, and a hardtanh's
    under ``relu6_clone``, a clone of it; an rrelu's, and its noise), as the meta trace records the rebuilt network
    (it was written down as the activation out of place, keeping its input)."""
    from test_features import on_copy_network

    from perf4sight.ir.from_torch import describe
    desc = describe(on_copy_network(op), [3, 6, 6], "on_copy")
    for relu6_clone in (False, True):
        model = record_events(desc, 3, steps=3, method="model", relu6_clone=relu6_clone)
        traced = record_events(desc, 3, steps=3, method="trace", relu6_clone=relu6_clone)
        assert _as_replayed(model) == _as_replayed(traced)


@pytest.mark.parametrize("op", ["leaky_relu", "elu", "selu", "celu", "hardtanh", "mish",
                                "threshold", "rrelu"])
def test_allocation_model_writes_down_an_activation_on_a_copy_of_the_input_as_traced(op):
    """An activation in place on a copy of the network input (``call(torch, x.clone())``, which needs no gradient)
    was refused by the model ('gradients left undelivered': its autograd node pointed at the copy's, which there is
    none of) and went to the trace. Nothing is kept there: the copy, the activation written into it, a mish's clone
    (its kernel's) and an rrelu's noise freed once it has run, as the meta trace records the rebuilt network."""
    import torch
    from torch import nn

    from test_features import ON_COPY_ACTIVATIONS

    from perf4sight.ir.from_torch import describe
    call = ON_COPY_ACTIVATIONS[op][2]

    class OnTheInput(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(3, 3, 3, padding=1), nn.Linear(3, 10)

        def forward(self, x):
            return self.fc((call(torch, x.clone()) + self.conv(x)).mean((2, 3)))
    desc = describe(OnTheInput(), [3, 6, 6], "on_the_input")
    assert [n.attrs.get("on_copy") for n in desc.nodes if n.op == op] == [True]
    for relu6_clone in (False, True):
        model = record_events(desc, 3, steps=3, method="model", relu6_clone=relu6_clone)
        traced = record_events(desc, 3, steps=3, method="trace", relu6_clone=relu6_clone)
        assert _as_replayed(model) == _as_replayed(traced)


def _activated(act, call) -> NetworkDescription:
    """A small network of the layer ``act`` and the calls ``call(x, inplace)``, in place and not, one after a
    residual add."""
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 16, 4, 2, 1), nn.Conv2d(16, 32, 4, 2, 1)
            self.c3, self.bn, self.fc = nn.Conv2d(16, 32, 1, 2), nn.BatchNorm2d(32), nn.Linear(32, 1)
            self.act = act

        def forward(self, x):
            x = self.act(self.c1(x))
            y = call(self.bn(self.c2(x)), False)
            return self.fc(call(y + self.c3(x), True).mean((2, 3)))

    return describe(Net(), [3, 32, 32], "activated")


@pytest.mark.parametrize("inplace", [True, False])
def test_allocation_model_writes_down_an_elu_as_traced(inplace):
    """An ELU keeps its input for the backward, or its result where it runs in place, as torch runs it."""
    import torch.nn.functional as F
    from torch import nn

    desc = _activated(nn.ELU(0.5, inplace=inplace), lambda x, inplace: F.elu(x, 2.0, inplace))
    assert [n.attrs.get("inplace", False) for n in desc.nodes if n.op == "elu"] == [inplace, False, True]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)


@pytest.mark.parametrize("method", ["sigmoid", "tanh"])
def test_allocation_model_writes_down_an_in_place_sigmoid_or_tanh_as_traced(method):
    """``y.sigmoid_()`` and ``y.tanh_()`` write their input and keep it as their result for the backward, allocating
    nothing: they were described as the out-of-place activations, which the model gave a new output each. Described
    in place now, rebuilt in place, and written down as the trace records them (one output fewer than the layer
    and the call out of place)."""
    import torch
    from torch import nn

    layer = nn.Sigmoid() if method == "sigmoid" else nn.Tanh()
    desc = _activated(layer, lambda x, inplace: getattr(x, method + "_")() if inplace else getattr(torch, method)(x))
    assert [n.attrs.get("inplace", False) for n in desc.nodes if n.op == method] == [False, False, True]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    made = [op for kind, _, size, op in traced if kind == ALLOC and size and op == f"aten.{method}.default"]
    assert len(made) == 2 * 3  # the two out of place, each of the three steps


def test_allocation_model_writes_down_a_softplus_as_traced():
    """A softplus (torch has no in-place one) keeps its input for the backward, as torch runs it."""
    import torch.nn.functional as F
    from torch import nn

    desc = _activated(nn.Softplus(2.0, 5.0), lambda x, inplace: F.softplus(x))
    assert sum(n.op == "softplus" for n in desc.nodes) == 3
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)


@pytest.mark.parametrize("call", [
    lambda x, inplace: x / (x.pow(2).mean(1, keepdim=True) + 1e-5).sqrt() * (x.abs() + 1).rsqrt(),
    lambda x, inplace: (x.clamp(min=1e-6).pow(3.0) * -1).exp() + 1 / (x.abs() + 2) + x.square(),
    lambda x, inplace: (x.mean(1, keepdim=True) + 2) / (x.abs() + 1) + x / (x.abs() + 1).mean((2, 3), keepdim=True),
    lambda x, inplace: (x - x.mean(1, keepdim=True)) / (x.var(1, keepdim=True, unbiased=False) + 1e-5).sqrt()
    + x.var((2, 3), keepdim=True),
])
def test_allocation_model_writes_down_powers_exp_and_abs_as_traced(call):
    """A power keeps its input and allocates x ** (p - 1) and its times p before the gradient; sqrt and rsqrt (the
    exponents 0.5 and -0.5) and exp keep their result, abs its input and its sgn for a moment; a quotient of
    tensors (a normalisation's, its divisor broadcast) keeps both and allocates x / y, over y and -grad before the
    divisor's gradient, a number over a tensor is the tensor's power -1 times it; a variance keeps its input and
    allocates the mean, the deviation and the scaled gradient before the input's: as torch runs them."""
    from torch import nn

    desc = _activated(nn.ReLU(), call)
    assert {n.op for n in desc.nodes} & {"pow", "div", "var"}
    model, traced = record_events(desc, 3, steps=2, method="model"), record_events(desc, 3, steps=2, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)


def test_allocation_model_writes_down_a_selective_kernel_s_stack_and_unbind_as_traced():
    """SKNet's stacked branches (unsqueezes concatenated), weighted by a softmax over them and summed, and an unbind's
    pieces (selects): the model's events are the meta trace's."""
    import sys
    from pathlib import Path

    from perf4sight.ir.from_torch import describe

    sys.path.insert(0, str(Path(__file__).parent))
    from test_ir_call_patterns import _SelectiveKernel

    desc = describe(_SelectiveKernel(), [3, 16, 16], "sk")
    model, traced = record_events(desc, 3, steps=2, method="model"), record_events(desc, 3, steps=2, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)


def test_allocation_model_writes_down_an_eca_gate_s_conv1d_as_traced():
    """ECA's Conv1d along a pooled map's channels ([N, 1, C], a transposed view): a conv2d of kernel (1, 3) of that
    view unsqueezed to [N, 1, 1, C], squeezed back; the model's events are the meta trace's."""
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Eca(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.eca, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.Conv1d(1, 1, 3, padding=1), nn.Linear(16, 2)

        def forward(self, x):
            x = F.relu(self.c1(x))
            y = self.eca(F.adaptive_avg_pool2d(x, 1).squeeze(-1).transpose(-1, -2)).transpose(-1, -2).unsqueeze(-1)
            return self.fc((x * y.sigmoid().expand_as(x)).mean((2, 3)))

    desc = describe(Eca(), [3, 16, 16], "eca")
    assert next(n for n in desc.nodes if n.name == "eca").attrs["kernel_size"] == [1, 3]
    model, traced = record_events(desc, 3, steps=2, method="model"), record_events(desc, 3, steps=2, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)


@pytest.mark.parametrize("inplace", [True, False])
def test_allocation_model_writes_down_a_mish_as_traced(inplace):
    """A mish keeps its input for the backward, a clone of it where it runs in place, as torch runs it; its
    backward is one kernel with one output, as on a GPU (on the meta device torch decomposes it into several ops,
    their temporaries recorded), with the trace's shortcuts or without."""
    import torch.nn.functional as F
    from torch import nn

    desc = _activated(nn.Mish(inplace=inplace), lambda x, inplace: F.mish(x, inplace))
    assert [n.attrs.get("inplace", False) for n in desc.nodes if n.op == "mish"] == [inplace, False, True]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    assert _as_replayed(traced) == _as_replayed(record_events(desc, 3, steps=3, fast=False))
    ops = [op for kind, _, _, op in traced if kind == ALLOC]
    assert ops.count("aten.mish_backward.default") == 3 * 3 and not any("softplus" in op for op in ops)


@pytest.mark.parametrize("inplace", [True, False])
def test_the_traced_mish_computes_what_torch_s_does(inplace):
    """The trace's stand-in for a mish gives torch's result and gradient, and in place changes its input."""
    import torch
    from torch import nn

    from perf4sight.features.alloc_trace import _fused_mish

    model = nn.Sequential(nn.Identity(), nn.Mish(inplace=inplace))
    x = torch.linspace(-30, 30, 61, dtype=torch.float64, requires_grad=True)
    want = nn.functional.mish(x * 1)
    (want_grad,) = torch.autograd.grad(want.sin().sum(), x)
    _fused_mish(model)
    assert not any(isinstance(m, nn.Mish) for m in model.modules())
    y = x * 1
    got = model(y)
    assert (got is y) == inplace and torch.equal(got, want)
    got.sin().sum().backward()
    assert torch.allclose(x.grad, want_grad)


@pytest.mark.parametrize("op", ["silu", "hardswish", "hardsigmoid"])
@pytest.mark.parametrize("spelling", ["keyword", "positional"])
def test_allocation_model_writes_down_an_in_place_silu_hardswish_hardsigmoid_as_traced(op, spelling):
    """nn.SiLU(inplace=True), F.silu(x, inplace=True) (and F.silu(x, True)), and hardswish's and hardsigmoid's alike,
    were described out of place, the flag dropped: torch runs them as a clone of the input (kept for the backward)
    and the in-place kernel. They are described in place, and the model writes that down as the meta trace records
    it (a clone each, the in-place kernel allocating nothing)."""
    import torch.nn.functional as F
    from torch import nn

    layer = {"silu": nn.SiLU, "hardswish": nn.Hardswish, "hardsigmoid": nn.Hardsigmoid}[op](inplace=True)
    function = getattr(F, op)
    call = ((lambda x, inplace: function(x, inplace=inplace)) if spelling == "keyword"
            else (lambda x, inplace: function(x, inplace)))
    desc = _activated(layer, call)
    assert [n.attrs.get("inplace", False) for n in desc.nodes if n.op == op] == [True, False, True]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    activations = (3 * 16 * 16 * 16 * 4, 3 * 32 * 8 * 8 * 4)  # bytes of [3, 16, 16, 16] and [3, 32, 8, 8] floats
    clones = [size for kind, _, size, name in traced if kind == ALLOC and "clone" in name and size in activations]
    assert clones == list(activations) * 3  # the two in place, each step (the other clones are the parameters')


@pytest.mark.parametrize("op", ["silu", "hardswish", "hardsigmoid"])
def test_an_in_place_silu_hardswish_hardsigmoid_after_an_instance_norm_is_written_down_as_traced(op):
    """A SiLU, a hardswish and a hardsigmoid in place on an instance norm's output (a view of its batch norm's,
    whose history torch rebases), affine and not, one in a residual block: the clone each keeps, and the rebased
    backward, are written down as the meta trace records them."""
    from torch import nn

    from perf4sight.ir.from_torch import describe

    layer = {"silu": nn.SiLU, "hardswish": nn.Hardswish, "hardsigmoid": nn.Hardsigmoid}[op]

    class Normed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.n1, self.a1 = nn.Conv2d(3, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True), layer(True)
            self.c2, self.n2, self.a2 = nn.Conv2d(8, 8, 3, padding=1), nn.InstanceNorm2d(8), layer(True)
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

        def forward(self, x):
            x = self.a1(self.n1(self.c1(x)))
            return self.head(self.a2(self.n2(self.c2(x))) + x)

    desc = describe(Normed(), [3, 8, 8], "normed")
    assert [n.attrs for n in desc.nodes if n.op == op] == [{"inplace": True}] * 2
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    assert sum(op == "aten.new_empty_strided.default" for _, _, _, op in model) == 2 * 3  # each norm, each step


def test_allocation_model_writes_down_a_group_norm_as_traced():
    """A group norm allocates its output, a mean and a 1/std per sample and group, and keeps its input and those two
    for the backward, which computes the input's gradient, then the weight's and bias's, as torch runs it: on the
    network's input (no input gradient), affine and not, after an add, on a flat vector, before an in-place ReLU."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.g0, self.c1, self.g1 = nn.GroupNorm(1, 3), nn.Conv2d(3, 16, 4, 2, 1), nn.GroupNorm(4, 16)
            self.c2, self.c3, self.g2 = nn.Conv2d(16, 32, 4, 2, 1), nn.Conv2d(16, 32, 1, 2), nn.GroupNorm(8, 32)
            self.fc, self.g3, self.out = nn.Linear(32, 8), nn.GroupNorm(2, 8, affine=False), nn.Linear(8, 1)

        def forward(self, x):
            x = F.relu(self.g1(self.c1(self.g0(x))), inplace=True)
            y = F.group_norm(self.c2(x) + self.c3(x), 4)
            return self.out(self.g3(self.fc(torch.relu(self.g2(y)).mean((2, 3)))))

    desc = describe(Net(), [3, 32, 32], "grouped")
    assert [n.attrs["num_groups"] for n in desc.nodes if n.op == "groupnorm"] == [1, 4, 4, 8, 2]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    stats = [op == "aten.native_group_norm.default" and size == 3 * 4 * 4 for _, _, size, op in model]
    assert sum(stats) == 2 * 2 * 3  # the two norms of 4 groups: a mean and a 1/std each, each of 3 steps


def test_allocation_model_sums_the_gradients_of_a_vector_two_linear_layers_read():
    """A [N, C] vector read by two linear layers with biases (a two-branch head) gets two gradients that autograd adds:
    the allocation model looked up the vector's shape at the linear layer's second backward edge, of which it held
    none (an IndexError); the events are the meta trace's."""
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class TwoBranches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.fc1, self.fc2 = nn.Conv2d(3, 16, 4, 2, 1), nn.Linear(16, 24), nn.Linear(16, 24)
            self.out = nn.Linear(24, 5)

        def forward(self, x):
            y = self.c1(x).mean((2, 3))
            return self.out(F.relu(self.fc1(y) + self.fc2(y)))

    desc = describe(TwoBranches(), [3, 16, 16], "two_branches")
    model, traced = record_events(desc, 3, steps=2, method="model"), record_events(desc, 3, steps=2, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    assert sum(op == "aten.add.Tensor" and size == 3 * 16 * 4 for _, _, size, op in model) == 2


def test_allocation_model_writes_down_a_heads_batch_norm_as_traced():
    """A batch norm of [N, C] features (a BNNeck's BatchNorm1d) or of an [N, C, L] map's rows allocates its output
    and a mean and a 1/std per channel, and keeps its input and the two, as a BatchNorm2d's: affine and not, after an
    add, before an in-place ReLU, as F.batch_norm, each event the meta trace's."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.rows = nn.Conv2d(3, 16, 4, 2, 1), nn.BatchNorm1d(16, affine=False)
            self.fc1, self.fc2, self.neck = nn.Linear(16, 24), nn.Linear(16, 24), nn.BatchNorm1d(24)
            self.out = nn.Linear(24, 5)
            self.register_buffer("mean", torch.zeros(5))
            self.register_buffer("var", torch.ones(5))

        def forward(self, x):
            y = self.rows(self.c1(x).flatten(2)).mean(2)
            y = F.relu(self.neck(self.fc1(y) + self.fc2(y)), inplace=True)
            return F.batch_norm(self.out(y), self.mean, self.var, training=True)

    desc = describe(Net(), [3, 16, 16], "bnneck")
    assert [n.output_shape for n in desc.nodes if n.op == "batchnorm2d"] == [[16, 64], [24], [5]]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    stats = [op == "aten.native_batch_norm.default" and size == 24 * 4 for _, _, size, op in model]
    assert sum(stats) == 2 * 3  # the neck's mean and 1/std, each of 3 steps


def test_allocation_model_writes_down_a_fractional_max_pool_as_traced():
    """A fractional max pool draws a uniform sample pair per sample and channel (freed once read), allocates its
    output and int64 indices, and keeps its input and the indices; its backward allocates the input's gradient, as
    torch runs it: on the network's input (no input gradient), after a convolution, of an output ratio and of an
    output size, before an in-place ReLU."""
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p0, self.c1 = nn.FractionalMaxPool2d(2, output_size=(12, 13)), nn.Conv2d(3, 16, 3, padding=1)
            self.p1, self.fc = nn.FractionalMaxPool2d(3, output_ratio=0.5), nn.Linear(16, 4)

        def forward(self, x):
            y = F.relu(self.p1(self.c1(self.p0(x))), inplace=True)
            return self.fc(F.fractional_max_pool2d(y, 2, output_size=3).mean((2, 3)))

    desc = describe(Net(), [3, 16, 16], "fractional")
    assert [n.output_shape for n in desc.nodes if n.op == "fractional_maxpool2d"] == [[3, 12, 13], [16, 6, 6],
                                                                                    [16, 3, 3]]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    ops = [(op, size) for kind, _, size, op in model if kind == ALLOC]
    assert ops.count(("aten.rand.default", 3 * 16 * 2 * 4)) == 2 * 3  # the two pools of 16 channels, each step
    assert ops.count(("aten.fractional_max_pool2d_backward.default", 3 * 16 * 12 * 13 * 4)) == 3


def test_allocation_model_writes_down_a_transposed_convolution_as_traced():
    """A transposed convolution allocates its output (aten.convolution) and keeps its input; its backward allocates
    the input's gradient, the weight's, then the bias's (aten.convolution_backward), as torch runs it: on the
    network's input (no input gradient), grouped without a bias, on a slice of a tensor (strided), with an output
    padding, in a U-Net's decoder whose upsampled map is concatenated with the skip."""
    import torch
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.d1, self.d2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 24, 3, stride=2, padding=1)
            self.up = nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1)
            self.up2 = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1, groups=8, bias=False)
            self.first, self.out, self.fc = nn.ConvTranspose2d(3, 4, 2), nn.Conv2d(24, 2, 1), nn.Linear(4, 2)

        def forward(self, x):
            skip = torch.relu(self.d1(x))
            low = torch.relu(self.d2(skip))
            y = self.out(torch.cat([skip, self.up(low[:, :16]), self.up2(low[:, 8:])], 1)).mean((2, 3))
            return y + self.fc(self.first(x).mean((2, 3)))

    desc = describe(Net(), [3, 16, 16], "decoder")
    assert sum(n.op == "conv_transpose2d" for n in desc.nodes) == 3
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    grads = {size for _, _, size, op in model if op == "aten.convolution_backward.default"}
    assert 3 * 16 * 8 * 8 * 4 in grads  # up's input gradient: of its input, a slice [3, 16, 8, 8], at a batch of 3


def _instance_normed(affine_first: bool = True) -> NetworkDescription:
    """A style-transfer generator's layers: instance norms on the network's input (no input gradient), after a
    convolution (torch's default: no weight and bias), after an add (a call on the module's own weight and bias),
    each followed by an activation that keeps its input."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Generator(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n0, self.c1 = nn.InstanceNorm2d(3, affine=affine_first), nn.Conv2d(3, 16, 4, 2, 1)
            self.n1, self.c2, self.c3 = nn.InstanceNorm2d(16), nn.Conv2d(16, 32, 4, 2, 1), nn.Conv2d(16, 32, 1, 2)
            self.own = nn.Module()
            self.own.weight, self.own.bias = nn.Parameter(torch.ones(32)), nn.Parameter(torch.zeros(32))
            self.fc = nn.Linear(32, 1)

        def forward(self, x):
            x = F.leaky_relu(self.n1(self.c1(self.n0(x))), 0.2)
            y = F.instance_norm(self.c2(x) + self.c3(x), weight=self.own.weight, bias=self.own.bias)
            return self.fc(torch.tanh(y).mean((2, 3)))

    return describe(Generator(), [3, 32, 32], "generator")


@pytest.mark.parametrize("affine_first", [True, False])
def test_allocation_model_writes_down_an_instance_norm_as_traced(affine_first):
    """An instance norm runs as a batch norm of the input viewed as [1, N x C, H, W]: where affine, its weight and
    bias repeated per sample first (the bias's freed after the norm, the weight's kept), then the output, a mean and
    a 1/std per sample and channel; backward the input's gradient, the repeats', each summed down to C floats.
    The model writes it down as the meta trace records it: on the network's input (affine and not), after a
    convolution, after an add."""
    desc = _instance_normed(affine_first)
    assert [n.attrs.get("affine", False) for n in desc.nodes if n.op == "instancenorm"] == [affine_first, False, True]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    repeats = [size for kind, _, size, op in model if kind == ALLOC and op == "aten.repeat.default"]
    assert repeats == [3 * 3 * 4] * 2 * affine_first + [3 * 32 * 4] * 2 + ([3 * 3 * 4] * 2 * affine_first
                                                                          + [3 * 32 * 4] * 2) * 2  # 3 steps


def _affine_instance_normed() -> NetworkDescription:
    """conv -> affine instance norm of 8 channels -> conv, then a classifier."""
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Normed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.norm = nn.Conv2d(3, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True)
            self.c2, self.fc = nn.Conv2d(8, 8, 3), nn.Linear(8, 1)

        def forward(self, x):
            return self.fc(self.c2(self.norm(self.c1(x))).mean((2, 3)))

    return describe(Normed(), [3, 8, 8], "normed")


@pytest.mark.parametrize("batch, sums", [(1, 0), (3, 2)])
def test_an_affine_instance_norm_at_batch_1_sums_no_parameter_gradient(batch, sums):
    """At a batch of 1 the weight and bias are repeated once: the repeat's backward sums over no dimension, the
    norm's gradients of them are the parameters' own. The model wrote down a sum of each (4 events a step the meta
    trace lacks); it now follows torch at a batch of 1 and sums each (8 floats) at any other batch."""
    desc = _affine_instance_normed()
    model, traced = record_events(desc, batch, steps=2, method="model"), record_events(desc, batch, steps=2,
                                                                                     method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    assert sum(kind == ALLOC and op == "aten.sum.dim_IntList" and size == 8 * 4
               for kind, _, size, op in model) == sums * 2  # each step


def _styled() -> NetworkDescription:
    """A style-transfer network's blocks: instance norms (affine and not) each followed by an in-place activation
    (ReLU, leaky ReLU, ReLU6, mish), one in a residual block."""
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Styled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.n1, self.a1 = nn.Conv2d(3, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True), nn.ReLU(True)
            self.c2, self.n2 = nn.Conv2d(8, 8, 3, padding=1), nn.InstanceNorm2d(8)
            self.a2 = nn.LeakyReLU(0.2, inplace=True)
            self.c3, self.n3, self.a3 = nn.Conv2d(8, 8, 1), nn.InstanceNorm2d(8, affine=True), nn.ReLU6(inplace=True)
            self.c4, self.n4, self.a4 = nn.Conv2d(8, 8, 1), nn.InstanceNorm2d(8), nn.Mish(inplace=True)
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

        def forward(self, x):
            x = self.a1(self.n1(self.c1(x)))
            z = self.a2(self.n2(self.c2(x))) + x
            return self.head(self.a4(self.n4(self.c4(self.a3(self.n3(self.c3(z)))))))

    return describe(Styled(), [3, 8, 8], "styled")


@pytest.mark.parametrize("relu6_clone", [True, False])
def test_an_in_place_activation_after_an_instance_norm_is_written_down_as_traced(relu6_clone):
    """An instance norm's output is a view of its batch norm's: an in-place activation on it makes torch rebase the
    view's history (CopySlices): backward, the view's node writes its gradient into new zeros of the base's shape,
    CopySlices copies that into a new tensor and runs the activation's backward on a clone of it. The model writes
    that down as the meta trace records it, for ReLU, leaky ReLU, ReLU6 (either rule) and mish."""
    desc = _styled()
    assert [n.attrs.get("inplace", False) for n in desc.nodes if n.op in ("relu", "leaky_relu", "relu6", "mish")] \
        == [True] * 4
    model = record_events(desc, 3, steps=3, method="model", relu6_clone=relu6_clone)
    traced = record_events(desc, 3, steps=3, method="trace", relu6_clone=relu6_clone)
    assert _as_replayed(model) == _as_replayed(traced)
    assert sum(op == "aten.new_zeros.default" for _, _, _, op in model) == 4 * 3  # each norm, each step
    assert sum(op == "aten.new_empty_strided.default" for _, _, _, op in model) == 4 * 3


def test_an_instance_norm_feeding_a_cat_copies_its_gradient_slice_as_traced():
    """A U-Net's skip (pix2pix's): an instance norm's output concatenated after the skipped tensor. Its gradient is
    a slice of the cat's, which its backward reshapes to the batch norm's [1, N x C, H, W]: no view has those
    strides, so torch copies it (the model wrote that reshape as a view, and a copy too few). The model follows the
    strides to the batch norm's shape, with or without an in-place ReLU on the norm's output."""
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Skip(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.down, self.n1 = nn.Conv2d(3, 8, 3, padding=1), nn.InstanceNorm2d(8)
            self.inner, self.n2 = nn.Conv2d(8, 8, 3, padding=1), nn.InstanceNorm2d(8, affine=True)
            self.inner2 = nn.Conv2d(8, 8, 1)
            self.relu, self.head = nn.ReLU(inplace=True), nn.Sequential(nn.Conv2d(24, 4, 1), nn.Flatten())

        def forward(self, x):
            y = self.down(x)
            return self.head(torch.cat([y, self.n1(self.inner(y)), self.relu(self.n2(self.inner2(y)))], 1))

    import torch
    desc = describe(Skip(), [3, 4, 4], "skip")
    model, traced = record_events(desc, 3, steps=2, method="model"), record_events(desc, 3, steps=2, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    norm_out = 3 * 8 * 4 * 4 * 4  # bytes of a norm's output at batch 3: its gradient, copied
    assert sum(op == "aten.clone.default" and size == norm_out for _, _, size, op in model) >= 2


@pytest.mark.parametrize("inplace", [True, False])
@pytest.mark.parametrize("relu6_clone", [True, False])
def test_allocation_model_writes_down_a_hardtanh_as_traced(inplace, relu6_clone):
    """A hardtanh keeps its input for the backward; in place, its result as torch before 1.10 ran ``hardtanh_`` (the
    trace's stand-in, as for ReLU6), or a clone of its input made first (``relu6_clone``: this torch)."""
    import torch.nn.functional as F
    from torch import nn

    desc = _activated(nn.Hardtanh(-2.0, 3.0, inplace=inplace), lambda x, inplace: F.hardtanh(x, -1.0, 0.5, inplace))
    assert [n.attrs.get("inplace", False) for n in desc.nodes if n.op == "hardtanh"] == [inplace, False, True]
    model = record_events(desc, 3, steps=3, method="model", relu6_clone=relu6_clone)
    traced = record_events(desc, 3, steps=3, method="trace", relu6_clone=relu6_clone)
    assert _as_replayed(model) == _as_replayed(traced)
    clones = sum(op == "aten.clone.default" for _, _, _, op in traced) - 10  # the 10 parameters' momentum buffers
    assert clones == 3 * (1 + inplace) * relu6_clone


def test_the_traced_hardtanh_in_place_computes_what_torch_s_does():
    """The trace's stand-in for an in-place hardtanh (and ReLU6) gives torch's result and gradient in place."""
    import torch
    from torch import nn

    from perf4sight.features.alloc_trace import _inplace_activations

    model = nn.Sequential(nn.Identity(), nn.Hardtanh(-0.5, 2.0, inplace=True), nn.Hardtanh(-1, 1), nn.ReLU6())
    x = torch.linspace(-3, 8, 45, dtype=torch.float64, requires_grad=True)
    want = torch.clamp(torch.clamp(x * 1, -0.5, 2.0), -1, 1).clamp(0, 6)
    (want_grad,) = torch.autograd.grad((want * x).sum(), x)
    _inplace_activations(model)
    assert [type(m).__name__ for m in model] == ["Identity", "_HardtanhInplace", "Hardtanh", "_HardtanhInplace"]
    got = model(x * 1)
    assert torch.equal(got, want)
    (got * x).sum().backward()
    assert torch.allclose(x.grad, want_grad)


def test_allocation_model_writes_down_a_softmax_as_traced():
    """A softmax keeps its output for the backward, which allocates the input's gradient, as torch runs it: over
    the channels (an attention gate), over each channel's pixels after a flatten (a view), twice in a row, and as
    the network's output."""
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class SpatialSoftmax(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3, 2, 1), nn.Conv2d(8, 8, 3, padding=1), nn.Linear(8, 5)

        def forward(self, x):
            f = self.c2(self.c1(x))
            p = F.softmax((f * f.softmax(1)).flatten(2), -1)
            return F.softmax(self.fc(F.softmax(p * 10.0, dim=2).mean(2)), 1)

    desc = describe(SpatialSoftmax(), [3, 16, 16], "spatial")
    assert [n.attrs["dim"] for n in desc.nodes if n.op == "softmax"] == [1, 2, 2, 1]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    assert sum(op == "aten._softmax_backward_data.default" for _, _, _, op in model) == 4 * 3


def test_allocation_model_writes_down_pads_and_pixel_shuffles_as_traced():
    """A pad and a pixel shuffle or unshuffle allocate their output; a reflection or replication pad keeps its input,
    the others nothing; each backward allocates its input's gradient, as torch runs them: on the network's input (no
    gradient), before an in-place ReLU, into an add, a pad of nothing (a copy) and a constant pad of a value."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(12, 16, 3), nn.Conv2d(16, 3 * 4, 3, padding=1)
            self.c3, self.fc = nn.Conv2d(3, 8, 3), nn.Linear(8 * 16, 2)

        def forward(self, x):
            x = F.relu(self.c1(F.pixel_unshuffle(F.pad(x, (1, 1, 1, 1), mode="reflect"), 2)), inplace=True)
            y = F.pixel_shuffle(self.c2(F.pad(x, (1, 1, 1, 1), mode="replicate")), 2)
            inner = F.pad(y, (1, 1, 1, 1), mode="reflect").narrow(2, 1, 16).narrow(3, 1, 16)
            y = torch.relu(F.pad(y, (0, 0, 0, 0)) + inner)
            y = F.pixel_unshuffle(self.c3(F.pad(y, (1, 1, 1, 1), value=0.5)), 4)
            return self.fc(y.mean((2, 3)))

    desc = describe(Net(), [3, 14, 14], "padded")
    assert [n.attrs["mode"] for n in desc.nodes if n.op == "pad"] == [
        "reflect", "replicate", "reflect", "constant", "constant"]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    kernels = {op for _, _, _, op in model}
    assert {"aten.reflection_pad2d_backward.default", "aten.replication_pad2d_backward.default",
            "aten.pixel_shuffle.default", "aten.pixel_unshuffle.default", "aten.constant_pad_nd.default"} <= kernels


def test_a_convolution_padding_other_than_zeros_is_written_down_as_torch_runs_it():
    """A convolution padding by reflection or replication is described as the pad torch runs first and the
    convolution after it (one of a padding of nothing too: torch copies its input by the pad): the allocation model
    writes down what the trace of the rebuilt module records, and that is what torch records for the module itself,
    every step's events (a description of the convolution alone, as one of a padding of nothing was, leaves the
    copy out)."""
    import torch
    from torch import nn

    from perf4sight.features.alloc_trace import _OptimizerStep, _trace
    from perf4sight.features.optimizers import PERF4SIGHT_MOMENTUM
    from perf4sight.ir.from_torch import describe

    torch.manual_seed(0)
    original = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, padding_mode="reflect"), nn.ReLU(inplace=True),
        nn.Conv2d(8, 8, (3, 4), padding="same", padding_mode="replicate"), nn.Tanh(),
        nn.Conv2d(8, 6, 3, stride=2, padding_mode="reflect", bias=False), nn.Flatten(), nn.Linear(6 * 7 * 7, 5))
    desc = describe(original, [3, 16, 16], "reflected")
    assert [n.attrs["mode"] for n in desc.nodes if n.op == "pad"] == ["reflect", "replicate", "reflect"]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    rebuilt = record_events(desc, 3, steps=3, fast=False)
    step = _OptimizerStep("sgd", 0.1, PERF4SIGHT_MOMENTUM, None)
    own = _trace(original.to("meta").train(), desc, 3, 3, step, {}, False)
    assert _as_replayed(own) == _as_replayed(rebuilt) == _as_replayed(traced)
    assert sum(op == "aten.reflection_pad2d.default" for _, _, _, op in own) == 2 * 3


def test_a_circular_pad_goes_to_the_trace_which_records_what_torch_records():
    """A circular pad (torch's copies into slices of an empty output, whose backward is a chain of autograd's
    in-place-copy nodes) is not written down by the allocation model: the default method traces it, and the trace
    of the rebuilt network records what torch records for the module itself (a convolution of padding_mode
    'circular', nn.CircularPad2d), every step's events."""
    import torch
    from torch import nn

    from perf4sight.errors import UserError
    from perf4sight.features.alloc_trace import _OptimizerStep, _trace
    from perf4sight.features.optimizers import PERF4SIGHT_MOMENTUM
    from perf4sight.ir.from_torch import describe

    torch.manual_seed(0)
    original = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, padding_mode="circular"), nn.ReLU(inplace=True),
                             nn.CircularPad2d((1, 0, 2, 1)), nn.Conv2d(8, 6, 3, stride=2), nn.Flatten(),
                             nn.Linear(6 * 9 * 7, 5))
    desc = describe(original, [3, 16, 14], "wrapped")
    assert [n.attrs["mode"] for n in desc.nodes if n.op == "pad"] == ["circular", "circular"]
    with pytest.raises(UserError, match="does not cover a circular pad"):
        record_events(desc, 3, method="model")
    auto, traced = record_events(desc, 3, steps=3), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(auto) == _as_replayed(traced)
    step = _OptimizerStep("sgd", 0.1, PERF4SIGHT_MOMENTUM, None)
    own = _trace(original.to("meta").train(), desc, 3, 3, step, {}, False)
    assert _as_replayed(own) == _as_replayed(traced)
    assert sum(op == "aten.slice_backward.default" for _, _, _, op in own) > 0


def test_a_local_response_norm_goes_to_the_trace_which_records_what_torch_records():
    """A local response norm (seven ops of torch's, each its own autograd node) is not written down by the
    allocation model: the default method traces it, and the trace of the rebuilt network records what torch
    records for the module itself."""
    import torch
    from torch import nn

    from perf4sight.errors import UserError
    from perf4sight.features.alloc_trace import _OptimizerStep, _trace
    from perf4sight.features.optimizers import PERF4SIGHT_MOMENTUM
    from perf4sight.ir.from_torch import describe

    torch.manual_seed(0)
    original = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(inplace=True), nn.LocalResponseNorm(5), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(8 * 7 * 7, 5))
    desc = describe(original, [3, 16, 16], "alexnet")
    with pytest.raises(UserError, match="does not cover op 'local_response_norm'"):
        record_events(desc, 3, method="model")
    auto, traced = record_events(desc, 3, steps=3), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(auto) == _as_replayed(traced)
    step = _OptimizerStep("sgd", 0.1, PERF4SIGHT_MOMENTUM, None)
    own = _trace(original.to("meta").train(), desc, 3, 3, step, {}, False)
    assert _as_replayed(own) == _as_replayed(traced)
    assert sum(op == "aten.avg_pool3d_backward.default" for _, _, _, op in own) == 3


def test_allocation_model_on_generated_networks():
    from perf4sight.networks.generator import STYLES, GeneratorSettings, generate
    descs = generate(GeneratorSettings(count=10, seed=11), [3, 32, 32], 10)
    assert len(descs) == 10 and len(STYLES) >= 5
    for desc in descs:
        modelled = _as_replayed(record_events(desc, 2, method="model"))
        assert modelled == _as_replayed(record_events(desc, 2, method="trace")), desc.name


def _mlp(tokens: bool, act: str = "ReLU"):
    """A multilayer perceptron on the flattened input (the first layer needs no input gradient), or
    one applied to each of 4 tokens (linear layers on 3-D tensors: torch folds them into one of their rows), with
    the activation ``act`` between its layers."""
    from torch import nn

    from perf4sight.ir.from_torch import describe
    if tokens:
        module = nn.Sequential(nn.Flatten(2), nn.Linear(12, 8), getattr(nn, act)(), nn.Flatten(), nn.Linear(32, 10))
        return describe(module, [4, 3, 4], "tokens")
    module = nn.Sequential(nn.Flatten(), nn.Linear(48, 16, bias=False), nn.ReLU(), nn.Linear(16, 10))
    return describe(module, [3, 4, 4], "mlp")


def test_allocation_model_on_a_perceptron():
    desc = _mlp(tokens=False)
    assert _as_replayed(record_events(desc, 3, method="model")) == _as_replayed(record_events(desc, 3, method="trace"))


def test_linear_layers_on_three_dimensional_tensors_are_written_down_as_traced():
    """A linear layer on each token is an ``addmm`` of the rows, viewed back: written down as traced; an in-place
    ReLU of that view (which torch rebases) goes to the trace."""
    from perf4sight.errors import UserError
    tokens = _mlp(tokens=True, act="GELU")
    assert _as_replayed(record_events(tokens, 3, steps=2, method="model")) == \
        _as_replayed(record_events(tokens, 3, steps=2, method="trace"))
    relu = _mlp(tokens=True)
    assert record_events(relu, 2) == record_events(relu, 2, method="trace")
    with pytest.raises(UserError, match="in-place relu"):
        record_events(relu, 2, method="model")


def _small_convnext() -> NetworkDescription:
    """torchvision's ConvNeXt of two small stages (8 channels, 2 blocks; 16 channels, 1 block) at 3 x 32 x 32: its
    permutes to channels-last and back, layer norms of permuted tensors, linear layers on 4-D tensors, layer scales,
    a downsampling 2 x 2 convolution of a channels-last input, and the head's pooling of a channels-last map."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    from perf4sight.ir.from_torch import describe
    module = ConvNeXt([CNBlockConfig(8, 16, 2), CNBlockConfig(16, None, 1)], num_classes=10)
    return describe(module, [3, 32, 32], "small_convnext")


@pytest.mark.parametrize("zoo", ["small", "convnext_tiny", "convnext_tiny_32"])
def test_allocation_model_writes_down_convnext_as_traced(zoo):
    """ConvNeXt's events as the meta trace records them, event for event and step by step: the permutes are views,
    a layer norm keeps its permuted input and allocates a contiguous output, a linear layer on a 4-D tensor is an
    ``addmm`` of its rows (its gradient reshaped first, a copy where it is permuted), the layer scales and residual
    adds lay their outputs out as their inputs are laid out, a convolution of a channels-last input computes
    channels-last gradients (a 2 x 2 weight's then copied to its parameter's strides), and the head's mean of a
    channels-last map writes its gradient into new zeros first. At 32 x 32 the last stage's maps are 1 x 1, whose
    layout torch decides by strides along dimensions of size 1: the model follows those after a permute."""
    from perf4sight.networks.zoo import describe_zoo
    side = 32 if zoo == "convnext_tiny_32" else 64
    desc = _small_convnext() if zoo == "small" else describe_zoo("convnext_tiny", [3, side, side], num_classes=10)
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    ops = {op for _, _, _, op in traced}
    assert {"aten.new_empty_strided.default", "aten.new_zeros.default", "aten.clone.default"} <= ops
    assert _as_replayed(model) == _as_replayed(traced)
    sims = [simulate(desc, method=m) for m in ("model", "trace")]
    assert sims[0].peaks_mb([1, 7, 64]).tolist() == sims[1].peaks_mb([1, 7, 64]).tolist()


def test_an_unfollowed_layout_falls_back_to_the_trace():
    """A convolution of 1 x 1 maps permuted to channels-last, activated (an op the model does not follow the
    layout of along dimensions of size 1) and permuted back, whose layout torch decides by strides along those
    dimensions, is the trace's: the events are the trace's, on the meta device."""
    from torch import nn

    from perf4sight.errors import UserError
    from perf4sight.ir.from_torch import describe

    class Pixels(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.act, self.b, self.fc = nn.Conv2d(3, 8, 1), nn.GELU(), nn.Conv2d(8, 8, 1), nn.Linear(8, 10)

        def forward(self, x):
            return self.fc(self.b(self.act(self.a(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)).flatten(1))

    desc = describe(Pixels(), [3, 1, 1], "pixels")
    assert record_events(desc, 2) == record_events(desc, 2, method="trace")
    with pytest.raises(UserError, match="dimension of size 1 after a permute"):
        record_events(desc, 2, method="model")


def _small_swin(side: int, v2: bool = False) -> NetworkDescription:
    """torchvision's Swin transformer (``v2``: Swin V2's blocks and patch merging) of two small stages (16 and 32
    features, 2 heads, 4 x 4 windows, 2 blocks each: one shifted) at 3 x ``side`` x ``side``: its window attentions
    (padded to whole windows where the map is not, rolled and masked where shifted; V2's cosine scores and bias MLP),
    its patch merge (padded to even sides where the map is odd) and the merge's linear layer without a bias."""
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2

    from perf4sight.ir.from_torch import describe
    v2_parts = {"block": SwinTransformerBlockV2, "downsample_layer": PatchMergingV2} if v2 else {}
    module = SwinTransformer([4, 4], 16, [2, 2], [2, 2], [4, 4], num_classes=10, **v2_parts)
    return describe(module, [3, side, side], f"small_swin{'_v2' if v2 else ''}_{side}")


@pytest.mark.parametrize("zoo, side, batch", [("small", 32, 2), ("small", 36, 3), ("swin_t", 64, 3),
                                              ("swin_t", 224, 2), ("small_v2", 36, 2), ("swin_v2_t", 64, 3)])
def test_allocation_model_writes_down_swin_as_traced(zoo, side, batch):
    """A Swin transformer's events as the meta trace records them, event for event and step by step: each window
    attention's pad (a copy), roll, windows (copies where no view can: of the map, of the scaled queries, of the
    keys, values and heads for their ``bmm``), bias table ``index``, shifted windows' mask, softmax and
    projections, and their gradients' copies, ``select_backward`` sums and ``index_put``; each patch merge's pad,
    strided slices and cat; a layer norm's gradient laid out as its incoming one (the head's permuted mean's). At
    36 x 36 the maps are padded to whole windows and to even sides. V2's: the packed bias copied and its keys'
    third zeroed in place (a ``CopySlices``), the queries and keys normalised (norms, clamps, divisions), the logit
    scale's clamp and exp, the bias MLP (its in-place ReLU on a view rebased) and its ``16 sigmoid``."""
    from perf4sight.networks.zoo import describe_zoo
    small = zoo.startswith("small")
    desc = _small_swin(side, zoo == "small_v2") if small else describe_zoo(zoo, [3, side, side], num_classes=10)
    model = record_events(desc, batch, steps=3, method="model")
    traced = record_events(desc, batch, steps=3, method="trace")
    ops = {op for _, _, _, op in traced}
    assert {"aten.roll.default", "aten.index_put.default", "aten.masked_fill.Scalar", "aten.bmm.default",
            "aten.slice_backward.default", "aten.constant_pad_nd.default"} <= ops
    if "v2" in zoo:
        assert {"aten.linalg_vector_norm.default", "aten.zeros_like.default", "aten.threshold_backward.default",
                "aten.sigmoid_backward.default"} <= ops
    assert _as_replayed(model) == _as_replayed(traced)
    if small:
        sims = [simulate(desc, method=m) for m in ("model", "trace")]
        assert sims[0].peaks_mb([1, 7, 64]).tolist() == sims[1].peaks_mb([1, 7, 64]).tolist()


def _small_maxvit(side: int) -> NetworkDescription:
    """torchvision's MaxViT of one small stage (16 features, heads of 8, 4 x 4 partitions, one layer) at 3 x ``side``
    x ``side``: its stem, MBConv with squeeze-excitation, window and grid partitions (reshapes, permutes, swaps) and
    the group attentions."""
    from torchvision.models.maxvit import MaxVit

    from perf4sight.ir.from_torch import describe
    return describe(MaxVit((side, side), 8, 4, [16], [1], 8, 0.0, num_classes=10), [3, side, side],
                    f"small_maxvit_{side}")


@pytest.mark.parametrize("zoo, side, batch", [("small", 32, 2), ("small", 64, 3), ("maxvit_t", 224, 2)])
def test_allocation_model_writes_down_maxvit_as_traced(zoo, side, batch):
    """A MaxViT's events as the meta trace records them, event for event and step by step: each group attention's
    packed projection chunked in three (its backward gathers the three gradients into one ``cat``, the queries' and
    values' copied as their heads are put back), the keys scaled, both einsums' ``bmm`` of copies, the bias table's
    ``index`` and ``index_put``, the heads' copy before the merging projection, and what the return frees."""
    from perf4sight.networks.zoo import describe_zoo
    desc = _small_maxvit(side) if zoo == "small" else describe_zoo(zoo, [3, side, side], num_classes=10)
    model = record_events(desc, batch, steps=3, method="model")
    traced = record_events(desc, batch, steps=3, method="trace")
    ops = {op for _, _, _, op in traced}
    assert {"aten.cat.default", "aten.bmm.default", "aten.index_put.default", "aten.sigmoid_backward.default"} <= ops
    assert _as_replayed(model) == _as_replayed(traced)
    if zoo == "small":
        sims = [simulate(desc, method=m) for m in ("model", "trace")]
        assert sims[0].peaks_mb([1, 7, 64]).tolist() == sims[1].peaks_mb([1, 7, 64]).tolist()


def test_a_maxvit_at_a_batch_of_one_goes_to_the_trace():
    """At a batch of 1 a MaxViT's maps put back from their partitions are laid out by strides along the batch's
    dimension of size 1, through a batch norm whose layout there the model does not follow: the trace's."""
    from perf4sight.errors import UserError
    desc = _small_maxvit(32)
    assert _as_replayed(record_events(desc, 1)) == _as_replayed(record_events(desc, 1, method="trace"))
    with pytest.raises(UserError, match="dimension of size 1 after a permute"):
        record_events(desc, 1, method="model")


def _step_written_down(desc: NetworkDescription, batch: int) -> tuple:
    from perf4sight.features.alloc_model import step_events
    st = step_events(desc, batch)
    return st.setup, st.body, st.tail, dict(st.grads), list(st.param_bytes)


def _counted_group_attentions(monkeypatch, extra=None) -> list[int]:
    """The allocation model's group attention handler wrapped: each call counted (the list given back), and ``extra``
    run on its context after it."""
    from perf4sight.features import alloc_model

    handler, calls = alloc_model._HANDLERS["group_attention"], []

    def counted(ctx):  # noqa: ANN001, ANN202
        calls.append(ctx.node.name)
        out = handler(ctx)
        if extra is not None:
            extra(ctx)
        return out
    monkeypatch.setitem(alloc_model._HANDLERS, "group_attention", counted)
    return calls


def test_a_repeated_group_attention_is_its_first_one_renamed(monkeypatch):
    """A MaxViT's group attentions of one geometry (here 4: two layers of a window and a grid attention) run the
    handler once; the later ones repeat its events, holds and autograd nodes under new storage ids, node indices and
    parameters: every event of the step, its gradients and parameters as the handler run at each gives them."""
    from torchvision.models.maxvit import MaxVit

    from perf4sight.features import alloc_model
    from perf4sight.ir.from_torch import describe
    desc = describe(MaxVit((64, 64), 8, 4, [16], [2], 8, 0.0, num_classes=10), [3, 64, 64], "small_maxvit_2")
    calls = _counted_group_attentions(monkeypatch)
    repeated = _step_written_down(desc, 3)
    assert len(calls) == 1
    calls.clear()
    monkeypatch.setattr(alloc_model, "_REPEATED", set())
    assert _step_written_down(desc, 3) == repeated
    assert len(calls) == 4
    monkeypatch.undo()
    assert _as_replayed(record_events(desc, 3, method="model")) == _as_replayed(record_events(desc, 3, method="trace"))


@pytest.mark.parametrize("op, build", [
    ("window_attention", lambda: __import__("torchvision").models.swin_transformer.SwinTransformer(
        [4, 4], 16, [4, 2], [2, 4], [4, 4], num_classes=10)),
    ("attention", lambda: __import__("torchvision").models.vision_transformer.VisionTransformer(
        32, 8, 3, 2, 16, 32, num_classes=10))])
def test_a_repeated_swin_or_vit_attention_is_its_first_one_renamed(monkeypatch, op, build):
    """A Swin's window attentions and a ViT's attentions of one stage run the handler once; the later ones repeat it
    renamed: every event of the step, its gradients and parameters as the handler run at each gives them."""
    from perf4sight.features import alloc_model
    from perf4sight.ir.from_torch import describe
    desc = describe(build(), [3, 32, 32], f"small_{op}")
    handler, calls = alloc_model._HANDLERS[op], []
    monkeypatch.setitem(alloc_model._HANDLERS, op, lambda ctx: calls.append(ctx.node.name) or handler(ctx))
    repeated = _step_written_down(desc, 2)
    once = len(calls)
    calls.clear()
    monkeypatch.setattr(alloc_model, "_REPEATED", set())
    assert _step_written_down(desc, 2) == repeated
    assert once < len(calls)


@pytest.mark.parametrize("extra", ["a hold on a parameter", "a parameter freed"])
def test_a_group_attention_that_touches_what_it_did_not_make_is_not_repeated(monkeypatch, extra):
    """Where the handler's first run touched a storage made before it other than its input's (a hold on it, an event
    of it), a later node could not repeat it by renaming: each runs the handler (the events as without repeats)."""
    from perf4sight.features import alloc_model
    side_effect = {"a hold on a parameter": lambda ctx: ctx.mem.hold(1),
                   "a parameter freed": lambda ctx: ctx.mem.drop(1) if 1 in ctx.mem.holders else None}[extra]
    desc = _small_maxvit(32)
    calls = _counted_group_attentions(monkeypatch, side_effect)
    with_repeats = _step_written_down(desc, 2)
    assert len(calls) == 2
    monkeypatch.setattr(alloc_model, "_REPEATED", set())
    assert _step_written_down(desc, 2) == with_repeats


@pytest.mark.parametrize("zoo, shape, batch", [("swin_v2_t", [3, 64, 32], 2), ("swin_t", [3, 64, 28], 2),
                                               ("swin_t", [3, 72, 88], 1)])
def test_a_layer_norm_gradient_laid_out_along_dimensions_of_size_1_goes_to_the_trace(zoo, shape, batch):
    """The meta kernel lays a layer norm's input gradient out as its incoming one, but by rules that turn on the
    strides along dimensions of size 1 (a strided [2, 2, 1, 768] gradient of channels-last strides gives a
    contiguous one): where the head's permuted gradient has such a dimension (a last map of 2 x 1, a batch of 1),
    Swin is the trace's (V2 at 64 x 32 was written down with a copy the trace does not make)."""
    from perf4sight.errors import UserError
    from perf4sight.networks.zoo import describe_zoo
    desc = describe_zoo(zoo, shape, num_classes=10)
    assert _as_replayed(record_events(desc, batch)) == _as_replayed(record_events(desc, batch, method="trace"))
    with pytest.raises(UserError, match="laid out by strides along dimensions of size 1"):
        record_events(desc, batch, method="model")


def test_a_window_attention_with_a_dropout_goes_to_the_trace():
    """A window attention with a dropout of its weights (which the model does not write down) is the trace's."""
    import dataclasses

    from perf4sight.errors import UserError
    desc = _small_swin(32)
    nodes = [Node(n.name, n.op, list(n.inputs), {**n.attrs, "attention_dropout": 0.1} if n.op == "window_attention"
                  else dict(n.attrs), list(n.output_shape)) for n in desc.nodes]
    dropped = dataclasses.replace(desc, name=desc.name + "_dropout", nodes=nodes)
    assert _as_replayed(record_events(dropped, 2)) == _as_replayed(record_events(dropped, 2, method="trace"))
    with pytest.raises(UserError, match="with a dropout"):
        record_events(dropped, 2, method="model")


def _small_vit() -> NetworkDescription:
    """torchvision's VisionTransformer of two layers (16 features, 2 heads) over 4 patches of a 3 x 16 x 16 image:
    its class token, position embedding, attention and layer norms of a residual stream laid out transposed."""
    from torchvision.models.vision_transformer import VisionTransformer

    from perf4sight.ir.from_torch import describe
    module = VisionTransformer(image_size=16, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16, mlp_dim=32,
                               num_classes=10)
    return describe(module, [3, 16, 16], "small_vit")


@pytest.mark.parametrize("zoo", ["small", "vit_b_32"])
def test_allocation_model_writes_down_a_vision_transformer_as_traced(zoo):
    """A ViT's events as the meta trace records them (attention as a CUDA build runs it: the memory-efficient
    kernel), event for event and step by step: the class token's cat and its gradient summed down, the position
    embedding's add, the attention's copies (the transposed input, the packed query, key and value, the heads, and
    each of their gradients), its kernel's log-sum-exp, seed and offset, the output's transposed layout that the
    residual adds carry on, and the class token's select."""
    from perf4sight.networks.zoo import describe_zoo
    desc = _small_vit() if zoo == "small" else describe_zoo("vit_b_32", [3, 64, 64], num_classes=10)
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    ops = {op for _, _, _, op in traced}
    assert {"aten._scaled_dot_product_efficient_attention.default", "aten.select_backward.default"} <= ops
    assert _as_replayed(model) == _as_replayed(traced)
    sims = [simulate(desc, method=m) for m in ("model", "trace")]
    assert sims[0].peaks_mb([1, 7, 64]).tolist() == sims[1].peaks_mb([1, 7, 64]).tolist()


def test_an_attention_the_model_does_not_follow_goes_to_the_trace():
    """Attention of a strided input (tokens permuted from a map: no copy before the projection's product), or with
    a dropout of its weights, is the trace's."""
    from torch import nn

    from perf4sight.errors import UserError
    from perf4sight.ir.from_torch import describe

    class Attend(nn.Module):
        def __init__(self, dropout: float, norm: bool):
            super().__init__()
            self.norm = nn.LayerNorm(8) if norm else nn.Identity()
            self.attention = nn.MultiheadAttention(8, 2, dropout=dropout, batch_first=True)
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(6 * 8, 10))

        def forward(self, x):
            x = self.norm(x.flatten(2).permute(0, 2, 1))
            return self.head(self.attention(x, x, x, need_weights=False)[0])

    for dropout, norm, reason in ((0.0, False, "attention of a strided"), (0.1, True, "dropout")):
        desc = describe(Attend(dropout, norm), [8, 2, 3], "attend")
        assert record_events(desc, 2) == record_events(desc, 2, method="trace")
        with pytest.raises(UserError, match=reason):
            record_events(desc, 2, method="model")
    desc = describe(Attend(0.0, True), [8, 2, 3], "attend")
    assert _as_replayed(record_events(desc, 2, method="model")) == _as_replayed(record_events(desc, 2, method="trace"))


@pytest.mark.parametrize("layouts", [("channels_last", "contiguous"), ("contiguous", "channels_last"),
                                     ("nhwc_permuted", "channels_last"), ("channels_last", "broadcast"),
                                     ("broadcast", "nhwc_permuted"), ("transposed", "channels_last"),
                                     ("broadcast", "transposed"), ("contiguous", "transposed")])
def test_the_modelled_layout_of_an_elementwise_result_is_torch_s(layouts):
    """The strides the model gives the result of an add or a multiply of two tensors laid out differently are the
    ones torch gives it (TensorIterator's order of the dimensions, the first operand's first)."""
    import torch

    from perf4sight.features.alloc_strides import _iterated, _strides

    shape = (3, 5, 4, 2)

    def operand(layout):
        if layout == "broadcast":  # a [C, 1, 1] weight
            return torch.empty(5, 1, 1, device="meta"), (0, 1, 0, 0)
        if layout == "nhwc_permuted":  # a [N, H, W, C] tensor permuted to [N, C, H, W]
            t = torch.empty(3, 4, 2, 5, device="meta").permute(0, 3, 1, 2)
        elif layout == "transposed":  # [N, C, W, H] transposed to [N, C, H, W]
            t = torch.empty(3, 5, 2, 4, device="meta").transpose(2, 3)
        else:
            formats = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}
            t = torch.empty(shape, device="meta").contiguous(memory_format=formats[layout])
        return t, t.stride()

    (a, sa), (b, sb) = operand(layouts[0]), operand(layouts[1])
    expected = (a * b).stride()
    assert (_iterated(shape, [sa, sb]) or _strides(shape)) == expected


def test_an_in_place_relu_on_a_kept_tensor_falls_back_to_the_trace():
    """ReLU in place on a tensor a convolution keeps for its backward: autograd would refuse it, so the
    trace runs ReLU out of place; the model hands such a network to the trace."""
    from torch import nn

    from perf4sight.errors import UserError
    from perf4sight.ir.from_torch import describe

    class Clash(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.side = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 1)
            self.relu, self.head = nn.ReLU(), nn.Sequential(nn.Flatten(), nn.Linear(4 * 8 * 8, 10))

        def forward(self, x):
            x = self.stem(x)
            return self.head(self.side(x) + self.relu(x))
    desc = describe(Clash(), [3, 8, 8], "clash")
    assert record_events(desc, 2) == record_events(desc, 2, method="trace")
    with pytest.raises(UserError, match="in-place relu"):
        record_events(desc, 2, method="model")


@pytest.mark.parametrize("read", [
    lambda y, r: y + r(y),
    lambda y, r: r(y).sigmoid() * y,
    lambda y, r: r(y) * 2 + y.mean(1, keepdim=True),
])
def test_an_in_place_relu_on_a_tensor_read_again_later_is_written_down_as_traced(read):
    """A ReLU (run in place, the project's convention) on a tensor that a node after it reads too (``y + y.relu()``):
    that node reads the written tensor, whose history torch has rebased onto the ReLU's backward, so both of its
    gradients go through the ReLU's node (summed first). The model sent the later reader's gradient to the
    convolution as if the tensor were unwritten: its events disagreed with the trace's in the backward."""
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Reread(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.relu, self.fc = nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Linear(4, 10)

        def forward(self, x):
            return self.fc(read(self.stem(x), self.relu).mean((2, 3)))
    desc = describe(Reread(), [3, 8, 8], "reread")
    (relu,) = [n for n in desc.nodes if n.op == "relu"]
    assert any("stem" in n.inputs for n in desc.nodes[desc.nodes.index(relu) + 1:])
    model, traced = record_events(desc, 3, steps=2, method="model"), record_events(desc, 3, steps=2, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)


def test_a_view_of_a_gradient_slice_is_copied_as_in_the_trace():
    """Channels split into groups, concatenated inside the groups: the backward reshapes a slice of a
    gradient, which PyTorch copies (no view has those strides); the model follows the strides."""
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Groups(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.fc = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 4, 1), nn.Linear(8, 10)

        def forward(self, x):
            n, _, h, w = x.shape
            y = torch.cat([self.a(x).reshape(n, 2, 2, h, w), self.b(x).reshape(n, 2, 2, h, w)], 2)
            return self.fc(y.reshape(n, 8, h, w).mean([2, 3]))

    import torch
    desc = describe(Groups(), [3, 4, 4], "groups")
    traced = record_events(desc, 2, steps=1, method="trace")
    conv_out = 2 * 4 * 4 * 4 * 4  # bytes of a convolution's output at batch 2: its gradient, copied
    assert sum(op == "aten.clone.default" and size == conv_out for _, _, size, op in traced) == 2
    assert _as_replayed(record_events(desc, 2, steps=1, method="model")) == _as_replayed(traced)


def test_every_schema_op_is_written_down_indexing_and_scalars_included():
    """The model covers every op a description can hold but a local response norm (the trace writes it down); an
    indexed tensor (select of a max-pooled map: a strided view), scalar add and multiply
    included, matches the trace."""
    from torch import nn

    from perf4sight.features.alloc_model import COVERED
    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.schema import OPS

    class Indexed(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.pool, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.AdaptiveMaxPool2d(2), nn.Linear(8, 10)

        def forward(self, x):
            return self.fc(((self.pool(self.conv(x))[:, :, 0] + 1.0) * 0.5).mean(2))

    assert COVERED == set(OPS) - {"local_response_norm"}
    desc = describe(Indexed(), [3, 8, 8], "indexed")
    assert {"select", "adaptivemaxpool2d"} <= {n.op for n in desc.nodes}
    assert _as_replayed(record_events(desc, 3, method="model")) == _as_replayed(record_events(desc, 3, method="trace"))


def test_a_loss_per_pixel_and_both_resizes_are_written_down_as_traced():
    """A network that scores every pixel: nearest and bilinear resizes (they keep nothing), and the loss over a
    class score per pixel (NLL's 2-D kernels, a label per pixel): the model's events are the meta trace's."""
    from torch import nn

    from perf4sight.ir.from_torch import describe
    net = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(), nn.Upsample(scale_factor=2),
                        nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.Conv2d(8, 5, 1),
                        nn.Upsample(size=(16, 16), mode="bilinear"))
    desc = describe(net, [3, 16, 16], "seg")
    model, traced = record_events(desc, 3, steps=2, method="model"), record_events(desc, 3, steps=2, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    assert {e[3] for e in model} >= {"aten.upsample_nearest2d.default", "aten.upsample_bilinear2d_backward.default",
                                     "aten.nll_loss2d_forward.default"}
    assert [e[2] for e in model if e[3] == "labels"] == [3 * 16 * 16 * 8]


def test_the_rows_torch_version_chooses_the_relu6_rule():
    """The fit replays ReLU6 as the torch that measured the rows ran it; rows without a version (imported
    perf4sight data) keep the old rule."""
    from perf4sight.fingerprint.fit import relu6_clone

    def rows(*versions):
        return [{"torch_version": v} for v in versions]
    assert relu6_clone(rows("2.11.0+cu130", "1.10.2"))
    assert not relu6_clone(rows("1.9.0"))
    assert not relu6_clone(rows("2.14.1", "1.8.1"))  # one older run: the old rule
    assert not relu6_clone(rows("", "")) and not relu6_clone([{}])
    assert relu6_clone(rows("", "2.0.1"))


@pytest.mark.parametrize("zoo", ["resnet18", "mobilenet_v2"])
def test_gradients_freed_by_zero_grad_are_written_down_as_torch_runs_them(zoo):
    """Steps that begin with ``zero_grad(set_to_none=True)`` (this tool's profiler, torch 2.0's default) free every
    gradient and make them again in the backward, as the first step does: the derived steps match three real ones,
    and the steady step's allocated peak is lower than with the gradients kept and zeroed in place (perf4sight's),
    by at most one copy of the parameters."""
    from perf4sight.features.step_runtime import StepRuntime
    from perf4sight.networks.zoo import describe_zoo
    desc = describe_zoo(zoo, [3, 32, 32], num_classes=10)
    for method in ("model", "trace"):
        fast = record_events(desc, 3, steps=3, method=method, set_to_none=True)
        assert _as_replayed(fast) == _as_replayed(record_events(desc, 3, steps=3, fast=False, set_to_none=True))
    freed = simulate(desc, method="model", **StepRuntime(foreach=False, grads_to_none=True).traced_update())
    kept = simulate(desc, method="model")
    gap = (kept.peaks_mb([2])[0, 1] - freed.peaks_mb([2])[0, 1]) * MIB
    assert 0 < gap <= desc.params * 4
    # the replay's repeats of the steady step free the gradients its previous run left, as steps spelled out do
    spelled = record_events(desc, 8, steps=4, method="model", set_to_none=True)
    spelled_trace = AllocTrace("spelled", np.array([e[0] for e in spelled], dtype=np.int8),
                               np.array([e[1] for e in spelled]), np.array([float(e[2]) for e in spelled]),
                               np.zeros(len(spelled)), repeat_last=0)
    assert freed.replay(8) == spelled_trace.replay(8)
    # ... writing each left-alive gradient's FREE once, not once per gradient the step frees: linear in the step
    kinds, ids = freed.kind.tolist(), freed.tensor.tolist()
    last = int(np.flatnonzero(freed.kind == STEP)[-1])
    assert len(_repeat_plan(kinds, ids, last, len(kinds))[0]) < 2 * (len(kinds) - last)


@pytest.mark.parametrize("optimizer,momentum,weight_decay,foreach", [
    ("sgd", 0.0, 0.0, False), ("sgd", 0.9, 0.0, True), ("sgd", 0.9, 5e-4, True), ("sgd", 0.0, 5e-4, False),
    ("adam", 0.0, 1e-2, False), ("adam", 0.0, 1e-2, True)])
def test_the_updates_settings_are_written_down_as_the_real_optimizer_runs_them(optimizer, momentum, weight_decay,
                                                                                foreach):
    """SGD without momentum (no buffers), SGD's and Adam's weight decay (a decayed copy of each gradient: one at a time
    in the single-tensor update, all at once in a ``foreach`` one) are written down as the real optimizer records
    them on the meta device, over three steps; the replay of a runtime's rules traces them (``traced_update``)."""
    from perf4sight.features.step_runtime import StepRuntime
    from perf4sight.networks.zoo import describe_zoo
    desc = describe_zoo("squeezenet1_0", [3, 32, 32], num_classes=10)
    kw = dict(optimizer=optimizer, momentum=momentum, weight_decay=weight_decay, foreach=foreach)
    for method in ("model", "trace"):
        fast = record_events(desc, 3, steps=3, method=method, **kw)
        assert _as_replayed(fast) == _as_replayed(record_events(desc, 3, steps=3, fast=False, **kw))
    rt = StepRuntime(optimizer=optimizer, foreach=foreach, momentum=momentum > 0, weight_decay=weight_decay > 0)
    traced = simulate(desc, method="model", **rt.traced_update())
    assert np.array_equal(traced.const, simulate(desc, method="model", **kw).const)
    if weight_decay and foreach:  # every decayed copy at once: a higher peak than one at a time
        single = simulate(desc, method="model", **dict(kw, foreach=False))
        assert traced.peaks_mb([4])[0, 1] > single.peaks_mb([4])[0, 1]


@pytest.mark.parametrize("optimizer,foreach", [("adam", True), ("adamw", True), ("adam", False), ("adamw", False)])
def test_adam_step_is_written_down_as_the_real_optimizer_runs_it(optimizer, foreach):
    """The events written down for Adam's and AdamW's step (both moments on the first step; then a square root of
    every second moment at once, as a CUDA build's ``foreach`` update makes them, or a root and its quotient per
    parameter, as a CPU's single-tensor update does) are those the real optimizer records on the meta device (its
    step counters stay on the host), over three steps; both moments are on top of SGD's momentum, so the replayed
    peak of the steady state is higher by at least one copy of the parameters."""
    from perf4sight.networks.zoo import describe_zoo
    desc = describe_zoo("squeezenet1_0", [3, 32, 32], num_classes=10)
    for method in ("model", "trace"):
        fast = record_events(desc, 3, steps=3, method=method, optimizer=optimizer, foreach=foreach)
        assert _as_replayed(fast) == _as_replayed(record_events(desc, 3, steps=3, fast=False, optimizer=optimizer,
                                                                foreach=foreach))
    param_bytes = desc.params * 4
    adam = simulate(desc, method="model", optimizer=optimizer, foreach=foreach)
    sgd = simulate(desc, method="model")
    assert adam.optimizer == optimizer and adam.foreach == foreach and sgd.optimizer == "sgd"
    assert (adam.peaks_mb([4])[0, 1] - sgd.peaks_mb([4])[0, 1]) * MIB >= 0.9 * param_bytes > 0
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        record_events(desc, 3, optimizer="lamb")


def test_attention_is_traced_as_a_cuda_build_runs_it():
    """A GPU runs 32-bit self-attention as the memory-efficient kernel (the meta device alone would take the math
    path): the trace records that kernel, and what it leaves alive for the backward is its output and a log-sum-exp
    per head and token (tokens padded to 32), none of the heads' tokens x tokens weights."""
    import torch
    from torch import nn

    from perf4sight.ir.from_torch import describe

    tokens, width, heads = 40, 32, 4

    class Attend(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
            self.head = nn.Sequential(nn.Flatten(), nn.Linear(tokens * width, 10))

        def forward(self, x):
            x = x.flatten(2).permute(0, 2, 1)
            return self.head(self.attention(x, x, x, need_weights=False)[0])

    desc = describe(Attend(), [width, 5, 8], "attend")

    def alive_at_backward(batch):  # (op, bytes) of each tensor the forward leaves alive; every op of the run
        events = record_events(desc, batch, steps=1, method="trace")
        start = next(i for i, e in enumerate(events) if e[0] == STEP)
        end = next(i for i, e in enumerate(events) if "backward" in e[3])
        alive = {}
        for kind, tensor, size, op in events[start:end]:
            if kind == ALLOC:
                alive[tensor] = (op, size)
            elif kind == FREE:
                alive.pop(tensor, None)
        ops = {op for _, _, _, op in events}
        return sorted(alive.values()), ops

    (two, ops), (three, _) = alive_at_backward(2), alive_at_backward(3)
    assert "aten._scaled_dot_product_efficient_attention.default" in ops
    assert not any("softmax" in op and "log_softmax" not in op for op in ops)
    fused = "aten._scaled_dot_product_efficient_attention.default"
    per_sample = sorted(b - a for (op, a), (_, b) in zip(two, three) if op == fused and b > a)
    assert per_sample == sorted([heads * 64 * 4, tokens * width * 4])  # log-sum-exp, output
    assert all(b - a != heads * tokens * tokens * 4 for (_, a), (_, b) in zip(two, three))
    assert torch.nn.functional.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


def _super_resolved(first: str = "conv") -> NetworkDescription:
    """An SRGAN-like generator's layers: PReLU of a slope per channel and of one slope, a call on the module's own
    slopes after a residual add; Dropout2d (the layer and the call); log-softmaxes over the channels and over each
    channel's pixels. ``first``: what the input meets first ("conv", or "prelu" / "dropout2d": a layer on the
    network input, which needs no gradient)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Generator(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = {"conv": nn.Identity(), "prelu": nn.PReLU(3), "dropout2d": nn.Dropout2d(0.3)}[first]
            self.c1, self.a1 = nn.Conv2d(3, 16, 3, padding=1), nn.PReLU(16)
            self.c2, self.a2 = nn.Conv2d(16, 16, 3, padding=1), nn.PReLU()
            self.own = nn.Module()
            self.own.slopes = nn.Parameter(torch.full((16,), 0.25))
            self.drop, self.fc = nn.Dropout2d(0.2), nn.Linear(16, 5)

        def forward(self, x):
            x = self.a1(self.c1(self.head(x)))
            y = F.prelu(self.a2(self.c2(x)) + x, self.own.slopes)
            y = F.dropout2d(self.drop(y), 0.1, self.training)
            p = F.log_softmax(y.log_softmax(1).flatten(2), -1)
            return self.fc(p.mean(2))

    return describe(Generator(), [3, 8, 8], "generator")


def test_allocation_model_writes_down_prelu_dropout2d_and_log_softmax_as_traced():
    """Measured on torch 2.14: a PReLU keeps its input, and its backward (``_prelu_kernel_backward``) allocates the
    input's gradient and the slopes' per element, which the engine sums down to the slopes; a Dropout2d allocates a
    float noise per sample and channel (``new_empty``, drawn and scaled in place), then its output (a multiply), and
    keeps the noise; a log-softmax keeps its result. The model writes them down as the meta trace records them."""
    desc = _super_resolved()
    assert [n.op for n in desc.nodes].count("prelu") == 3 and [n.op for n in desc.nodes].count("dropout2d") == 2
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    allocs = [(op, size) for kind, _, size, op in model if kind == ALLOC]
    assert allocs.count(("aten._prelu_kernel_backward.default", 3 * 16 * 64 * 4)) == 3 * 2 * 3  # two a PReLU a step
    assert allocs.count(("aten.new_empty.default", 3 * 16 * 4)) == 2 * 3  # the noise: a float per sample, channel
    assert sum(op == "aten._log_softmax_backward_data.default" for op, _ in allocs) == (2 + 1) * 3  # the loss's


def test_allocation_model_writes_down_a_dropout1d_of_flattened_pixels_as_traced():
    """A Dropout1d of a [N, C, H x W] tensor (a dropout2d of [C, L], rebuilt as nn.Dropout1d) runs torch's channel
    dropout as a Dropout2d does: a float noise per sample and channel, then its output; the model writes it down as
    the meta trace records it, after a view and before a mean."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Flat(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.drop, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Dropout1d(0.3), nn.Linear(8, 5)

        def forward(self, x):
            return self.fc(F.dropout1d(self.drop(torch.relu(self.conv(x)).flatten(2)), 0.1, self.training).mean(2))

    desc = describe(Flat(), [3, 8, 8], "flat")
    assert [n.output_shape for n in desc.nodes if n.op == "dropout2d"] == [[8, 64], [8, 64]]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    allocs = [(op, size) for kind, _, size, op in model if kind == ALLOC]
    assert allocs.count(("aten.new_empty.default", 3 * 8 * 4)) == 2 * 3  # the noise: a float per sample, channel


def test_allocation_model_writes_down_softsign_tanhshrink_and_softmin_as_traced():
    """Softsign, Tanhshrink and Softmin, described as the ops torch computes them from (abs, add, div; tanh, times -1,
    add; times -1, softmax), are written down by the model as the meta trace records them, event for event."""
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3), nn.Linear(8, 5)
            self.sign, self.shrink, self.soft = nn.Softsign(), nn.Tanhshrink(), nn.Softmin(1)

        def forward(self, x):
            y = self.c2(self.shrink(self.sign(self.c1(x))))
            return self.fc(F.softsign(F.tanhshrink(self.soft(y))).mean((2, 3)))

    desc = describe(Net(), [3, 8, 8], "composed")
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    kernels = [op for kind, _, _, op in model if kind == ALLOC]
    assert kernels.count("aten.div.Tensor") >= 2 * 3 and kernels.count("aten._softmax.default") == 3


def test_allocation_model_writes_down_a_glu_as_traced():
    """A GLU (measured on torch 2.14 on the CPU and the meta device, 2.11 on CUDA): aten.glu makes its output, half
    its input, which it keeps; aten.glu_backward writes the input's gradient. The model writes it down as the meta
    trace records it, over the channels (a gated convolution) and over the features of a vector."""
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.fc = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(8, 8, 3), nn.Linear(4, 5)
            self.gate = nn.GLU(1)

        def forward(self, x):
            return self.fc(F.glu(self.c2(self.gate(self.c1(x))).mean((2, 3))))

    desc = describe(Gated(), [3, 8, 8], "gated")
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    allocs = [(op, size) for kind, _, size, op in model if kind == ALLOC]
    assert allocs.count(("aten.glu.default", 3 * 8 * 8 * 8 * 4)) == 3
    assert allocs.count(("aten.glu_backward.default", 3 * 16 * 8 * 8 * 4)) == 3


def test_allocation_model_writes_down_shrinks_and_thresholds_as_traced():
    """Measured on torch 2.14 (the CPU, the meta device) and 2.11 (CUDA): aten.hardshrink, aten.softshrink and
    aten.threshold keep their input, their backward aten.<op>_backward (threshold_backward); a threshold in place
    keeps a clone of its input, made before it runs. The model writes them down as the meta trace records them."""
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.c3 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 8, 1)
            self.hard, self.cut, self.fc = nn.Hardshrink(0.3), nn.Threshold(0.1, -1.0, inplace=True), nn.Linear(8, 5)

        def forward(self, x):
            y = self.c3(self.cut(self.c2(self.hard(self.c1(x)))))
            return self.fc(F.threshold(F.softshrink(y, 0.2), 0.0, 2.0).mean((2, 3)))

    desc = describe(Net(), [3, 8, 8], "shrinks")
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    kernels = [op for kind, _, _, op in model if kind == ALLOC]
    allocs = [(op, size) for kind, _, size, op in model if kind == ALLOC]
    cloned = allocs.count(("aten.clone.default", 3 * 8 * 6 * 6 * 4))  # c2's output, before the in-place threshold
    assert cloned == kernels.count("aten.threshold.default") == 3
    assert kernels.count("aten.threshold_backward.default") == 2 * 3
    assert kernels.count("aten.hardshrink_backward.default") == kernels.count("aten.softshrink_backward.default") == 3


def test_allocation_model_writes_down_a_log_sigmoid_as_cuda_runs_it():
    """aten.log_sigmoid_forward makes its output and a buffer that its backward keeps with its input: empty on CUDA
    (measured on torch 2.11), of the input's size on the meta device, whose trace took it for CUDA's. The trace now
    makes it empty, as CUDA does; the model writes the log-sigmoid down as the trace records it."""
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3), nn.Linear(8, 5)
            self.act = nn.LogSigmoid()

        def forward(self, x):
            return self.fc(F.logsigmoid(self.c2(self.act(self.c1(x)))).mean((2, 3)))

    desc = describe(Net(), [3, 8, 8], "logsig")
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    made = sorted(size for kind, _, size, op in traced if kind == ALLOC and op == "aten.log_sigmoid_forward.default")
    assert made == sorted([0, 0, 3 * 8 * 8 * 8 * 4, 3 * 8 * 6 * 6 * 4] * 3)  # outputs, and empty buffers


def test_allocation_model_writes_down_selu_and_celu_as_traced():
    """Measured on torch 2.14: a SELU runs aten.elu (of a scale), a CELU aten.celu; each keeps its input, or in place
    its result, and its backward is aten.elu_backward. The model writes them down as the meta trace records them."""
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.c3 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 8, 1)
            self.a1, self.a2, self.fc = nn.SELU(), nn.CELU(0.5, inplace=True), nn.Linear(8, 5)

        def forward(self, x):
            y = F.celu(self.c2(self.a1(self.c1(x))), 2.0)
            return self.fc(F.selu(self.c3(self.a2(y)), inplace=True).mean((2, 3)))

    desc = describe(Net(), [3, 8, 8], "snn")
    assert [n.op for n in desc.nodes if n.op in ("selu", "celu")] == ["selu", "celu", "celu", "selu"]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    kernels = [op for kind, _, _, op in model if kind == ALLOC]
    assert kernels.count("aten.elu.default") == kernels.count("aten.celu.default") == 3
    assert kernels.count("aten.elu_backward.default") == 4 * 3


@pytest.mark.parametrize("first", ["prelu", "dropout2d"])
def test_a_prelu_or_dropout2d_on_the_network_input_is_written_down_as_traced(first):
    """On the network input (no gradient wanted), a Dropout2d frees its noise at once, which the model writes down;
    torch's PReLU backward still computes both gradients and frees the input's, which goes to the trace."""
    from perf4sight.errors import UserError

    desc = _super_resolved(first)
    traced = record_events(desc, 3, steps=2, method="trace")
    assert _as_replayed(record_events(desc, 3, steps=2)) == _as_replayed(traced)
    if first == "dropout2d":
        assert _as_replayed(record_events(desc, 3, steps=2, method="model")) == _as_replayed(traced)
    else:
        with pytest.raises(UserError, match="prelu on a tensor that needs no gradient"):
            record_events(desc, 3, method="model")


def test_a_dropout_of_p_zero_is_the_input_handed_back_as_traced():
    """A dropout left at p 0 (a configurable one switched off, as many users' heads are): torch hands the input back,
    no kernel and no autograd node, for a dropout and a dropout2d alike (an in-place ReLU after one writes its input).
    The model wrote such a network off to the trace; it writes it down as an identity, as the trace records it. A p
    of 1 (a multiply by a zero) still goes to the trace."""
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.errors import UserError
    from perf4sight.ir.from_torch import describe

    class Off(nn.Module):
        def __init__(self, p: float) -> None:
            super().__init__()
            self.c1, self.bn, self.d2 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Dropout2d(p)
            self.c2, self.drop, self.fc = nn.Conv2d(8, 8, 3, padding=1), nn.Dropout(p), nn.Linear(8, 10)

        def forward(self, x):
            x = self.c2(F.relu(self.d2(self.bn(self.c1(x))), inplace=True))
            return self.fc(self.drop(x.mean((2, 3))))

    desc = describe(Off(0.0), [3, 8, 8], "off")
    model, traced = record_events(desc, 3, steps=2, method="model"), record_events(desc, 3, steps=2, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    assert not any("dropout" in op or op == "aten.new_empty.default" for _, _, _, op in model)
    ones = describe(Off(1.0), [3, 8, 8], "ones")
    with pytest.raises(UserError, match="dropout2d with p 1"):
        record_events(ones, 3, method="model")


def test_a_channel_shuffle_allocates_what_torchs_channel_shuffle_does():
    """A channel shuffle is described as a view, a transpose and a reshape (a copy): the allocation model writes it
    down as the meta trace records it, and the trace of the rebuilt network allocates and frees the same sizes in the
    same order as torch's own aten.channel_shuffle of the module (one output-sized copy forward, one backward)."""
    import torch
    from torch import nn

    from perf4sight.features.alloc_trace import _OptimizerStep, _trace
    from perf4sight.features.optimizers import PERF4SIGHT_MOMENTUM
    from perf4sight.ir.from_torch import describe

    torch.manual_seed(0)
    original = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True), nn.ChannelShuffle(4),
                             nn.Conv2d(8, 6, 3, groups=2), nn.ChannelShuffle(3), nn.Flatten(), nn.Linear(6 * 6 * 6, 5))
    desc = describe(original, [3, 8, 8], "shuffled")
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    step = _OptimizerStep("sgd", 0.1, PERF4SIGHT_MOMENTUM, None)
    own = _trace(original.to("meta").train(), desc, 3, 3, step, {}, False)
    assert sum(op == "aten.channel_shuffle.default" for _, _, _, op in own) == 2 * 2 * 3  # forward and backward
    sizes = [event[:2] for event in _as_replayed(traced)]  # the allocating op left out: torch's is channel_shuffle
    assert sizes == [event[:2] for event in _as_replayed(own)]


def test_allocation_model_writes_down_rms_norms_as_a_cuda_build_runs_them():
    """An RMS norm runs on a CUDA build of torch >= 2.8 as its fused kernel: the output and a 1/rms per row, the input
    and the latter kept; backward one op making the input's gradient and the weight's. The trace runs it so (on the
    meta device torch runs it op by op), and the model writes it down as the trace records it: over the whole map, of
    the network input (no input gradient), over the rows without a weight."""
    from torch import nn

    from perf4sight.features.alloc_trace import _OptimizerStep, _trace
    from perf4sight.features.optimizers import PERF4SIGHT_MOMENTUM
    from perf4sight.ir.from_torch import describe

    original = nn.Sequential(nn.RMSNorm([3, 8, 8]), nn.Conv2d(3, 8, 3, padding=1), nn.RMSNorm([8, 8, 8]),
                             nn.ReLU(), nn.Conv2d(8, 8, 3), nn.RMSNorm(6, elementwise_affine=False), nn.Flatten(),
                             nn.Linear(8 * 6 * 6, 5))
    desc = describe(original, [3, 8, 8], "rms")
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    kernels = [(op, size) for kind, _, size, op in model if kind == ALLOC]
    rows = [3, 3, 3 * 8 * 6]  # a 1/rms per sample, per sample, per sample, channel and row
    first_step = [size for op, size in kernels if op == "aten._fused_rms_norm.default"][:6]  # output, 1/rms each
    assert first_step == [3 * 192 * 4, rows[0] * 4, 3 * 512 * 4, rows[1] * 4, 3 * 288 * 4, rows[2] * 4]
    assert sum(op == "aten._fused_rms_norm_backward.default" for op, _ in kernels) == (1 + 2 + 1) * 3
    step = _OptimizerStep("sgd", 0.1, PERF4SIGHT_MOMENTUM, None)
    own = _trace(original.to("meta").train(), desc, 3, 3, step, {}, False)  # torch's own, op by op
    assert sum(op == "aten._fused_rms_norm.default" for _, _, _, op in own) == 0
    assert sum(op == "aten.rsqrt.default" for _, _, _, op in own) == 3 * 3


def _tiled(*repeats: int):
    """A layer that tiles its input ``repeats`` times along each dimension after the batch (x.repeat)."""
    from torch import nn

    class Tile(nn.Module):
        def forward(self, x):
            return x.repeat(1, *repeats)

    return Tile()


def test_allocation_model_writes_down_repeats_as_torch_runs_them():
    """A repeat is torch's aten.repeat: a copy, nothing kept; backward the gradient viewed as (count, size) pairs
    and summed over the counts (aten.sum.dim_IntList), or handed on where every count is 1. The model writes it down
    as the meta trace records it, and the trace of the rebuilt network records what torch records for the module."""
    import torch
    from torch import nn

    from perf4sight.features.alloc_trace import _OptimizerStep, _trace
    from perf4sight.features.optimizers import PERF4SIGHT_MOMENTUM
    from perf4sight.ir.from_torch import describe

    torch.manual_seed(0)
    original = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(inplace=True), _tiled(2, 1, 1),
                             nn.Conv2d(8, 8, 3, padding=1), _tiled(1, 2, 3), nn.Conv2d(8, 6, 3, stride=2),
                             _tiled(1, 1, 1), nn.Flatten(), nn.Linear(6 * 3 * 5, 5))
    desc = describe(original, [3, 4, 4], "tiled")
    assert [n.attrs["repeats"] for n in desc.nodes if n.op == "repeat"] == [[2, 1, 1], [1, 2, 3], [1, 1, 1]]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    kernels = [op for kind, _, _, op in model if kind == ALLOC]
    assert kernels.count("aten.repeat.default") == 3 * 3
    step = _OptimizerStep("sgd", 0.1, PERF4SIGHT_MOMENTUM, None)
    own = _trace(original.to("meta").train(), desc, 3, 3, step, {}, False)
    assert _as_replayed(own) == _as_replayed(traced)


def test_allocation_model_writes_down_rrelus_as_traced():
    """An RReLU in training (measured on torch 2.14): a noise of the input's size (empty_like), then its output or in
    place its input; it keeps the noise and its input, or its result; backward rrelu_with_noise_backward. The model
    writes it down as the meta trace records it, on the network input too (no gradient: the noise freed at once)."""
    import torch.nn.functional as F
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 3), nn.Linear(8, 5)
            self.a0, self.a1, self.a2 = nn.RReLU(), nn.RReLU(0.1, 0.3), nn.RReLU(inplace=True)

        def forward(self, x):
            y = self.c2(self.a1(self.c1(self.a0(x))))
            return self.fc(F.rrelu(self.a2(y), training=True).mean((2, 3)))

    desc = describe(Net(), [3, 8, 8], "randomised")
    assert [n.attrs.get("inplace", False) for n in desc.nodes if n.op == "rrelu"] == [False, False, True, False]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    kernels = [op for kind, _, _, op in model if kind == ALLOC]
    assert kernels.count("aten.empty_like.default") == 4 * 3 and kernels.count("aten.rrelu_with_noise.default") == 9
    assert kernels.count("aten.rrelu_with_noise_backward.default") == 3 * 3


def test_allocation_model_writes_down_alpha_dropouts_as_torch_runs_them():
    """An alpha dropout in training (no kernel of its own, measured on torch 2.14): a noise (of the input's size, or a
    float per sample and channel), a shift made of it, the output, the shift freed; the noise kept, the backward's
    product allocated. The model writes it down as the meta trace records it, on the network input (no gradient: the
    noise freed at once) and of p 0 (its input handed back) too, and the trace records what torch records for the
    module."""
    import torch
    from torch import nn

    from perf4sight.features.alloc_trace import _OptimizerStep, _trace
    from perf4sight.features.optimizers import PERF4SIGHT_MOMENTUM
    from perf4sight.ir.from_torch import describe

    torch.manual_seed(0)
    original = nn.Sequential(nn.AlphaDropout(0.1), nn.Conv2d(3, 8, 3, padding=1), nn.SELU(), nn.AlphaDropout(0.2),
                             nn.Conv2d(8, 8, 3), nn.SELU(), nn.FeatureAlphaDropout(0.1), nn.AlphaDropout(0.0),
                             nn.Flatten(), nn.Linear(8 * 6 * 6, 5))
    desc = describe(original, [3, 8, 8], "snn")
    assert [n.attrs.get("feature", False) for n in desc.nodes if n.op == "alpha_dropout"] == [False, False, True, False]
    model, traced = record_events(desc, 3, steps=3, method="model"), record_events(desc, 3, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    kernels = [(op, size) for kind, _, size, op in model if kind == ALLOC]
    assert [size for op, size in kernels if op == "aten.new_empty.default"] == [3 * 8 * 4] * 3  # the channels' noise
    assert sum(op == "aten.add.Scalar" for op, _ in kernels) == 3 * 3
    step = _OptimizerStep("sgd", 0.1, PERF4SIGHT_MOMENTUM, None)
    own = _trace(original.to("meta").train(), desc, 3, 3, step, {}, False)
    assert _as_replayed(own) == _as_replayed(traced)


def test_an_rms_norm_of_a_channels_last_map_is_traced_op_by_op():
    """A CUDA build's rms_norm runs a channels-last map (here a map permuted back from channels last) op by op, as
    torch does on the meta device, not as its fused kernel: the trace records an rsqrt for it (and fused kernels for
    the norms of contiguous tensors), and the allocation model, which does not cover a strided input, leaves the
    network to it."""
    from torch import nn

    from perf4sight.ir.from_torch import describe

    class ChannelsLast(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.n1 = nn.Conv2d(3, 8, 3, padding=1), nn.RMSNorm(8)
            self.c2, self.n2, self.n3 = nn.Conv2d(8, 8, 3, padding=1), nn.RMSNorm(8), nn.RMSNorm([8, 8])
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            y = self.n1(self.c1(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
            return self.fc(self.n3(self.c2(self.n2(y))).mean((2, 3)))

    desc = describe(ChannelsLast(), [3, 8, 8], "channels_last")
    traced = [op for kind, _, _, op in record_events(desc, 3, steps=1, method="trace") if kind == ALLOC]
    assert traced.count("aten.rsqrt.default") == 1 and traced.count("aten._fused_rms_norm.default") == 2 * 2
    assert _as_replayed(record_events(desc, 3, steps=2)) == _as_replayed(record_events(desc, 3, steps=2,
                                                                                      method="trace"))


@pytest.mark.parametrize("batch", [1, 3])
def test_allocation_model_writes_down_a_frozen_batch_norm_as_traced(batch):
    """A frozen batch norm's four [C] buffers are set up in its layer's place; each forward makes its [C] scale and
    shift (five [C] tensors, three freed at once), then the product and the sum on the map, keeping the scale where
    its input needs a gradient (not the network input's): the meta trace's events, event for event."""
    from test_features import frozen_backbone

    from perf4sight.ir.from_torch import describe
    desc = describe(frozen_backbone(), [3, 8, 8], "frozen")
    model = record_events(desc, batch, steps=3, method="model")
    traced = record_events(desc, batch, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    setup = [size for kind, _, size, op in model if op == "setup"]
    # each norm's buffers where .to(device) moves them: after the layer before it, before the layer after it
    assert setup == [3 * 4] * 4 + [16 * 3 * 9 * 4] + [16 * 4] * 4 + [16 * 16 * 9 * 4] + [16 * 4] * 4 + [5 * 16 * 4, 20]
    rsqrt = [size for kind, _, size, op in model if op == "aten.rsqrt.default"]
    assert rsqrt == [12, 64, 64] * 3  # each norm's 1/sqrt(running_var + eps), each of 3 steps


def test_a_frozen_batch_norm_called_twice_holds_its_buffers_once():
    """One FrozenBatchNorm2d called at two places in forward was described as two norms, each with its four [C]
    buffers: rebuilt with two modules and set up twice by the allocation model and the trace (eight buffers where the
    network holds four). Its second call shares the first's, as a layer with parameters called twice does: rebuilt
    as the one module (computing what the original computes), its buffers set up once, the trace's events."""
    import torch
    from torch import nn
    from torchvision.ops.misc import FrozenBatchNorm2d

    from perf4sight.ir.from_torch import describe
    from perf4sight.ir.to_torch import build_module

    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 16, 3, padding=1)
            self.f, self.fc = FrozenBatchNorm2d(16), nn.Linear(16, 5)
            self.f.running_var.copy_(torch.rand(16) + 0.5)
            self.f.running_mean.copy_(torch.randn(16))

        def forward(self, x):
            x = self.f(self.c1(x)).relu()
            return self.fc(self.f(self.c2(x)).relu().mean((2, 3)))

    torch.manual_seed(0)
    original = Twice()
    desc = describe(original, [3, 8, 8], "twice")
    assert [n.attrs.get("shares") for n in desc.nodes if n.op == "frozen_batchnorm2d"] == [None, "f"]
    rebuilt = build_module(desc)
    assert sum(b.numel() for b in rebuilt.buffers()) == sum(b.numel() for b in original.buffers()) == 4 * 16
    rebuilt.load_state_dict(original.state_dict(), strict=False)
    x = torch.randn(2, 3, 8, 8)
    assert torch.allclose(rebuilt(x), original(x))
    model = record_events(desc, 2, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, 2, steps=2, method="trace"))
    setup = [size for kind, _, size, op in model if op == "setup"]
    # three layers' weights and biases, the norm's buffers once, where its first call is
    assert setup == [16 * 3 * 9 * 4, 16 * 4] + [16 * 4] * 4 + [16 * 16 * 9 * 4, 16 * 4, 5 * 16 * 4, 20]


@pytest.mark.parametrize("batch", [1, 3])
def test_allocation_model_writes_down_an_instance_norm_with_running_statistics_as_traced(batch):
    """An instance norm that tracks running statistics sets up its running mean, variance and count after its
    parameters; each forward repeats the running mean and variance once per sample (kept by the norm where anything
    needs a gradient) and then makes their means over the batch (C floats each, freed once copied back): the meta
    trace's events, event for event, of one on the input (no gradient), one affine and one plain."""
    from test_ir import tracked_instance_norms

    from perf4sight.ir.from_torch import describe
    desc = describe(tracked_instance_norms(), [3, 8, 8], "tracked")
    model = record_events(desc, batch, steps=3, method="model")
    traced = record_events(desc, batch, steps=3, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)
    means = [size for _, _, size, op in model if op == "aten.mean.dim"]  # the head's mean last, [N, 8] floats
    assert means == [12, 12, 32, 32, 32, 32, 32 * batch] * 3  # two of each of the three norms, each of 3 steps


class _Products:
    """Products of two activations on a conv's [N, 4, 16] and [N, 6, 16] maps (flattened): ``plain`` a @ b^T (b
    transposed, a view); ``of_the_input`` the network input (which needs no gradient) times b^T; ``transposed_grad``
    the product transposed after (its incoming gradient a transposed view); ``sliced`` of a narrowed input (its rows
    a row apart: a GEMM reads it as it lies); ``every_other`` of every other element of a and b (no GEMM's). Of
    [N, 2, 2, 16] maps (two heads of two channels each): ``heads`` a @ b^T; ``permuted_heads`` of a and b
    permuted to [N, 2, 2, 16] and [N, 2, 16, 2] (torch copies them to view them as three dimensions), and
    ``attention`` softmax(a^T b) b^T of a's and b's heads permuted so; ``heads_transposed_after`` the product of
    heads transposed after; ``broadcast`` a's heads times one b^T of [N, 1, 16, 4] (a transposed view);
    ``broadcast_first`` one b of [N, 1, 4, 16] times a's heads transposed."""

    @staticmethod
    def module(case: str):
        import torch
        from torch import nn

        class Products(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 6 if case in _Products.THREE_DIMS else 4, 1)

            def forward(self, x):
                b = self.b(x).flatten(2)
                if case == "of_the_input":
                    return (x.flatten(2) @ b.transpose(1, 2)).flatten(1)
                a = self.a(x).flatten(2)
                heads = {} if case in _Products.THREE_DIMS else {"a": a.unflatten(1, (2, 2))}
                if heads and not case.startswith("broadcast"):
                    heads["b"] = b.unflatten(1, (2, 2))
                y = {"plain": lambda: a @ b.transpose(1, 2),
                     "transposed_grad": lambda: (a @ b.transpose(1, 2)).transpose(1, 2),
                     "sliced": lambda: a.transpose(1, 2) @ b[:, :4],
                     "every_other": lambda: a.unflatten(2, (8, 2)).select(3, 0)
                     @ b.unflatten(2, (8, 2)).select(3, 1).transpose(1, 2),
                     "heads": lambda: heads["a"] @ heads["b"].transpose(2, 3),
                     "permuted_heads": lambda: heads["a"].permute(0, 2, 1, 3) @ heads["b"].permute(0, 2, 3, 1),
                     "attention": lambda: torch.softmax(heads["a"].transpose(2, 3) @ heads["b"], -1)
                     @ heads["b"].permute(0, 1, 3, 2),
                     "heads_transposed_after": lambda: (heads["a"] @ heads["b"].transpose(2, 3)).transpose(1, 2),
                     "broadcast": lambda: heads["a"] @ b.transpose(1, 2).unsqueeze(1),
                     "broadcast_first": lambda: b.unsqueeze(1) @ heads["a"].transpose(2, 3)}[case]()
                return y.flatten(1)
        return Products()

    THREE_DIMS = ("plain", "of_the_input", "transposed_grad", "sliced", "every_other")


@pytest.mark.parametrize("case", ["plain", "of_the_input", "transposed_grad", "heads", "permuted_heads", "attention",
                                  "heads_transposed_after", "non_local",
                                  "sliced"])
def test_allocation_model_writes_down_a_matmul_as_traced(case):
    """A product of two activations, each input contiguous, a transposed view or one a GEMM reads as it lies (a
    narrowed one), or copied (aten.clone) where its leading dims do not view as one (a permuted one), then torch's
    bmm of the output; it keeps each input (or its
    copy) that the other's gradient reads; backward the incoming gradient viewed as three dimensions (copied where it
    cannot be: heads transposed after), then b's gradient, then a's (a bmm each). Also a non-local block (Wang et
    al. 2018) in a ResNet-like network: the model's events are the meta trace's."""
    import sys
    from pathlib import Path

    from perf4sight.ir.from_torch import describe

    if case == "non_local":
        sys.path.insert(0, str(Path(__file__).parent))
        from test_pruning_call_patterns import _NonLocalResNet
        desc = describe(_NonLocalResNet(), [3, 8, 8], "nonlocal")
    else:
        desc = describe(_Products.module(case), [3, 4, 4], case)
    assert "matmul" in {n.op for n in desc.nodes}
    model, traced = record_events(desc, 3, steps=2, method="model"), record_events(desc, 3, steps=2, method="trace")
    assert _as_replayed(model) == _as_replayed(traced)


@pytest.mark.parametrize("batch", [3, 1])
def test_allocation_model_writes_down_a_matmul_of_a_broadcast_input_as_traced(batch):
    """A product of one [4, 16] matrix a sample, broadcast, and two heads: torch expands the broadcast input and
    copies it at its expanded size (at batch 1 its expanded dims still view as one: no copy), keeps the copy, and
    sums its gradient down after the product's backward: the model's events are the meta trace's."""
    from perf4sight.ir.from_torch import describe

    desc = describe(_Products.module("broadcast_first"), [3, 4, 4], "broadcast_first")
    model = record_events(desc, batch, steps=2, method="model")
    assert _as_replayed(model) == _as_replayed(record_events(desc, batch, steps=2, method="trace"))


@pytest.mark.parametrize("case, match", [("every_other", "matmul of an input strided other than transposed"),
                                         ("broadcast", "matmul of a strided broadcast input")])
def test_a_matmul_the_allocation_model_does_not_follow_goes_to_the_trace(case, match):
    """A product of every other element of its inputs (matrices no GEMM reads as they lie), or of a broadcast input
    that is a transposed view, is not written down by the model, saying why; the trace takes the network."""
    from perf4sight.errors import UserError
    from perf4sight.ir.from_torch import describe

    desc = describe(_Products.module(case), [3, 4, 4], case)
    with pytest.raises(UserError, match=match):
        record_events(desc, 3, method="model")
    auto, traced = record_events(desc, 3, steps=2), record_events(desc, 3, steps=2, method="trace")
    assert _as_replayed(auto) == _as_replayed(traced)


@pytest.mark.parametrize("batches", [(65521,), (2, 5)])
def test_a_simulated_trace_holds_its_events_as_arrays(batches):
    """simulate's trace holds the recorded events' kinds (int8), tensors (int64) and each size split into a
    constant and a per-sample part (floats), read a field at a time: as the events' own columns give them."""
    from perf4sight.features.alloc_trace import clear_cache, simulate
    from perf4sight.networks.zoo import describe_zoo
    desc = describe_zoo("maxvit_t", [3, 224, 224])
    clear_cache()
    trace = simulate(desc, batches)
    runs = record_runs(desc, batches)
    kinds, tensors, sizes, _ = zip(*runs[0])
    assert trace.kind.dtype == np.int8 and trace.tensor.dtype == np.int64
    assert trace.kind.tolist() == list(kinds) and trace.tensor.tolist() == list(tensors)
    assert trace.const.dtype == trace.per_sample.dtype == np.float64
    b = batches[0]
    assert (trace.const + trace.per_sample * b).tolist() == [float(s) for s in sizes]
    if len(batches) == 2:
        assert (trace.const + trace.per_sample * batches[1]).tolist() == [float(s) for _, _, s, _ in runs[1]]
    else:  # a size divisible by the probe batch is per sample
        assert trace.per_sample.tolist() == [s // b if s % b == 0 and s > 0 else 0 for s in sizes]


def test_the_setup_allocates_the_weights_and_buffers_in_the_order_module_to_moves_them():
    """The profiler builds the model on the host and moves it with ``.to(device)``, which allocates each submodule's
    tensors first, then a module's own parameters, then its own buffers: a batch norm's running statistics right
    after its weight and bias, an attention's output projection before its packed input one, a window or group
    attention's linear layers before its bias table. The setup written down (and traced) allocates in that order:
    it decides which small segment a tensor lands in (mobilenetv2 on the TX2 graph at batch 8: 2 MiB reserved)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from perf4sight.features.alloc_model import step_events
    from perf4sight.ir.to_torch import build_module

    class Moved(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.sizes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and out.device.type == "meta":
                self.sizes.append(out.untyped_storage().nbytes())
            return out

    nets = [_small_maxvit(64), _small_vit(), _small_swin(36), _small_swin(36, True)]  # MaxViT's: batch norms too
    order = {}
    for desc in nets:
        moved = Moved()
        with moved:
            build_module(desc).to("meta")
        order[desc.name] = moved.sizes
        setup = [size for kind, _, size, op in step_events(desc, 2).setup if op == "setup"]
        assert setup == moved.sizes and len(set(setup)) > 3, desc.name
    # the meta trace's setup too (a ViT's: an attention's own parameters and its submodule's)
    traced = [size for kind, _, size, op in record_events(nets[1], 2, method="trace") if op == "setup"]
    assert traced == order[nets[1].name]


HOPPER_WORKSPACES = (32 * MIB, MIB)  # cuBLAS's per handle and cuBLASLt's, as torch 2.11 allocated them on an H200


def test_cublas_workspaces_are_kept_from_the_first_blas_kernel_of_each_thread():
    """As the H200's allocation histories show them: after the first addmm's output in the forward, cuBLAS's workspace,
    then cuBLASLt's; after the first product's output in the backward (autograd's thread: a handle of its own), a
    second cuBLAS workspace; never freed, and none in a later step."""
    desc = _tiny()
    runs = record_runs(desc, (4,), set_to_none=True)
    (events,) = with_blas_workspaces(runs, *HOPPER_WORKSPACES)
    assert with_blas_workspaces(runs) is runs  # none on a CPU or an older torch
    added = [i for i, e in enumerate(events) if e[3].endswith("workspace")]
    assert [events[i][2] for i in added] == [32 * MIB, MIB, 32 * MIB] and len(events) == len(runs[0]) + 3
    second_step = [i for i, e in enumerate(events) if e[0] == STEP][1]
    assert added[-1] < second_step and not {events[i][1] for i in added} & {e[1] for e in events if e[0] == FREE}
    assert events[added[0] - 1][3] == "aten.addmm.default" and added[1] == added[0] + 1
    seed = next(i for i, e in enumerate(events) if e[3] == "aten.ones_like.default")
    assert added[1] < seed < added[2] and events[added[2] - 1][3] == "aten.mm.default"
    assert not any(e[3] == "aten.mm.default" for e in events[seed:added[2] - 1])  # the backward's first product
    base, kept = simulate(desc, set_to_none=True), simulate(desc, set_to_none=True, blas_workspace=HOPPER_WORKSPACES)
    assert kept.blas_workspace == HOPPER_WORKSPACES and base.blas_workspace == (0, 0)
    (res0, al0), (res1, al1) = base.replay(8), kept.replay(8)
    assert al1 - al0 == 65 * MIB and res1 - res0 >= 64 * MIB  # in every later step


def test_a_steps_loss_and_workspaces_are_traced_under_simulates_own_keys():
    """attach_simulation gives simulate a loss and cuBLAS's workspaces only where they are not its defaults, so a
    cross entropy's step without workspaces is the trace of simulate's plain keywords (one cache entry), and an MSE
    step with an H200's workspaces that of the two keywords given."""
    from perf4sight.features.step_runtime import StepRuntime
    desc = _tiny()
    for runtime, given in ((StepRuntime(), {}), (StepRuntime(loss="mse", blas_workspace=HOPPER_WORKSPACES),
                                                 {"loss": "mse", "blas_workspace": HOPPER_WORKSPACES})):
        nf = attach_simulation(network_features(desc, runtime), desc)
        alone = simulate(desc, relu6_clone=runtime.relu6_clone, **runtime.traced_update(), **given)
        assert nf.sim is alone.with_protocol(nf.sim.protocol)
        assert (nf.sim.loss, nf.sim.blas_workspace) == (runtime.loss, runtime.blas_workspace)


def test_the_rows_name_the_cublas_workspaces_of_their_gpu_and_torch():
    from perf4sight.features.step_runtime import StepRuntime
    from perf4sight.fingerprint.fit import blas_workspace, step_runtime

    def rows(backend, torch, model):
        return [{"backend": backend, "torch_version": torch, "device_model": model}] * 2

    assert blas_workspace(rows("nvml", "2.11.0+cu130", "NVIDIA H200")) == HOPPER_WORKSPACES
    assert blas_workspace(rows("nvml", "2.11.0+cu130", "NVIDIA H100 80GB HBM3")) == HOPPER_WORKSPACES
    assert blas_workspace(rows("nvml", "2.1.0", "NVIDIA A100-SXM4-40GB")) == (8519680, 0)  # :4096:2:16:8, Lt per call
    assert blas_workspace(rows("jetson", "1.10.0", "tx2")) == (0, 0)  # cuBLAS kept its own then
    assert blas_workspace(rows("cpu", "2.11.0", "")) == blas_workspace(rows("imported", "", "")) == (0, 0)
    runtime = step_runtime(rows("nvml", "2.11.0+cu130", "NVIDIA H200"))
    assert runtime.blas_workspace == HOPPER_WORKSPACES
    assert StepRuntime.from_metadata(runtime.metadata()) == runtime
    older = {k: v for k, v in runtime.metadata().items() if k != "blas_workspace_bytes"}
    assert StepRuntime.from_metadata(older).blas_workspace == (0, 0)  # stored before: fitted without them
    with pytest.raises(ValueError, match="blas_workspace"):
        StepRuntime.from_metadata({**runtime.metadata(), "blas_workspace_bytes": [1.5, 0]})
    nf = network_features(_tiny(), runtime)
    ensure_simulation([nf], ("one", "sim_reserved_mb"))
    assert nf.sim.blas_workspace == HOPPER_WORKSPACES


def test_every_op_params_sizes_is_one_it_does_not_pass_over():
    """``alloc_values._params`` answers at once for an op outside ``_PARAM_OPS`` (most nodes: 0.3 ms of a large
    network): every op its body gives parameters or buffers must be in that set, or a new one would silently get
    none."""
    import inspect
    import re

    from perf4sight.features import alloc_values
    body = inspect.getsource(alloc_values._params)
    named = set(re.findall(r'node\.op == "(\w+)"', body))
    for group in re.findall(r"node\.op in \(([^)]*)\)", body):
        named |= set(re.findall(r'"(\w+)"', group))
    assert {"conv2d", "linear", "attention"} <= named
    assert named <= alloc_values._PARAM_OPS, sorted(named - alloc_values._PARAM_OPS)
