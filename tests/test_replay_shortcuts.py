"""The allocator replay's shortcuts for speed (issue 5): each gives what the plain computation gives."""
from __future__ import annotations

import numpy as np

from perf4sight.features.alloc_trace import simulate
from perf4sight.features.allocator import ALLOC, STEP, AllocTrace, round_size


def _plain_rounded(trace: AllocTrace, batch: int) -> np.ndarray:
    sizes = trace.sizes(batch)
    return np.append(np.where(sizes > 0, round_size(sizes), 0), 0)


def test_the_replay_s_rounded_sizes_are_sizes_rounded_with_a_0_last():
    """The sizes the replay runs, worked out in place, are :meth:`AllocTrace.sizes` rounded by round_size, a 0
    appended: a network's at many batch sizes, and sizes at the edges (0, a negative size clipped, 1, 511, 512, 513
    bytes, fractions rounded half to even, 1 MiB and past), of float arrays and of integer ones (made by hand)."""
    from perf4sight.networks.zoo import describe_zoo
    trace = simulate(describe_zoo("resnet18", [3, 32, 32], num_classes=10), method="model")
    for batch in (1, 2, 7, 64, 65521):
        assert np.array_equal(trace._rounded_sizes(batch), _plain_rounded(trace, batch))
    const = np.array([0.0, -3.0, 1.0, 511.0, 512.0, 513.0, 0.5, 1.5, 2.5, 1048576.0, 1048577.0, 0.0, 7.0])
    per = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 256.25, 505.0])
    n = len(const)
    made = AllocTrace("edges", np.full(n, ALLOC, dtype=np.int8), np.arange(n), const, per)
    ints = AllocTrace("ints", np.full(n, ALLOC, dtype=np.int8), np.arange(n), const.astype(np.int64),
                      np.zeros(n, dtype=np.int64))
    for trace in (made, ints):
        for batch in (1, 2, 3, 1000):
            rounded = trace._rounded_sizes(batch)
            assert rounded.dtype == np.int64 and np.array_equal(rounded, _plain_rounded(trace, batch))
    assert made._rounded_sizes(2)[:11].tolist() == [0, 0, 512, 512, 512, 1024, 0, 512, 512, 1 << 20, (1 << 20) + 512]
    assert made._rounded_sizes(2)[-1] == 0 and made.sizes(2)[11] == 512 and made._rounded_sizes(2)[11] == 512


def _pieces(plain: tuple, small: np.ndarray) -> tuple[list[int], list[int]]:
    """Where a run's events (pairs fused, ``plain``) and the same run with back-to-back small pairs as one are cut so
    that each run of such pairs is a piece of its own in both: (cuts in ``plain``, cuts in the other)."""
    from perf4sight.features.allocator import _ALLOC_FREE
    kinds, _, index = plain
    flags = [k == _ALLOC_FREE and i >= 0 and small[i] > 0 for k, i in zip(kinds, index)] + [False]
    cuts, fused_cuts, start, removed = [], [], None, 0
    for i, flag in enumerate(flags):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            if i - start > 1:
                cuts += [start, i]
                fused_cuts += [start - removed, start - removed + 1]
                removed += i - start - 1
            start = None
    return cuts, fused_cuts


def _piece_states(trace: AllocTrace, runs: list, cuts: list, batch: int) -> list[tuple]:
    """The peaks of each piece of each run (cut at ``cuts``; peaks reset before each piece) and the allocator's whole
    state after it (addresses included), the runs' events (kinds, ids, size indices) through one allocator."""
    from perf4sight.features.allocator import CachingAllocator
    sizes = trace._rounded_sizes(batch)
    alloc, live, out = CachingAllocator(), {}, []
    for (kinds, ids, index), at in zip(runs, cuts):
        for a, b in zip([0] + at, at + [len(kinds)]):
            alloc.reset_peaks()
            alloc.run(kinds[a:b], ids[a:b], sizes[index[a:b]].tolist(), live)
            out.append((alloc.peak_reserved, alloc.peak_allocated, alloc._next_ptr, alloc.snapshot(live)))
    return out


def test_back_to_back_pairs_of_small_sizes_run_as_one_leave_the_allocator_as_they_do():
    """Where back-to-back pairs of batch-independent small sizes run as one pair of their largest (the optimiser's
    scratch of small parameters), the peaks of each such run and of the events between, and the allocator after each
    (every address, both pools, the live tensors), are those of the pairs run one by one: a MaxViT's, a Swin V2's and
    a ResNet's steps and repeats, three optimiser settings, at batch sizes that put the activations in either pool."""
    from test_allocator import _small_maxvit, _small_swin

    from perf4sight.features.allocator import _fused
    from perf4sight.networks.zoo import describe_zoo
    collapsed = 0
    for desc in (_small_maxvit(64), _small_swin(36, True), describe_zoo("resnet18", [3, 32, 32], num_classes=10)):
        for setting in ({}, {"optimizer": "adam"}, {"set_to_none": True}):
            trace = simulate(desc, method="model", **setting)
            one_by_one = _fused(trace.kind, trace.tensor, np.arange(len(trace.kind)))
            marks = [0] + np.flatnonzero(trace.kind[one_by_one[2]] == STEP).tolist() + [len(one_by_one[0])]
            plain = [(one_by_one[0][s:e], one_by_one[1][s:e], one_by_one[2][s:e]) for s, e in zip(marks, marks[1:])]
            plain += [_fused(*_plan(trace))] * 2
            fused = trace._fused_runs() + [trace._repeat_run()] * 2
            cuts = [_pieces(run, trace._small_pairs()) for run in plain]
            assert [len(run[0]) - len(f[0]) for run, f in zip(plain, fused)] == \
                [sum(b - a - 1 for a, b in zip(c[::2], c[1::2])) for c, _ in cuts]  # each run of pairs is one
            collapsed += sum(len(run[0]) - len(f[0]) for run, f in zip(plain, fused))
            for batch in (1, 2, 6, 40, 300):
                assert _piece_states(trace, fused, [f for _, f in cuts], batch) == \
                    _piece_states(trace, plain, [c for c, _ in cuts], batch)
    assert collapsed > 100


