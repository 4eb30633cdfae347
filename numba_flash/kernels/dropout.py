"""Dropout bits: which (query, key) probabilities a kernel keeps, from Philox4x32-10.

The keep bit of element ``(b, h, i, j)`` (batch or varlen sequence, query head, query
row and key column, both within the sequence) is, for a ``seed`` and ``dropout_p``::

    (k0, k1)  = (seed & 0xFFFFFFFF, seed >> 32)                  seed_key(seed)
    pair      = (i // 16) * 8 + i % 8                            pair_half(i)
    group     = (j // 32) * 4 + (j % 8) // 2                     group_slot(j)
    slot      = ((i // 8) % 2) * 8 + ((j % 32) // 8) * 2 + j % 2   0..15
    x0..x3    = philox4x32_10(c0=group, c1=pair, c2=h, c3=b, k0, k1)
    value     = (x[slot // 4] >> (8 * (slot % 4))) & 0xFF
    threshold = min(256, round((1 − dropout_p) · 256))           keep_threshold(p)
    kept      = value < threshold

Kept probabilities are scaled by ``1 / (1 − p)``.  ``reference.dropout_mask`` is the
same definition in NumPy; the tests compare the two bit for bit.  The values are 8-bit,
as FlashAttention-2's: the drop rate is p rounded to a multiple of 1/256.

Philox4x32-10 (Salmon et al., SC'11; as Random123 and cuRAND) is ten rounds of::

    (hi0, lo0) = mulhilo32(0xD2511F53, c0)
    (hi1, lo1) = mulhilo32(0xCD9E8D57, c2)
    c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
    k0 += 0x9E3779B9;  k1 += 0xBB67AE85                          (mod 2**32)

Why this grouping: a lane of an ``mma.sync`` m16n8 accumulator holds rows ``g`` and
``g + 8`` of a 16-row m-tile (g = lane // 4) and, per 8-key n-tile, the keys ``2t``
and ``2t + 1`` (t = lane % 4).  The 16 values of one ``(pair, group)`` are exactly
those rows at keys ``32a + 8c + 2t + {0, 1}`` of the four n-tiles ``c = 0..3`` of a
32-key stretch ``a``: all the values one lane needs for four n-tiles of an m-tile, from
one Philox call (``keep_values``, then ``keep_value`` per slot).  The transposed tiles
of dK/dV (rows keys, columns queries) share a call between two lanes
(``fragments._pair_words``).

Cost: one Philox call (20 ``mul.wide.u32``, each giving both halves, and about 60
XORs and adds) per 16 elements when a lane holds all 16, half the calls of 16-bit
values; a kernel that asks for single elements (``keep``) pays one call per element.
The counter names (b, h, row pair, group) and nothing about the tiling, so every
kernel family and tile size draws the same bits.

Every intermediate is a uint32 (the products are formed in uint64, the key bumps
added in uint64 and masked to 32 bits), so numba's CUDA simulator, which runs these
functions on NumPy scalars, and the GPU give the same bits.  Pass the key words as
uint32 (``uint32(params[SEED_K0])``): from int64 values LLVM keeps the rounds in 64
bits and most of the products become ``mul.lo.u64`` instead of ``mul.wide.u32``
(measured on the PTX for sm_90: 2 of 20 wide from int64 keys, 19 of 20 from uint32).
"""

from __future__ import annotations

from numba_flash._numba_cuda import device_function, float32, uint32, uint64
# Host side (plain Python, one definition for the reference and the API):
from numba_flash.reference import keep_threshold, seed_key
from numba_flash.variant import KEEP_SCALE, KEEP_THRESHOLD, SEED_K0, SEED_K1

__all__ = ["philox4x32_10", "group_slot", "pair_half", "keep_values", "keep_value", "keep", "dropout_info",
           "kept_scale", "chunk_values", "byte_scale", "scale_of", "seed_key", "keep_threshold"]

M0 = uint64(0xD2511F53)  # Philox round multipliers
M1 = uint64(0xCD9E8D57)
W0 = uint64(0x9E3779B9)  # key bumps: the golden ratio and sqrt(3) − 1, as 32-bit fractions
W1 = uint64(0xBB67AE85)
MASK32 = uint64(0xFFFFFFFF)
MASK8 = uint64(0xFF)
SHIFT32 = uint64(32)


@device_function
def mulhilo32(a, b):
    """``(hi, lo)``: the uint32 halves of the 64-bit product of two 32-bit words (the
    zero-extended product compiles to one ``mul.wide.u32``)."""
    p = uint64(a) * uint64(b)
    return uint32(p >> SHIFT32), uint32(p & MASK32)


