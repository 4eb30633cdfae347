"""KV-cache steps: rotary embeddings, and new keys and values appended into a cache.

Rotary (RoPE, as FlashAttention-2's ``apply_rotary_emb``), in place on a float32 array
x (B, n, H, d): row (b, i, h) sits at position ``pos = start[b] + (i if BY_ROW else 0)``,
and its first ``R = 2·cos.shape[1]`` features are turned pair by pair::

    interleaved (GPT-J):    pairs (2j, 2j + 1)         j < R/2
    halves (GPT-NeoX):      pairs (j, j + R/2)
    x_a' = x_a·cos[pos, j] − x_c·sin[pos, j]
    x_c' = x_a·sin[pos, j] + x_c·cos[pos, j]

(the host makes the float32 copies and rounds them back to the cache's dtype).

Append: row (b, i) of ``new`` (B, n, H_kv, d) goes to position ``p = start[b] + i`` of
sequence b's cache: row ``p % P`` of page ``table[b, p // P]`` of the cache (num_blocks,
P, H_kv, d), found by ``copy.source_at`` as the kernels' tile copies find it.  A contiguous cache (batch_cache, seqlen_cache, ...) is the paged one with
P = seqlen_cache and ``table[b, 0] = cache_batch_idx[b]``.  Elements move as they are
(16-bit data as uint16 words), so the append is exact; nothing else of the cache is
written.  The host checks every position against the cache before the launch.

Grid and threads: both kernels take a block per (row b·n + i, head), ``THREADS``
threads striding over the pairs (rotary) or the columns (append).  No shared memory.
"""

from __future__ import annotations

from numba_flash._numba_cuda import cuda
from numba_flash.kernels.copy import source_at

THREADS = 64


@cuda.jit
def rotary(x, cos, sin, start, BY_ROW, INTERLEAVED):
    n = x.shape[1]
    row = cuda.blockIdx.x
    h = cuda.blockIdx.y
    b = row // n
    i = row - b * n
    pos = start[b]
    if BY_ROW:
        pos += i
    half = cos.shape[1]
    for j in range(cuda.threadIdx.x, half, cuda.blockDim.x):
        a = 2 * j if INTERLEAVED else j
        c = a + 1 if INTERLEAVED else j + half
        xa = x[b, i, h, a]
        xc = x[b, i, h, c]
        co = cos[pos, j]
        si = sin[pos, j]
        x[b, i, h, a] = xa * co - xc * si
        x[b, i, h, c] = xa * si + xc * co


@cuda.jit
def append(cache, new, start, table):
    n = new.shape[1]
    row = cuda.blockIdx.x
    h = cuda.blockIdx.y
    b = row // n
    i = row - b * n
    page, r, _, _ = source_at(cache, 0, start[b] + i, h, 0, (table, b))  # the tile copies' page lookup
    for c in range(cuda.threadIdx.x, new.shape[3], cuda.blockDim.x):
        cache[page, r, h, c] = new[b, i, h, c]