def _plan(trace: AllocTrace) -> tuple:
    """The last step's events as a repeat runs them, before pairs are fused (:func:`_repeat_plan`)."""
    from perf4sight.features.allocator import FREE, _repeat_plan
    start = int(np.flatnonzero(trace.kind == STEP)[-1])
    kinds, ids = trace.kind[start:], trace.tensor[start:]
    if np.isin(ids[kinds == FREE], ids[kinds == ALLOC]).all():
        return kinds, ids, np.arange(start, len(trace.kind))
    return _repeat_plan(trace.kind.tolist(), trace.tensor.tolist(), start, len(trace.kind))


def test_replays_from_a_shared_copy_of_the_setup_s_first_events_are_those_from_a_new_allocator(monkeypatch):
    """A replay that starts from a copy of the allocator after the setup's batch-independent events (the weights'
    blocks shared by every copy) leaves the allocator after the setup and after each step as a new allocator running
    every event does (every address, both pools, the live tensors), and gives the same per-step peaks, replay after
    replay of one trace at batch sizes in turn (a copy's steps touch no other copy), under each protocol."""
    from test_allocator import _small_maxvit

    from perf4sight.features.allocator import REPLAY_PROTOCOLS, CachingAllocator
    from perf4sight.networks.zoo import describe_zoo
    for desc in (_small_maxvit(64), describe_zoo("resnet18", [3, 32, 32], num_classes=10)):
        trace = simulate(desc, method="model", set_to_none=True)
        runs = trace._fused_runs()
        alloc, live, done = trace._setup_start()
        assert done == len(runs[0][0]) - 2 and done > 50  # all but the input and the labels
        for batch in (1, 6, 40, 1, 300):
            sizes = trace._rounded_sizes(batch)
            alloc, live, done = trace._setup_start()
            fresh, fresh_live = CachingAllocator(), {}
            for n, (kinds, ids, index) in enumerate(runs + [trace._repeat_run()]):
                skip = done if n == 0 else 0
                alloc.run(kinds[skip:], ids[skip:], sizes[index[skip:]].tolist(), live)
                fresh.run(kinds, ids, sizes[index].tolist(), fresh_live)
                assert (alloc.snapshot(live), alloc._next_ptr, alloc.peak_reserved, alloc.peak_allocated) == \
                    (fresh.snapshot(fresh_live), fresh._next_ptr, fresh.peak_reserved, fresh.peak_allocated)
                alloc.reset_peaks()
                fresh.reset_peaks()
            alloc.unlink(live)
        for protocol in REPLAY_PROTOCOLS:
            view = trace.with_protocol(protocol)
            shared = [view._step_peaks(view._rounded_sizes(b)) for b in (2, 7, 33, 2)]
            with monkeypatch.context() as m:
                m.setattr(AllocTrace, "_setup_start", lambda self: (CachingAllocator(), {}, 0))
                assert shared == [view._step_peaks(view._rounded_sizes(b)) for b in (2, 7, 33, 2)]


def test_no_replay_shares_the_setup_s_blocks_where_a_later_event_names_one_of_its_tensors():
    """The setup's first events are run once and shared only where no later event names their tensors: a step that
    frees a weight (its block then split, merged, handed out again) replays from a new allocator, with the figures of
    its events run one by one, replay after replay; without that free, 20 events are shared, with the same figures."""
    from test_allocator import _replayed_event_by_event

    from perf4sight.features.allocator import FREE
    for frees_a_weight in (True, False):
        kinds = [ALLOC] * 22 + [STEP, ALLOC] + [FREE] * frees_a_weight + [FREE, ALLOC, ALLOC, FREE, FREE]
        ids = list(range(1, 23)) + [0, 100] + [5] * frees_a_weight + [100, 101, 102, 102, 101]
        const = [3000.0 + 700 * i for i in range(20)] + [0.0, 0.0, 0.0, 0.0] + [0.0] * frees_a_weight + \
            [0.0, 9000.0, 0.0, 0.0, 0.0]
        per = [0.0] * 20 + [3e5, 4.0, 0.0, 2e5] + [0.0] * frees_a_weight + [0.0, 0.0, 5e4, 0.0, 0.0]
        base = AllocTrace("weights", np.array(kinds, dtype=np.int8), np.array(ids), np.array(const), np.array(per))
        for protocol in ("run_peak", "perf4sight"):
            trace = base.with_protocol(protocol)
            assert trace._setup_start()[2] == (0 if frees_a_weight else 20)
            for batch in (1, 3, 40, 1):
                trace._memo.clear()
                assert trace.replay(batch) == _replayed_event_by_event(trace, batch)
