"""A model of PyTorch's CUDA caching allocator, and the replay of a training step's allocations through it.

Pure Python + numpy (no torch): the allocation trace itself comes from ``alloc_trace.py``
(a meta-device run of the training step); this module turns it into the peak memory the
caching allocator *reserves* (``torch.cuda.max_memory_reserved``) and *allocates*
(``torch.cuda.max_memory_allocated``), in bytes, at any batch size.

The rules are those of ``c10/cuda/CUDACachingAllocator.cpp`` in the PyTorch 1.x releases the
perf4sight TX2 data was measured with (read in the public PyTorch sources; constants
``kMinBlockSize``, ``kSmallSize``, ``kSmallBuffer``, ``kLargeBuffer``, ``kMinLargeAlloc``,
``kRoundLarge``; functions ``round_size``, ``get_pool``, ``get_allocation_size``,
``get_free_block``, ``should_split``, ``free_block`` / ``try_merge_blocks``):

- a request is rounded up to a multiple of 512 bytes (at least 512);
- requests of at most 1 MiB use the *small* pool, larger ones the *large* pool;
- the pool's smallest free block that fits is taken (best fit; ties: lowest address);
- without one, a new segment is ``cudaMalloc``-ed: 2 MiB for a small request, 20 MiB for a
  request under 10 MiB, else the request rounded up to 2 MiB;
- the block is split when the remainder is >= 512 bytes (small pool) or > 1 MiB (large pool);
  an unsplit block is handed out whole (and counted whole in allocated bytes);
- a freed block merges with free neighbours of its segment and stays cached: segments are returned
  only by ``empty_cache`` (every segment that is one free block; the retry-after-freeing-the-cache
  path on OOM is not modelled).

Single stream, no ``max_split_size``/expandable segments (later PyTorch options off by default).

A profiler turns the steps of a run into one memory figure by its own rule; the replay follows the
same rule (:data:`REPLAY_PROTOCOLS`), so that the simulated peak and the measured one mean the same:

- ``run_peak``: the peak over the warm-up and timed steps, peaks reset once before them (this tool's
  profiler, ``profiling/backends``);
- ``perf4sight``: perf4sight's TX2 profiler (``profiling/tx2`` in ICIdsl/perf4sight). Before every step,
  warm-up included, it resets the peaks and empties the cache; it reads used memory at module forward
  and backward hooks, so a reading is the step's own peak (reserved memory only grows within a step);
  and it stores the mean of five readings: the warm-up's twice (its last hook and its end), then three
  timed steps;
- ``step_mean``: the mean of the per-step peaks, no ``empty_cache`` (fingerprints fitted before the
  protocols were told apart).
"""
from __future__ import annotations

import gc
from bisect import bisect_left, insort
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import islice
from operator import itemgetter
from typing import Callable, Iterator, NamedTuple

import numpy as np

__all__ = ["CachingAllocator", "AllocTrace", "TracedUpdate", "ALLOC", "FREE", "STEP", "round_size", "segment_size",
           "REPLAY_PROTOCOLS", "RUN_PEAK", "PERF4SIGHT", "STEP_MEAN"]

K_MIN_BLOCK = 512
_MIN_BLOCK_BITS = 9  # K_MIN_BLOCK == 1 << _MIN_BLOCK_BITS
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20

ALLOC, FREE, STEP = 0, 1, 2  # trace event kinds (STEP: start of a training step; peaks are reset there)
#: An ALLOC whose tensor the very next event FREEs, as the replay runs the pair (:func:`_fused`; never in a trace): the
#: allocator ends as it began, bar a new segment, so the pair is a best-fit look-up and the peaks it reaches.
_ALLOC_FREE = 3

RUN_PEAK, PERF4SIGHT, STEP_MEAN = "run_peak", "perf4sight", "step_mean"
#: How a profiler's memory figure is made from the steps of a run (see the module docstring): name -> in short.
REPLAY_PROTOCOLS = {RUN_PEAK: "the peak over the run, as this tool's profiler reads it",
                    PERF4SIGHT: "as perf4sight's profiler read it: cache emptied before every step, warm-up read twice",
                    STEP_MEAN: "the mean of the per-step peaks"}


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the block (restarted after it, where it ran before): the allocation
    model and the replay make tens of thousands of small lists and tuples, each few hundred of which start a
    collection that, in a process holding torch's modules, walks hundreds of thousands of objects (a tenth of a
    MaxViT's description -> prediction time). What they leave for the collector it collects after."""
    running = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if running:
            gc.enable()


