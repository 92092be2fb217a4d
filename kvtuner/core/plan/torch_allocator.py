"""PyTorch's CUDA caching allocator, reduced to the rules that decide how much GPU memory it
*reserves* (``cudaMalloc``-ed segments) for a sequence of tensor allocations and frees.

Why: engines that size their KV cache from the driver's free memory (vLLM v0.3.x:
``torch.cuda.mem_get_info()`` after the profiling pass, see
:mod:`kvtuner.core.plan.vllm`) see every segment PyTorch keeps cached, not the bytes live at
the peak. A freed 768 MiB block cannot hold a later 1376 MiB tensor, so the reserved peak is
above the allocated peak by the sizes that did not fit.

Rules (PyTorch ``c10/cuda/CUDACachingAllocator.cpp``, unchanged from 1.10 to 2.5, the versions
vLLM v0.2 - v0.6 ran on):

- ``round_size``: every request is rounded up to a multiple of ``kMinBlockSize`` = 512 bytes.
- Requests of at most ``kSmallSize`` = 1 MiB come from the small pool, larger ones from the
  large pool; a block never moves between pools.
- ``get_free_block``: the smallest cached free block of the pool that is at least the request
  (best fit; with the default ``max_split_size`` any block may be used).
- ``get_allocation_size``: a new segment (``cudaMalloc``) is ``kSmallBuffer`` = 2 MiB for a small
  request, ``kLargeBuffer`` = 20 MiB for a request under ``kMinLargeAlloc`` = 10 MiB, else the
  request rounded up to ``kRoundLarge`` = 2 MiB.
- ``should_split``: the rest of a block is split off as a free block when it is at least 512
  bytes (small pool) or more than 1 MiB (large pool); otherwise the whole block is handed out.
- ``free_block``: a freed block merges with free neighbours of its segment; segments are kept
  (reserved) until ``empty_cache()``.

Not modelled: streams (one stream here), ``expandable_segments``, ``max_split_size_mb`` /
``roundup_power2_divisions`` (``PYTORCH_CUDA_ALLOC_CONF`` unset), and the retry that frees
cached segments when ``cudaMalloc`` fails (the profiling pass fits on the card).
"""

from __future__ import annotations

from dataclasses import dataclass, field

MIN_BLOCK_BYTES = 512
SMALL_SIZE_BYTES = 1 << 20
SMALL_BUFFER_BYTES = 2 << 20
LARGE_BUFFER_BYTES = 20 << 20
MIN_LARGE_ALLOC_BYTES = 10 << 20
ROUND_LARGE_BYTES = 2 << 20


def round_size(n_bytes: int) -> int:
    """``round_size``: ``n_bytes`` rounded up to a multiple of 512 (at least 512)."""
    return max(MIN_BLOCK_BYTES, -(-n_bytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)


def allocation_size(n_bytes: int) -> int:
    """``get_allocation_size``: bytes of the segment ``cudaMalloc``-ed for a rounded request."""
    if n_bytes <= SMALL_SIZE_BYTES:
        return SMALL_BUFFER_BYTES
    if n_bytes < MIN_LARGE_ALLOC_BYTES:
        return LARGE_BUFFER_BYTES
    return -(-n_bytes // ROUND_LARGE_BYTES) * ROUND_LARGE_BYTES


@dataclass
class _Block:
    size: int
    tag: str | None = None  # None: free


@dataclass
class _Segment:
    small: bool
    blocks: list[_Block] = field(default_factory=list)


class CachingAllocatorModel:
    """Replays ``malloc(tag, bytes)`` / ``free(tag)`` events through the rules above.

    Attributes (bytes): ``reserved_bytes`` / ``peak_reserved_bytes`` (segments, what
    ``torch.cuda.memory_reserved`` and the driver see), ``allocated_bytes`` /
    ``peak_allocated_bytes`` (blocks handed out, ``torch.cuda.memory_allocated``).
    """

    def __init__(self) -> None:
        self._segments: list[_Segment] = []
        self._where: dict[str, _Block] = {}
        self.reserved_bytes = 0
        self.peak_reserved_bytes = 0
        self.allocated_bytes = 0
        self.peak_allocated_bytes = 0

    def malloc(self, tag: str, n_bytes: int) -> None:
        """Allocate ``n_bytes`` under a unique ``tag``.

        Raises:
            ValueError: ``tag`` is already allocated or ``n_bytes`` is negative.
        """
        if tag in self._where:
            raise ValueError(f"tensor '{tag}' is already allocated")
        if n_bytes < 0:
            raise ValueError(f"tensor '{tag}': negative size {n_bytes}")
        size = round_size(n_bytes)
        small = size <= SMALL_SIZE_BYTES
        best: tuple[int, _Segment, int] | None = None
        for seg in self._segments:
            if seg.small != small:
                continue
            for i, b in enumerate(seg.blocks):
                if b.tag is None and b.size >= size and (best is None or b.size < best[0]):
                    best = (b.size, seg, i)
        if best is None:
            seg = _Segment(small, [_Block(allocation_size(size))])
            self._segments.append(seg)
            self.reserved_bytes += seg.blocks[0].size
            self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
            best = (seg.blocks[0].size, seg, 0)
        _, seg, i = best
        block = seg.blocks[i]
        rest = block.size - size
        if (small and rest >= MIN_BLOCK_BYTES) or (not small and rest > SMALL_SIZE_BYTES):
            seg.blocks.insert(i + 1, _Block(rest))
            block.size = size
        block.tag = tag
        self._where[tag] = block
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)

    def free(self, tag: str) -> None:
        """Free the tensor ``tag`` (its block merges with free neighbours).

        Raises:
            KeyError: no tensor ``tag`` is allocated.
        """
        block = self._where.pop(tag)
        self.allocated_bytes -= block.size
        block.tag = None
        for seg in self._segments:
            for i, b in enumerate(seg.blocks):
                if b is block:
                    if i + 1 < len(seg.blocks) and seg.blocks[i + 1].tag is None:
                        b.size += seg.blocks.pop(i + 1).size
                    if i > 0 and seg.blocks[i - 1].tag is None:
                        seg.blocks[i - 1].size += seg.blocks.pop(i).size
                    return

    def rename(self, old: str, new: str) -> None:
        """Give the live tensor ``old`` the tag ``new`` (a variable rebound to it).

        Raises:
            KeyError: no tensor ``old``; ValueError: ``new`` is in use.
        """
        if new in self._where:
            raise ValueError(f"tensor '{new}' is already allocated")
        block = self._where.pop(old)
        block.tag = new
        self._where[new] = block
