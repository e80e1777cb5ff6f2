"""The allocator replay's shortcuts for speed (issue 5): each gives what the plain computation gives."""
from __future__ import annotations

import numpy as np

from perf4sight.features.alloc_trace import simulate
from perf4sight.features.allocator import ALLOC, AllocTrace, round_size


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