def round_size(size: int | np.ndarray) -> int | np.ndarray:
    """Bytes a request of ``size`` bytes occupies: a multiple of 512, at least 512 (element-wise on arrays)."""
    return np.maximum(K_MIN_BLOCK, -(-size // K_MIN_BLOCK) * K_MIN_BLOCK)


def segment_size(size: int) -> int:
    """Bytes ``cudaMalloc``-ed for a new segment serving a (rounded) request of ``size`` bytes."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


#: A block is a list ``[address, size, small, allocated, previous block, next block]`` (the neighbours in its
#: segment, None at its ends), indexed by these names: a list is made and read faster than an object's attributes,
#: and the replay makes and reads a block at nearly every one of its thousands of events.
PTR, SIZE, SMALL, ALLOCATED, PREV, NEXT = range(6)
_Block = list
_ADDRESS, _BYTES = itemgetter(PTR), itemgetter(SIZE)  # a block's address, its size


class BlockHandle:
    """What :meth:`CachingAllocator.malloc` hands out: the block's address and size (bytes) as they are now."""
    __slots__ = ("block",)

    def __init__(self, block: _Block):
        self.block = block

    @property
    def ptr(self) -> int:
        return self.block[PTR]

    @property
    def size(self) -> int:
        return self.block[SIZE]


#: A free block's key in its pool: its size shifted above its address, so that the sorted keys order the blocks by
#: size, then address (best fit, lowest address first), and compare as plain integers (addresses stay below 2**48).
_ADDRESS_BITS = 48


class CachingAllocator:
    """The caching allocator's bookkeeping (no memory). Sizes in bytes; ``malloc`` returns a handle."""

    def __init__(self) -> None:
        self._pools: tuple[list[int], list[int]] = ([], [])  # (large, small): sorted keys of the free blocks
        self._free: dict[int, _Block] = {}  # key -> free block
        self._next_ptr = 1 << 32
        self.reserved = 0
        self.allocated = 0
        self.peak_reserved = 0
        self.peak_allocated = 0

    def reset_peaks(self) -> None:
        """``torch.cuda.reset_peak_memory_stats``: peaks restart from the current figures."""
        self.peak_reserved, self.peak_allocated = self.reserved, self.allocated

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache``: return every segment that is one free block (the peaks keep their values). Each
        pool is filtered once (a TX2 step's replay returns a few hundred segments: one deletion from the sorted keys
        each took three times as long)."""
        free = self._free
        for pool in self._pools:
            whole = [key for key in pool if free[key][PREV] is None and free[key][NEXT] is None]
            if whole:
                for key in whole:
                    self.reserved -= free.pop(key)[SIZE]
                pool[:] = [key for key in pool if key in free]  # keys are unique across the pools (addresses are)

    def snapshot(self, live: dict[int, _Block], skip: int = 0, tensors: bool = True) -> tuple:
        """Everything the next requests depend on, made in a few C loops for a look every few hundred events
        (:func:`_marked_run`): reserved and allocated bytes, the free blocks of both pools and where each live
        tensor's block lies (its address and size, the tensors listed in ``live``'s order: an order that differs
        only misses a match). Equal snapshots replay equally. ``live`` holds no None (:meth:`run` keeps none
        there). ``skip``: the first ``skip`` live tensors left out, tensors that no event between the snapshots
        compared touches (:func:`_untouched_prefix`): they stay first in ``live``, and an allocated block keeps its
        address and size, so theirs are the same in both. ``tensors`` False: the tensors' list left out (a third of
        the look), for looks at the same point of two runs of the same events that began with the same live
        tensors: which tensors are live, and in what order, follows from those and the events alone, so theirs are
        the same (:func:`_run_to_mark`)."""
        blocks = list(islice(live.values(), skip, None))
        look = (self.reserved, self.allocated, tuple(self._pools[0]), tuple(self._pools[1]),
                list(map(_ADDRESS, blocks)), list(map(_BYTES, blocks)))
        return look[:4] + (list(islice(live, skip, None)),) + look[4:] if tensors else look

    def unlink(self, live: dict[int, _Block]) -> None:
        """Forget every block's neighbours (the free blocks' and the live tensors' blocks, ``live``), once the replay is
        done with the allocator: a segment's blocks, linked both ways, are cycles that only Python's cyclic collector
        would free, a few milliseconds after a MaxViT's 4 replays; without the links they go when the last reference
        does. The allocator serves no request after."""
        for blocks in (self._free.values(), live.values()):
            for block in blocks:
                block[PREV] = block[NEXT] = None

    def _copied(self) -> "CachingAllocator":
        """A copy of this allocator to replay on, whose allocated blocks stay allocated for good and are shared, not
        copied (walls: :meth:`AllocTrace._setup_start`): its free blocks copied (their neighbours are such walls, or
        none), its pools, bytes, peaks and next address. A wall is read for its address, size and being allocated,
        none of which changes; its neighbours are only written (a free block's are read, as it is split or freed)."""
        out = CachingAllocator()
        out._pools = (list(self._pools[0]), list(self._pools[1]))
        out._free = {key: list(block) for key, block in self._free.items()}
        out._next_ptr, out.reserved, out.allocated = self._next_ptr, self.reserved, self.allocated
        out.peak_reserved, out.peak_allocated = self.peak_reserved, self.peak_allocated
        return out

    def malloc(self, nbytes: int) -> BlockHandle | None:
        """Allocate ``nbytes`` (0 bytes -> no block, as in PyTorch)."""
        return self.malloc_rounded(int(round_size(nbytes))) if nbytes > 0 else None

    def malloc_rounded(self, size: int) -> BlockHandle:
        """Allocate ``size`` bytes, already rounded by :func:`round_size` (the replay rounds them all at once)."""
        live: dict[int, _Block | None] = {}
        self.run([ALLOC], [0], [size], live)
        return BlockHandle(live.get(0))  # type: ignore[arg-type]

    def free(self, handle: BlockHandle | None) -> None:
        """Return ``handle``'s block to its pool, merged with free neighbours (the segment stays reserved)."""
        self.run([FREE], [0], [0], {0: handle.block if handle is not None else None})

    def run(self, kinds: list[int], ids: list[int], sizes: list[int], live: dict[int, _Block | None],
            record: list[int] | None = None) -> None:
        """Carry out the events ``kinds[i]`` (:data:`ALLOC`, :data:`FREE` or :data:`_ALLOC_FREE`; others are passed
        over) of tensor ``ids[i]``: an ALLOC of ``sizes[i]`` bytes, already rounded (0: no block), puts its block in
        ``live`` (and an ALLOC of 0 takes its tensor out); a FREE returns the block ``live`` holds for its tensor, if
        any; an _ALLOC_FREE does both at once. ``record``: a list to which a request adds its size and minus that of
        the large segment it made, or the size of the free block it found where that is larger than the request and
        over 10 MiB (one that a large segment made later, of at least 10 MiB, could fit better: :func:`_no_better_fit`).
        One loop with its state in locals: the replay's hot path (a few thousand events per training step)."""
        pools, free_blocks = self._pools, self._free
        ptr_, size_, small_, allocated_, prev_, next_ = PTR, SIZE, SMALL, ALLOCATED, PREV, NEXT  # locals: fastest
        alloc_kind, free_kind, small_size, min_block, shift = ALLOC, FREE, K_SMALL_SIZE, K_MIN_BLOCK, _ADDRESS_BITS
        pair_kind, min_segment = _ALLOC_FREE, K_MIN_LARGE_ALLOC
        reserved, allocated = self.reserved, self.allocated
        peak_reserved, peak_allocated = self.peak_reserved, self.peak_allocated
        for kind, tensor, size in zip(kinds, ids, sizes):
            if kind == alloc_kind:
                if not size:  # no block: a FREE of the tensor frees nothing
                    live.pop(tensor, None)
                    continue
                small = size <= small_size
                pool = pools[small]
                i = bisect_left(pool, size << shift)  # best fit: the smallest, then lowest, free block
                if i < len(pool):  # its key stays in the pool until the rest's takes its place or it is deleted
                    block = free_blocks.pop(pool[i])
                    if record is not None and size < block[size_] > min_segment:
                        record += size, block[size_]
                else:  # none fits: a new segment
                    i = -1
                    block = self._segment(size, small)
                    if record is not None and not small:
                        record += size, -block[size_]
                    reserved += block[size_]
                    if reserved > peak_reserved:
                        peak_reserved = reserved
                remaining = block[size_] - size
                if remaining >= min_block if small else remaining > small_size:  # split; else handed out whole
                    after = block[next_]
                    rest = [block[ptr_] + size, remaining, small, False, block, after]
                    if after is not None:
                        after[prev_] = rest
                    block[next_] = rest
                    block[size_] = size
                    key = remaining << shift | rest[ptr_]
                    if i < 0:
                        insort(pool, key)
                    elif remaining >= size:  # above every key before the block's (under size << shift), below it
                        pool[i] = key
                    else:  # below size << shift: before the block's
                        del pool[i]
                        insort(pool, key, 0, i)
                    free_blocks[key] = rest
                elif i >= 0:
                    del pool[i]
                block[allocated_] = True
                allocated += block[size_]
                if allocated > peak_allocated:
                    peak_allocated = allocated
                live[tensor] = block
            elif kind == free_kind:
                block = live.pop(tensor, None)
                if block is None:
                    continue
                block[allocated_] = False
                allocated -= block[size_]
                pool = pools[block[small_]]
                prev, after = block[prev_], block[next_]
                if prev is not None and not prev[allocated_]:  # merged with its free neighbours
                    key = prev[size_] << shift | prev[ptr_]
                    del pool[bisect_left(pool, key)]
                    del free_blocks[key]
                    before = prev[prev_]
                    block[ptr_], block[size_], block[prev_] = prev[ptr_], block[size_] + prev[size_], before
                    if before is not None:
                        before[next_] = block
                if after is not None and not after[allocated_]:
                    key = after[size_] << shift | after[ptr_]
                    del pool[bisect_left(pool, key)]
                    del free_blocks[key]
                    nxt = after[next_]
                    block[size_], block[next_] = block[size_] + after[size_], nxt
                    if nxt is not None:
                        nxt[prev_] = block
                key = block[size_] << shift | block[ptr_]
                insort(pool, key)
                free_blocks[key] = block
            elif kind == pair_kind:  # the block the ALLOC takes goes back whole at once: no split, no merge
                live.pop(tensor, None)
                if not size:
                    continue
                small = size <= small_size
                pool = pools[small]
                i = bisect_left(pool, size << shift)
                if i < len(pool):
                    held = pool[i] >> shift
                    if record is not None and size < held > min_segment:
                        record += size, held
                else:  # the new segment stays, one free block
                    block = self._segment(size, small)
                    held = block[size_]
                    if record is not None and not small:
                        record += size, -held
                    key = held << shift | block[ptr_]
                    insort(pool, key)
                    free_blocks[key] = block
                    reserved += held
                    if reserved > peak_reserved:
                        peak_reserved = reserved
                remaining = held - size
                if remaining >= min_block if small else remaining > small_size:  # split: only ``size`` handed out
                    held = size
                if allocated + held > peak_allocated:
                    peak_allocated = allocated + held
        self.reserved, self.allocated = reserved, allocated
        self.peak_reserved, self.peak_allocated = peak_reserved, peak_allocated

    def _segment(self, size: int, small: bool) -> _Block:
        """A free block that is a new segment ``cudaMalloc``-ed for a request of ``size`` bytes (rounded), in no pool
        yet; the caller counts its bytes as reserved."""
        seg = segment_size(size)
        block = [self._next_ptr, seg, small, False, None, None]
        self._next_ptr += seg + K_SMALL_BUFFER  # keep segments apart: no merging across segments
        if self._next_ptr >= 1 << _ADDRESS_BITS:  # a key would no longer order by size first
            raise OverflowError("allocator replay: more than 256 TiB of segments made")
        return block


def _repeat_plan(kinds: list[int], ids: list[int], start: int, end: int) -> tuple[list[int], list[int], list[int]]:
    """The events ``start:end`` (a step) as a repeat of the step runs them: (kinds, tensor ids, the index of each
    event's size among the trace's events, -1 for none). A tensor the step frees without having allocated it (e.g.
    a gradient of a step that begins with ``zero_grad(set_to_none=True)``) was, on a repeat, allocated by the
    previous run under another id: each FREE of one frees every tensor the step allocates and leaves alive (frees
    commute; those already freed are passed over).

    Only the FREEs that can free something are written: at the first such FREE every tensor the step leaves alive
    (the previous run's), at a later one those allocated since. The plan is linear in the step's events (writing a
    FREE of every such tensor at every such FREE made resnet50's 1,145-event step 26,905 events on a GPU with
    ``set_to_none``) and the allocator sees the same frees in the same order."""
    made = {ids[i] for i in range(start, end) if kinds[i] == ALLOC}
    freed = {ids[i] for i in range(start, end) if kinds[i] == FREE}
    carried_in = freed - made
    carried_out = [ids[i] for i in range(start, end) if kinds[i] == ALLOC and ids[i] not in freed]
    left_alive = set(carried_out)
    may_be_live = carried_out  # at the step's start: every tensor the previous run left alive
    first_done = False
    plan: tuple[list[int], list[int], list[int]] = ([], [], [])
    for i in range(start, end):
        if kinds[i] == FREE and ids[i] in carried_in:
            plan[0].extend([FREE] * len(may_be_live))
            plan[1].extend(may_be_live)
            plan[2].extend([-1] * len(may_be_live))
            may_be_live, first_done = [], True
        else:
            plan[0].append(kinds[i])
            plan[1].append(ids[i])
            plan[2].append(i)
            if first_done and kinds[i] == ALLOC and ids[i] in left_alive:
                may_be_live.append(ids[i])
    return plan


#: Events between two looks at the allocator in a run of the last step's events and in their repeats
#: (:func:`_marked_run`).
_MARK_EVENTS = 512


class _Mark(NamedTuple):
    """A look at the allocator in a run of the last step's events: its snapshot before event ``n * _MARK_EVENTS``
    (None at the first), and the peaks (bytes) of the run's events from there to its end. ``whole``: where the run
    is the last step's and its repeat runs other events up to there but the same from there on
    (:meth:`AllocTrace._same_from`), the whole state there (:func:`_whole_look`); else None. ``record_at``: how long
    the run's record of its requests was there (0 without one), ``next_ptr``: the address of the next segment there
    (:func:`_grown_from`, :func:`_run_to_mark`)."""
    snapshot: tuple | None
    reserved: int
    allocated: int
    whole: tuple | None = None
    record_at: int = 0
    next_ptr: int = 0


class _Twin(NamedTuple):
    """A run of the last step whose repeat runs other events first (:func:`_marked_run`'s ``whole_from``): its marks,
    its record of its requests of the large pool (:meth:`CachingAllocator.run`) and the address of the next segment
    at its end."""
    marks: list[_Mark]
    record: list[int]
    next_ptr: int


def _whole_look(alloc: CachingAllocator, live: dict[int, _Block], skip: int) -> tuple:
    """Everything the allocator's course from here on depends on, but the first ``skip`` live tensors (tensors that no
    event of the last step or of its repeats touches: the same blocks in both runs compared, and where the first
    ``skip`` of one run's are such, so are the other's where the rest are the same): its bytes reserved and allocated
    and the address of its next segment (compared first: they tell most states apart at once), ``skip`` and its
    snapshot with the live tensors. Two runs that are here alike and run the same events from here on end alike."""
    return _whole_key(alloc), skip, alloc.snapshot(live, skip)


def _whole_key(alloc: CachingAllocator) -> tuple[int, int, int]:
    """:func:`_whole_look`'s first part: the bytes reserved and allocated, and the next segment's address."""
    return alloc.reserved, alloc.allocated, alloc._next_ptr


#: The looks with the whole state a run of the last step takes, from the first event its repeat runs as it does on
#: (:func:`_marked_run`'s ``whole_from``): where a repeat meets the step's course it does so in the step's first part
#: (a DenseNet's, a ResNet's) or late, where meeting saves little; each look costs 50-100 events' time.
_WHOLE_LOOKS = 3


def _untouched_prefix(live: dict[int, _Block], touched: set[int]) -> int:
    """How many of the first live tensors (in ``live``'s order) are none of ``touched`` (the tensor ids of the events
    run from now on): a look at the allocator can leave them out (:meth:`CachingAllocator.snapshot`). No event frees
    them and every ALLOC adds its tensor last, so they stay first, and their blocks, allocated, keep their address and
    size (only a free block is split or merged): a MaxViT's weights, gradients and momentum, three quarters of what
    the looks listed."""
    if touched.isdisjoint(live):  # none of them (one C loop: a MaxViT's 1,500 live tensors at its last step)
        return len(live)
    count = 0
    for tensor in live:
        if tensor in touched:
            break
        count += 1
    return count


def _marked_run(alloc: CachingAllocator, kinds: list[int], ids: list[int], sizes: list[int],
                live: dict[int, _Block], skip: int = 0, record: list[int] | None = None, whole_from: int | None = None,
                untouched: Callable[[int, dict], int] | None = None,
                twin: _Twin | None = None) -> tuple[list[_Mark], tuple[int, int] | None]:
    """Run events that the next run repeats (the last step's, or a repeat's where the step ran other events), looking
    at the allocator every :data:`_MARK_EVENTS` events (its peaks as one run gives them, from the peaks of each
    stretch between two looks); the looks, for the repeats (:func:`_run_to_mark`), leaving out the first ``skip``
    live tensors (:func:`_untouched_prefix`). ``record``: as :meth:`CachingAllocator.run`'s, for the whole run.

    ``whole_from``: a run of the last step whose repeat runs other events up to that event and these from there
    (:meth:`AllocTrace._same_from`): its looks are the whole state (:attr:`_Mark.whole`), at the first
    :data:`_WHOLE_LOOKS` marks from there, none elsewhere, each leaving out the first ``untouched(n, live)`` live
    tensors at the ``n``-th mark (:meth:`AllocTrace._untouched_at`). ``twin``: such a run, for a run of the repeat:
    where the allocator is, at a look, as the step's run left it there, or so but for the segments that run made from
    there on, each free and whole (:func:`_grown_by_whole_segments`: this run finds each where that run made it, and
    makes none), the rest would run as it did, so this run stops, its peaks those of its events so far and of the
    step's run from there (a DenseNet's first repeat meets its step's course a tenth to a third of the way in; with the
    step's segments found, an EfficientNet's and a ResNet's at small batches, a MaxViT's at larger ones). Returns the
    marks (none where it stopped) and those peaks (None where it ran to the end)."""
    stretches = []
    reserved, allocated = alloc.peak_reserved, alloc.peak_allocated  # the run's peaks so far
    for n, start in enumerate(range(0, len(kinds), _MARK_EVENTS)):
        seen = whole = None
        if start:
            mark = twin.marks[n] if twin is not None else None
            if mark is not None and mark.whole is not None and mark.whole[0] == _whole_key(alloc):
                if _whole_look(alloc, live, mark.whole[1]) == mark.whole:  # it runs the step's course from here
                    return [], (max(reserved, mark.reserved), max(allocated, mark.allocated))
                seen = alloc.snapshot(live, skip, tensors=False)
            elif mark is not None and mark.whole is not None and _grown_from(alloc, live, mark, twin):
                return [], (max(reserved, mark.reserved), max(allocated, mark.allocated))
            elif whole_from is not None:  # a twin's: no repeat runs its events to the look, none of them needed
                if whole_from <= start < whole_from + _WHOLE_LOOKS * _MARK_EVENTS:
                    whole = _whole_look(alloc, live, untouched(n, live))
            else:
                seen = alloc.snapshot(live, skip, tensors=False)
        at, next_ptr = len(record) if record is not None else 0, alloc._next_ptr
        alloc.reset_peaks()  # the run's own reset, at the first
        alloc.run(kinds[start:start + _MARK_EVENTS], ids[start:start + _MARK_EVENTS],
                  sizes[start:start + _MARK_EVENTS], live, record)
        reserved, allocated = max(reserved, alloc.peak_reserved), max(allocated, alloc.peak_allocated)
        stretches.append((seen, alloc.peak_reserved, alloc.peak_allocated, whole, at, next_ptr))
    marks, reserved, allocated = [], 0, 0
    for seen, stretch_reserved, stretch_allocated, whole, at, next_ptr in reversed(stretches):  # the peaks from each
        reserved, allocated = max(reserved, stretch_reserved), max(allocated, stretch_allocated)  # look to the end
        marks.append(_Mark(seen, reserved, allocated, whole, at, next_ptr))
    marks.reverse()
    if marks:
        alloc.peak_reserved, alloc.peak_allocated = marks[0].reserved, marks[0].allocated
    return marks, None


def _grown_from(alloc: CachingAllocator, live: dict[int, _Block], mark: _Mark, twin: _Twin) -> bool:
    """Whether a run of the repeat, at the look ``mark`` of the step's run ``twin`` (:func:`_marked_run`), finds the
    allocator as that run did there but for the segments that run made from there on, each free and whole now, and
    has made none itself: the bytes allocated the same, the bytes reserved those of that run's end, its next segment
    where that run's end left it, and :func:`_grown_by_whole_segments` of the two looks, with that run's record from
    the look on. Then it runs the step's course from here: each request that made a segment there finds that segment
    here, and it ends as the step's run did. Three integers compared before a look is taken."""
    key, skip, look = mark.whole
    return _grown(alloc, mark, key[1], look, lambda: alloc.snapshot(live, skip), twin.record, twin.next_ptr)


def _grown(alloc: CachingAllocator, mark: _Mark, allocated: int, then: tuple, now: Callable[[], tuple],
           record: list[int], next_ptr: int) -> bool:
    """:func:`_grown_from`'s test, shared with :func:`_run_to_mark`: the bytes allocated those at the look ``mark``
    (``allocated``), the bytes reserved those of the marked run's end, the next segment where that run's end left it
    (``next_ptr``), and :func:`_grown_by_whole_segments` of the look then (``then``) and now (``now()``, taken only
    where the three integers agree), with that run's ``record`` from the look on."""
    return (alloc.allocated == allocated and alloc.reserved == mark.reserved and alloc._next_ptr == next_ptr
            and _grown_by_whole_segments(then, mark.next_ptr, now(), record[mark.record_at:], alloc._free))


def _run_to_mark(alloc: CachingAllocator, kinds: list[int], ids: list[int], sizes: list[int], live: dict[int, _Block],
                 marks: list[_Mark], skip: int = 0, record: list[int] | None = None,
                 next_ptr: int = -1) -> tuple[int, int] | None:
    """Run a repeat of the events :func:`_marked_run` ran until the allocator is, at a look, as that run left it
    there, or so but for the segments that run made from there on, each free and whole, this run having made none
    (``record``: that run's record of its requests, ``next_ptr``: the address of its next segment at its end; as
    :func:`_grown_from`): the rest would run as it did, so the repeat's peaks (bytes) are those of its events so far
    and of the run's from there, given at once (a MaxViT's repeat meets its step's run a third of the way in). None: it
    ran to the end (its peaks in ``alloc``). ``skip``: as the marked run's looks left out. The repeat begins with the
    live tensors the marked run began with (the caller checks): the looks leave them out, as the marked run's did."""
    for n, start in enumerate(range(0, len(kinds), _MARK_EVENTS)):
        if n:
            mark, look = marks[n], alloc.snapshot(live, skip, tensors=False)
            if look == mark.snapshot or (record is not None and _grown(
                    alloc, mark, mark.snapshot[1], mark.snapshot, lambda: look, record, next_ptr)):
                return max(alloc.peak_reserved, mark.reserved), max(alloc.peak_allocated, mark.allocated)
        alloc.run(kinds[start:start + _MARK_EVENTS], ids[start:start + _MARK_EVENTS],
                  sizes[start:start + _MARK_EVENTS], live)
    return None


def _grown_by_whole_segments(start: tuple, start_next: int, now: tuple, record: list[int] | None = None,
                             free: dict[int, _Block] | None = None) -> bool:
    """Whether the allocator, whose look is ``now`` (:meth:`CachingAllocator.snapshot`), is as it was at the look
    ``start`` before a run of events, the address of its next segment being ``start_next`` there, but for segments
    that run made, each free and whole now, and their bytes reserved (the bytes allocated and the live tensors'
    blocks the same, no free block of the start gone). The same events run again then take the course they took,
    each request that made a segment finding that segment, where no segment the run made later is a better fit for a
    request: a state that is the run's at the same point and the segments not yet made there, by induction. A
    segment made later lies above every block there, so it wins no tie; a small one (2 MiB) is no smaller than any
    small block, so it is never a better fit. A large one is where a request of at most its size found a larger
    block, or made a larger segment, before it was made: ``record``, the run's record of its requests
    (:meth:`CachingAllocator.run`), and ``free``, the allocator's free blocks by key (to tell a whole segment), tell
    (:func:`_no_better_fit`); without them no large segment may have been made. So the run again has
    the run's peak allocated, reserves nothing more (its peak reserved is the run's last), and ends as the run did (a
    MaxViT's step makes 6 small segments that its repeat finds cached; at a batch of 2 two large ones of 20 MiB too:
    the repeat ran 2,560 of its events before it met the run's course)."""
    if now[1] != start[1] or now[4:] != start[4:]:
        return False
    grown = 0
    for pool in (2, 3):  # the large pool, the small one
        if now[pool] == start[pool]:  # nothing made
            continue
        before, after = set(start[pool]), set(now[pool])
        made = after - before
        if len(after) != len(before) + len(made):  # a free block of the start is gone
            return False
        if not made:
            continue
        if any(key & _ADDRESS_MASK < start_next for key in made):  # not made by the run
            return False
        sizes = [key >> _ADDRESS_BITS for key in made]
        if pool == 3:
            if any(size != K_SMALL_BUFFER for size in sizes):  # a small segment in use (split)
                return False
        elif record is None or free is None or any(free[key][PREV] is not None or free[key][NEXT] is not None
                                                      for key in made) or not _no_better_fit(record, sizes):
            return False
        grown += sum(sizes)
    return now[0] == start[0] + grown


#: A free block's address, from its key in its pool.
_ADDRESS_MASK = (1 << _ADDRESS_BITS) - 1


def _no_better_fit(record: list[int], sizes: list[int]) -> bool:
    """Whether no request of a run could have had a better fit in a large segment the run made after it, the large
    segments the run made being of ``sizes`` (bytes), free and whole now, and ``record`` the run's record of its
    requests (:meth:`CachingAllocator.run`: per request its size, then minus that of the large segment it made, or the
    size of a larger block over 10 MiB it found; no large segment is smaller). A segment made later lies above every
    block there was, so it is a better fit for a request of ``r`` bytes where it is of ``r`` bytes or more and smaller
    than the block the request found or the segment it made (of the same size it loses the tie). The record must
    have made segments of ``sizes``."""
    requests, found = record[0::2], record[1::2]
    makes = [k for k, size in enumerate(found) if size < 0]
    if sorted(-found[k] for k in makes) != sorted(sizes):
        return False
    later: list[int] = []  # the sizes of the segments made after the request looked at, sorted
    for k in range(makes[-1] if makes else -1, -1, -1):  # no segment is made after the last
        request, size = requests[k], found[k]
        i = bisect_left(later, request)
        if i < len(later) and later[i] < abs(size):  # a segment made later fits it, and better
            return False
        if size < 0:
            insort(later, -size)
    return True


def _fused(kinds: np.ndarray, ids: np.ndarray, index: np.ndarray,
           small: np.ndarray | None = None) -> tuple[list[int], list[int], np.ndarray]:
    """The events (kinds, tensor ids, the index of each one's size, -1 for none) as the replay runs them: every ALLOC
    whose next event FREEs its tensor written as one :data:`_ALLOC_FREE` (the ALLOC's id and size). The same replay,
    with less to do (a scratch buffer, a gradient summed away at once: a tenth of a Swin's or a MaxViT's events).
    An ALLOC followed by FREEs of other tensors, then by its own, is one too, its FREE first: FREEs commute (the free
    blocks after them are the maximal runs of blocks not allocated, whatever their order; the bytes allocated the
    same), and no peak is read at a FREE (200 of a MaxViT's 9,000 events a batch size).

    ``small`` (by the index of a size; :meth:`AllocTrace._small_pairs`): a size (bytes, rounded) of the small pool at
    every batch size, of a tensor that no other event names, else 0. Back-to-back pairs of such sizes are then one
    pair, of their largest size: each pair leaves the allocator as it found it but for a new segment, made where no
    free small block fits it, of 2 MiB, where every later one fits; so the run makes a segment where its largest size
    finds no block, and its peaks are those of its largest (a small block is handed out at its size). One pair of
    that size does the same, at the same point (the optimiser's scratch of each small parameter: 424 of a MaxViT's
    10,000 events a batch size)."""
    kinds, ids, index = np.asarray(kinds), np.asarray(ids), np.asarray(index, dtype=np.intp)
    at = np.arange(len(kinds))
    free = kinds == FREE
    last = np.maximum.accumulate(np.where(free, -1, at)) if len(at) else at  # the last event before that is no FREE
    lead = np.maximum(last, 0)
    up = free & (last >= 0) & (last < at - 1) & (kinds[lead] == ALLOC) & (ids[lead] == ids)  # its FREE moved up
    if up.any():
        order = np.argsort(np.where(up, last + 0.5, at), kind="stable")
        kinds, ids, index = kinds[order], ids[order], index[order]
    paired = np.zeros(len(kinds), dtype=bool)  # an ALLOC freed by the next event (a pair's FREE is no pair's ALLOC)
    paired[:-1] = (kinds[:-1] == ALLOC) & (kinds[1:] == FREE) & (ids[:-1] == ids[1:])
    kept = np.ones(len(kinds), dtype=bool)
    kept[1:] = ~paired[:-1]
    if small is not None:
        both = paired & (index >= 0) & (small[index] > 0)
        follows = np.zeros(len(kinds), dtype=bool)  # the pair before it (its ALLOC two events back) is one too
        follows[2:] = both[2:] & both[:-2]
        if follows.any():
            led = np.zeros(len(kinds), dtype=bool)  # a run's first pair
            led[:-2] = both[:-2] & ~follows[:-2] & follows[2:]
            at = np.flatnonzero(led | follows)
            run = np.cumsum(led[at]) - 1
            order = at[np.lexsort((-small[index[at]], run))]  # by run, and in each its largest size first
            largest = order[np.flatnonzero(np.diff(run[np.searchsorted(at, order)], prepend=-1))]
            index = index.copy()
            index[at[led[at]]] = index[largest]  # each run's first pair takes the index of its largest size
            kept &= ~follows
    return np.where(paired, _ALLOC_FREE, kinds)[kept].tolist(), ids[kept].tolist(), index[kept]


class TracedUpdate(NamedTuple):
    """The settings of a traced optimiser step that change its events (``alloc_trace._OptimizerStep.settings``),
    each None where it changes nothing. The defaults: perf4sight's SGD, one parameter at a time, with momentum and
    weight decay, the gradients kept between steps."""
    optimizer: str = "sgd"
    foreach: bool | None = False  # the update all parameters at once (a GPU's) or one at a time (a CPU's)
    momentum: bool | None = True
    decays: bool = True
    set_to_none: bool = False


@dataclass
class AllocTrace:
    """One training run's ordered allocation events, with sizes linear in the batch size.

    Event ``i``: ``kind[i]`` (:data:`ALLOC`, :data:`FREE`, :data:`STEP`), ``tensor[i]`` (a storage
    id, for ALLOC/FREE), and for ALLOC a size of ``const[i] + per_sample[i] * batch_size`` bytes.
    Events before the first STEP are the persistent setup (weights, buffers, the input batch).
    ``repeat_last``: how many more times the last step runs (the steady state). ``protocol``: how the
    per-step peaks become one figure (:data:`REPLAY_PROTOCOLS`; :meth:`with_protocol` for another).
    ``relu6_clone``: the events are of a torch whose in-place ReLU6 keeps a clone of its input (>= 1.10).
    ``update``: the settings of the traced optimiser step that change its events (:class:`TracedUpdate`), whose
    ``optimizer`` (``optimizers.py``) holds its state and scratch. ``loss``: the traced step's loss
    (``profiling.plan.LOSSES``). ``blas_workspace``: the bytes of cuBLAS's workspace per handle and of cuBLASLt's that
    the events allocate in the first step (``alloc_trace.with_blas_workspaces``; (0, 0): none).
    """

    name: str
    kind: np.ndarray
    tensor: np.ndarray
    const: np.ndarray
    per_sample: np.ndarray
    repeat_last: int = 2
    protocol: str = RUN_PEAK
    relu6_clone: bool = False
    update: TracedUpdate = TracedUpdate()
    loss: str = "cross_entropy"
    blas_workspace: tuple = (0, 0)
    _memo: dict[int, tuple[float, float]] = field(default_factory=dict, repr=False, init=False)
    #: the events of the setup and of each step, and of a repeat of the last step, as the replay runs them (kinds,
    #: tensor ids, each one's index among the trace's sizes, -1 for none; :func:`_fused`): made once per trace
    _runs: list[tuple[list[int], list[int], np.ndarray]] | None = field(default=None, repr=False, init=False)
    _repeat_plan: tuple[list[int], list[int], np.ndarray] | None = field(default=None, repr=False, init=False)
    #: the tensor ids that the last step's events and its repeat's touch (:meth:`_last_step_tensors`)
    _touched: set[int] | None = field(default=None, repr=False, init=False)
    #: const and per_sample with a 0 appended (:meth:`_rounded_sizes`), made once
    _padded: tuple[np.ndarray, ...] | None = field(default=None, repr=False, init=False)
    #: the allocator and live tensors after the setup's first events, those of the same sizes at every batch size,
    #: and how many (:meth:`_setup_start`); () where none can be shared
    _setup: tuple | None = field(default=None, repr=False, init=False)
    #: per event, its size where the replay may run back-to-back pairs of it as one (:meth:`_small_pairs`)
    _small: np.ndarray | None = field(default=None, repr=False, init=False)
    #: where the last step's events and its repeat's are the same to the end (:meth:`_same_from`; -1: nowhere)
    _same: int | None = field(default=None, repr=False, init=False)
    #: per look of a run of the last step, how many first live tensors it may leave out (:meth:`_untouched_at`)
    _untouched: dict[int, int] = field(default_factory=dict, repr=False, init=False)
    #: whether the first repeat of the last step is expected to find the allocator as the step's run found it (its
    #: repeats then run no event, and looks in that run would go unused: :meth:`_step_peaks` takes none): where the
    #: cache is emptied before every step, until a replay's repeat does not
    _returns: bool = field(default=False, repr=False, init=False)
    #: per event, how many events name its tensor (:meth:`_names`)
    _named: np.ndarray | None = field(default=None, repr=False, init=False)
    #: this trace's events under each protocol asked for (:meth:`with_protocol`), one dict shared by all of them: each
    #: view is made once and keeps its memo across fits
    _views: dict[str, "AllocTrace"] = field(default_factory=dict, repr=False, init=False, compare=False)

    def __post_init__(self) -> None:
        if self.protocol not in REPLAY_PROTOCOLS:
            raise ValueError(f"AllocTrace: protocol must be one of {', '.join(REPLAY_PROTOCOLS)}, "
                             f"not {self.protocol!r}")
        self._returns = self.protocol == PERF4SIGHT

    @property
    def optimizer(self) -> str:
        """The traced step's optimiser."""
        return self.update.optimizer

    @property
    def foreach(self) -> bool | None:
        """Whether the traced update ran all parameters at once (None: SGD without weight decay, where it is the
        same either way)."""
        return self.update.foreach

    def with_protocol(self, protocol: str) -> "AllocTrace":
        """The same events replayed under ``protocol`` (shares the arrays; its own memo, made once: a second fit of
        the same network under the same protocol replays nothing again)."""
        views = self._views
        views.setdefault(self.protocol, self)
        view = views.get(protocol)
        if view is None:
            view = views[protocol] = replace(self, protocol=protocol)
            view._views = views  # asked from any view, each protocol gives the same object
        return view

    def sizes(self, batch_size: int) -> np.ndarray:
        """Bytes of every event at ``batch_size`` (0 for FREE/STEP)."""
        return np.maximum(np.rint(self.const + self.per_sample * batch_size), 0).astype(np.int64)

    def _rounded_sizes(self, batch_size: int) -> np.ndarray:
        """:meth:`sizes` rounded by :func:`round_size` (0 stays 0), with a 0 last (the size at index -1): the sizes the
        replay runs. In place on one array of floats, then of integers (a quarter of the time of sizes, where and
        round_size: 0.05 ms against 0.26 for a MaxViT's 10,500 events); the 0 last from the padded arrays, made once."""
        if self._padded is None:
            floats = all(getattr(a, "dtype", None) == np.float64 for a in (self.const, self.per_sample))
            self._padded = (np.append(self.const, 0.0), np.append(self.per_sample, 0.0)) if floats else ()
        if not self._padded:  # arrays of another type (made by hand): as sizes computes them
            sizes = self.sizes(batch_size)
            return np.append(np.where(sizes > 0, round_size(sizes), 0), 0)
        const, per_sample = self._padded
        s = per_sample * batch_size
        s += const
        np.rint(s, out=s)
        np.maximum(s, 0, out=s)
        out = s.astype(np.int64)
        out += K_MIN_BLOCK - 1  # up to a multiple of 512 (a power of two): 0 stays 0, 1 to 512 are 512
        out >>= _MIN_BLOCK_BITS
        out <<= _MIN_BLOCK_BITS
        return out

    def replay(self, batch_size: int) -> tuple[float, float]:
        """(peak reserved, peak allocated) in bytes at ``batch_size``, made from the per-step peaks (peaks
        reset at every step start) as :attr:`protocol` says: their maximum (``run_peak``), their mean
        with the warm-up counted twice after emptying the cache before every step (``perf4sight``), or
        their plain mean (``step_mean``)."""
        bs = int(batch_size)
        if bs in self._memo:
            return self._memo[bs]
        sizes = self._rounded_sizes(bs)
        with collector_paused():
            peaks = self._step_peaks(sizes)
        p = np.array(peaks, dtype=float)
        if self.protocol == RUN_PEAK:
            figure = p.max(axis=0)
        else:  # a mean over the steps; perf4sight's reads the warm-up (the first step) twice
            w = np.ones(len(p))
            if self.protocol == PERF4SIGHT and len(p) > 1:
                w[0] = 2.0
            figure = w @ p / w.sum()
        out = (float(figure[0]), float(figure[1]))
        self._memo[bs] = out
        return out

    def _step_peaks(self, sizes: np.ndarray) -> list[tuple[int, int]]:
        """(peak reserved, peak allocated) in bytes of each step, the repeats of the last one included (of the setup
        where there is no step), the events' sizes being ``sizes`` (rounded; a 0 last, for index -1)."""
        runs = self._fused_runs()
        steps = len(runs) - 1
        alloc, live, setup_done = self._setup_start()
        peaks: list[tuple[int, int]] = []
        total = len(runs) + (self.repeat_last if steps else 0)
        # the last step again: it frees what its previous run left, not what it found (:func:`_repeat_plan`)
        repeat = self._repeat_run() if total > len(runs) else None
        repeated = None  # the sizes of the repeat's events
        before = None  # the allocator's state before a repeat of the last step
        marks = None  # the allocator at every _MARK_EVENTS events of the run a repeat follows (:func:`_marked_run`)
        skip = 0  # how many first live tensors the looks leave out: none that the last step or a repeat touches
        marked_from = None  # the allocator before the marked run: its look, the address of its next segment, and the
        # run's requests of the large pool (CachingAllocator.run's record)
        twin = None  # the last step's run, where its repeat runs other events first (_Twin)
        marked_end = (None, -1)  # the marked run's record and the address of its next segment at its end
        for n in range(total):
            if n > 0:
                alloc.reset_peaks()
                if self.protocol == PERF4SIGHT:  # the cache emptied; used memory read later is the step's own
                    alloc.empty_cache()
                    alloc.reset_peaks()
            if steps and n >= steps:  # the last step and its repeats
                if n == steps:
                    skip = _untouched_prefix(live, self._last_step_tensors())
                state = alloc.snapshot(live, skip)
                if n == steps + 1 and state != before:  # a guess that did not hold (:attr:`_returns`)
                    self._returns = False
                if state == before:  # the step left the allocator as it found it: every repeat is the same
                    peaks += [peaks[-1]] * (total - n)
                    break
                before = state
            run_kinds, run_ids, size_index = events = runs[n] if n <= steps else repeat
            if n == 0 and setup_done:  # the allocator has run them
                run_kinds, run_ids, size_index = run_kinds[setup_done:], run_ids[setup_done:], size_index[setup_done:]
            if events is repeat:
                repeated = sizes[size_index].tolist() if repeated is None else repeated
                run_sizes = repeated
            else:
                run_sizes = sizes[size_index].tolist()
            if marks is not None and _grown_by_whole_segments(marked_from[0], marked_from[1], state, marked_from[2],
                                                              alloc._free):  # it runs the marked run's course
                peaks += [(marks[0].reserved, marks[0].allocated)] * (total - n)
                break
            if marks is not None:  # the marked run's events again: this run may meet its course
                if state[4] != marked_from[0][4]:  # other live tensors than the marked run began with: no looks
                    alloc.run(run_kinds, run_ids, run_sizes, live)
                else:
                    met = _run_to_mark(alloc, run_kinds, run_ids, run_sizes, live, marks, skip, *marked_end)
                    if met is not None:  # it ends as the marked run did: so does every later one
                        peaks += [met] * (total - n)
                        break
            elif events is repeat and n + 1 < total and (n > steps or not self._returns):  # the next run repeats
                # these events (where the last step's run is expected to leave the allocator as it found it, no
                # looks: its repeat runs none of its events; else that repeat runs marked)
                marked_from = state, alloc._next_ptr, []
                marks, met = _marked_run(alloc, run_kinds, run_ids, run_sizes, live, skip, marked_from[2], twin=twin)
                marked_end = marked_from[2], alloc._next_ptr
                if met is not None:  # it ran the last step's course from a look on: it ends as that run did
                    peaks += [met] * (total - n)
                    break
            elif n == steps and n + 1 < total and self._same_from() is not None:  # a repeat that runs other events
                record: list[int] = []
                twin = _Twin(_marked_run(alloc, run_kinds, run_ids, run_sizes, live, skip, record,
                                         whole_from=self._same_from(), untouched=self._untouched_at)[0],
                             record, alloc._next_ptr)
            else:
                alloc.run(run_kinds, run_ids, run_sizes, live)
            if n > 0:
                peaks.append((alloc.peak_reserved, alloc.peak_allocated))
        peaks = peaks or [(alloc.peak_reserved, alloc.peak_allocated)]
        alloc.unlink(live)
        return peaks

    def _same_from(self) -> int | None:
        """Where the last step's events and its repeat's differ (a step that begins with ``zero_grad(set_to_none=
        True)``: the gradients freed are the previous run's), the first event from which the two are the same to the
        end (kinds, tensors and sizes), the two being as long; None where they are one list, differ to the end or
        differ in length. The repeat may meet the step's course from there (:func:`_marked_run`'s ``twin``): the
        same tensors live (those the previous run left were freed), the same events to come. Made once."""
        if self._same is None:
            step, repeat = self._fused_runs()[-1], self._repeat_run()
            same = -1
            if step is not repeat and len(step[0]) == len(repeat[0]):
                differs = np.flatnonzero(step[2] != repeat[2])  # the sizes' indices (arrays), then the lists from there
                same = int(differs[-1]) + 1 if len(differs) else 0
                if same >= len(step[0]) or step[0][same:] != repeat[0][same:] or step[1][same:] != repeat[1][same:]:
                    same = -1
            self._same = same
        return None if self._same < 0 else self._same

    def _untouched_at(self, n: int, live: dict[int, _Block]) -> int:
        """How many first live tensors ``live`` holds that no event of the last step or of its repeats touches, at the
        ``n``-th look of a run of the last step (:func:`_marked_run`'s ``untouched``): past the gradients the step
        freed, its weights' momentum too, half of what a look lists. Counted on from the count of a look before (this
        one's in a replay before, else the previous one's: the first tensors stay first), where its first tensors are
        such here too (one C loop), so that the first tensors are counted one by one once a trace."""
        touched = self._last_step_tensors()
        count = self._untouched.get(n, self._untouched.get(n - 1, 0))
        if count > len(live) or not touched.isdisjoint(islice(live, count)):
            count = 0
        for tensor in islice(live, count, None):
            if tensor in touched:
                break
            count += 1
        self._untouched[n] = count
        return count

    def _fused_runs(self) -> list[tuple[list[int], list[int], np.ndarray]]:
        """The setup's and each step's events as the replay runs them (:attr:`_runs`; the same at every batch size)."""
        if self._runs is None:
            kinds, ids, index = _fused(self.kind, self.tensor, np.arange(len(self.kind)),  # no pair spans a STEP
                                       self._small_pairs())
            starts = [0] + np.flatnonzero(self.kind[index] == STEP).tolist() + [len(kinds)]
            self._runs = [(kinds[s:e], ids[s:e], index[s:e]) for s, e in zip(starts, starts[1:])]
        return self._runs

    def _setup_start(self) -> tuple[CachingAllocator, dict[int, _Block | None], int]:
        """The allocator and live tensors a replay starts from, and how many of the setup's first events they have run:
        a copy of those after the setup's first events (:attr:`_setup`, made once), where each is an ALLOC of the same
        size at every batch size (a network's weights and buffers: 582 of a MaxViT's 584 setup events), of a tensor no
        later event names (it stays allocated: its block is shared by every copy, :meth:`CachingAllocator._copied`);
        else a new allocator, none run."""
        if self._setup is None:
            self._setup = self._setup_state()
        if not self._setup:
            return CachingAllocator(), {}, 0
        alloc, live, done = self._setup
        return alloc._copied(), dict(live), done

    def _setup_state(self) -> tuple:
        """:meth:`_setup_start`'s allocator, live tensors and count of events, or () where fewer than 16 events could be
        run so (the copy would save little)."""
        kinds, ids, index = self._fused_runs()[0]
        fixed = (np.asarray(kinds) == ALLOC) & (index >= 0) & (np.asarray(self.per_sample)[index] == 0)
        done = len(kinds) if fixed.all() else int(np.argmin(fixed))
        sizes = self._rounded_sizes(1)[index[:done]].tolist()
        # no later event names them: each tensor is named once in the trace (a repeat's events are its last step's)
        if done < 16 or not all(sizes) or not (self._names()[index[:done]] == 1).all():
            return ()
        alloc, live = CachingAllocator(), {}
        alloc.run(kinds[:done], ids[:done], sizes, live)
        for block in live.values():  # walls: their neighbours are never read (no cycle through them, either)
            block[PREV] = block[NEXT] = None
        return alloc, live, done

    def _small_pairs(self) -> np.ndarray:
        """Per event, its size (bytes, rounded) where that is the same at every batch size and in the small pool, and
        its tensor one that no other event names but its ALLOC and FREE; else 0 (:func:`_fused`'s ``small``). Made
        once (:attr:`_small`)."""
        if self._small is None:
            size = np.maximum(np.rint(self.const), 0).astype(np.int64)
            rounded = round_size(size)
            self._small = np.where((np.asarray(self.per_sample) == 0) & (size > 0) & (rounded <= K_SMALL_SIZE)
                                   & (self._names() == 2), rounded, 0)
        return self._small

    def _names(self) -> np.ndarray:
        """Per event, how many events of the trace name its tensor (made once)."""
        if self._named is None:
            ids = np.asarray(self.tensor, dtype=np.int64)
            if len(ids) and 0 <= ids.min() and ids.max() < 8 * len(ids) + 1024:  # storage ids: counted by bincount
                self._named = np.bincount(ids)[ids]
            else:
                _, at, count = np.unique(ids, return_inverse=True, return_counts=True)
                self._named = count[at]
        return self._named

    def _last_step_tensors(self) -> set[int]:
        """The tensor ids of the last step's events and of its repeat's (:attr:`_touched`, made once)."""
        if self._touched is None:
            self._touched = set(self._fused_runs()[-1][1]) | set(self._repeat_run()[1])
        return self._touched

    def _repeat_run(self) -> tuple[list[int], list[int], np.ndarray]:
        """A repeat of the last step as the replay runs it (:func:`_repeat_plan`, :func:`_fused`), made once."""
        if self._repeat_plan is None:
            start = int(np.flatnonzero(self.kind == STEP)[-1])
            kinds, ids = self.kind[start:], self.tensor[start:]
            if np.isin(ids[kinds == FREE], ids[kinds == ALLOC]).all():  # it frees only its own: run as it is
                self._repeat_plan = self._fused_runs()[-1]
            else:
                plan = _repeat_plan(self.kind.tolist(), self.tensor.tolist(), start, len(self.kind))
                self._repeat_plan = _fused(*plan, self._small_pairs())
        return self._repeat_plan

    def peaks_mb(self, batch_sizes: np.ndarray | list[int]) -> np.ndarray:
        """Array (n, 2): [peak reserved, peak allocated] in MiB per batch size."""
        out = np.array([self.replay(int(b)) for b in np.asarray(batch_sizes).reshape(-1)], dtype=float)
        return out.reshape(-1, 2) / float(1 << 20)