@device_function
def philox4x32_10(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of the counter ``(c0, c1, c2, c3)`` under the key ``(k0, k1)``:
    four uint32 words (the module docstring).  The arguments are taken mod 2**32."""
    c0 = uint32(uint64(c0) & MASK32)
    c1 = uint32(uint64(c1) & MASK32)
    c2 = uint32(uint64(c2) & MASK32)
    c3 = uint32(uint64(c3) & MASK32)
    k0 = uint32(uint64(k0) & MASK32)
    k1 = uint32(uint64(k1) & MASK32)
    for _ in range(10):
        hi0, lo0 = mulhilo32(M0, c0)
        hi1, lo1 = mulhilo32(M1, c2)
        c0, c1, c2, c3 = uint32(hi1 ^ c1 ^ k0), lo1, uint32(hi0 ^ c3 ^ k1), lo0
        # the key bump mod 2**32, added in 64 bits (a uint32 add overflowing would
        # warn in the simulator, which runs on NumPy scalars)
        k0 = uint32((uint64(k0) + W0) & MASK32)
        k1 = uint32((uint64(k1) + W1) & MASK32)
    return c0, c1, c2, c3


@device_function
def group_slot(j):
    """``(group, key_slot)`` of key ``j``: its Philox call, and its part (0..7) of the
    value's slot."""
    return (j // 32) * 4 + (j % 8) // 2, ((j % 32) // 8) * 2 + j % 2


@device_function
def pair_half(i):
    """``(pair, half)`` of query row ``i``: rows ``16a + r`` and ``16a + r + 8`` (r < 8)
    share the counter word ``pair``; ``half`` (0 or 1) is which of the two, the high
    bit of the value's slot."""
    return (i // 16) * 8 + i % 8, (i // 8) % 2


@device_function
def keep_values(b, h, i, group, k0, k1):
    """The four words of Philox call ``group`` of the row pair of query ``i``, head
    ``h``, batch (or varlen sequence) ``b``: the 16 values of rows ``i``, ``i ± 8`` at
    keys ``32·(group // 4) + 8c + 2·(group % 4) + {0, 1}``, c = 0..3."""
    pair, _ = pair_half(i)
    return philox4x32_10(group, pair, h, b, k0, k1)


@device_function
def keep_value(x0, x1, x2, x3, slot):
    """The 8-bit value ``slot`` (0..15) of the words: ``(x[slot // 4] >> 8·(slot % 4))
    & 0xFF``, as a uint64."""
    w = x0
    if slot >= 12:
        w = x3
    elif slot >= 8:
        w = x2
    elif slot >= 4:
        w = x1
    return (uint64(w) >> uint64(8 * (slot % 4))) & MASK8


@device_function
def keep(b, h, i, j, k0, k1, threshold):
    """True when element ``(b, h, i, j)`` is kept (``value < threshold``); one Philox
    call for this element alone."""
    group, key_slot = group_slot(j)
    _, half = pair_half(i)
    x0, x1, x2, x3 = keep_values(b, h, i, group, k0, k1)
    return keep_value(x0, x1, x2, x3, half * 8 + key_slot) < uint64(threshold)


# --- the kernels' dropout steps ------------------------------------------------------------


@device_function
def dropout_info(params, seq, h, mi):
    """``(seq, h, k0, k1, threshold, keep_scale, seqlen_q, seqlen_k)`` of query head
    ``h`` of sequence ``seq`` (``numba_flash.variant.params``; the lengths from the
    mask info ``mi``): what :func:`kept_scale` needs."""
    return (seq, h, uint32(params[SEED_K0]), uint32(params[SEED_K1]), uint64(params[KEEP_THRESHOLD]),
            float32(params[KEEP_SCALE]), mi[0], mi[1])  # fmt: skip


@device_function
def kept_scale(i, j, di):
    """``1 / (1 − p)`` when element (query ``i``, key ``j``) is kept, else 0 (one Philox
    call: the per-element path of the exact fp32 kernels and of the backward).  Outside
    the sequence (padding rows and keys of a tile, whose P is 0 or never written) it is
    0 without a call."""
    if i < di[6] and j < di[7] and keep(di[0], di[1], i, j, di[2], di[3], di[4]):
        return di[5]
    return float32(0.0)


@device_function
def chunk_values(i, group, di):
    """The four words of Philox call ``group`` of the row pair of query ``i``
    (:func:`keep_values`)."""
    return keep_values(di[0], di[1], i, group, di[2], di[3])


@device_function
def byte_scale(w, byte, di):
    """``1 / (1 − p)`` when the 8-bit value ``byte`` (0..3) of word ``w`` is kept,
    else 0."""
    if ((uint64(w) >> uint64(8 * byte)) & MASK8) < di[4]:
        return di[5]
    return float32(0.0)


@device_function
def scale_of(x0, x1, x2, x3, slot, di):
    """``1 / (1 − p)`` when value ``slot`` (0..15) of the words is kept, else 0."""
    if keep_value(x0, x1, x2, x3, slot) < di[4]:
        return di[5]
    return float32(0.0)
