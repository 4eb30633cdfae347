"""Dropout bits: which (query, key) probabilities a kernel keeps, from Philox4x32-7.

The keep bit of element ``(b, h, i, j)`` (batch or varlen sequence, query head, query
row and key column, both within the sequence) is, for a ``seed`` and ``dropout_p``::

    (k0, k1)  = (seed & 0xFFFFFFFF, seed >> 32)                  seed_key(seed)
    pair      = (i // 16) * 8 + i % 8                            pair_half(i)
    group     = (j // 32) * 4 + (j % 8) // 2                     group_slot(j)
    slot      = ((i // 8) % 2) * 8 + ((j % 32) // 8) * 2 + j % 2   0..15
    x0..x3    = philox4x32(c0=group, c1=pair, c2=h, c3=b, k0, k1, ROUNDS = 7)
    value     = (x[slot // 4] >> (8 * (slot % 4))) & 0xFF
    threshold = min(256, round((1 − dropout_p) · 256))           keep_threshold(p)
    kept      = value < threshold

Kept probabilities are scaled by ``1 / (1 − p)``.  ``reference.dropout_mask`` is the
same definition in NumPy; the tests compare the two bit for bit.  The values are 8-bit,
as FlashAttention-2's: the drop rate is p rounded to a multiple of 1/256.

Philox4x32 (Salmon et al., SC'11; as Random123 and cuRAND) is rounds of::

    (hi0, lo0) = mulhilo32(0xD2511F53, c0)
    (hi1, lo1) = mulhilo32(0xCD9E8D57, c2)
    c = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
    k0 += 0x9E3779B9;  k1 += 0xBB67AE85                          (mod 2**32)

the first with the key as given.  Dropout takes seven rounds, as FlashAttention-2's
``philox`` does (Salmon et al. count Philox4x32 with 7 rounds among the generators
that pass TestU01's BigCrush; 10 is Random123's default, with 3 rounds of margin).
The tests check the round function against Random123's known answers for 10 rounds.

Why this grouping: a lane of an ``mma.sync`` m16n8 accumulator holds rows ``g`` and
``g + 8`` of a 16-row m-tile (g = lane // 4) and, per 8-key n-tile, the keys ``2t``
and ``2t + 1`` (t = lane % 4).  The 16 values of one ``(pair, group)`` are exactly
those rows at keys ``32a + 8c + 2t + {0, 1}`` of the four n-tiles ``c = 0..3`` of a
32-key stretch ``a``: all the values one lane needs for four n-tiles of an m-tile, from
one Philox call (``keep_values``, then ``keep_value`` per slot).  The transposed tiles
of dK/dV (rows keys, columns queries) share a call between two lanes
(``fragments._pair_words``).

Cost: one Philox call (14 ``mul.wide.u32`` through ``ptx.mul_wide_u32``, each giving
both halves, and 14 three-input XORs) per 16 elements when a lane holds all 16, half
the calls of 16-bit values; a kernel that asks for single elements (``keep``) pays one
call per element.  The 16-bit forwards then drop packed P pairs four bytes at a time
(:func:`keep_msbs`, :func:`drop_slice`: 1.75 integer instructions an element) and
scale O by ``1 / (1 − p)`` once, in the epilogue (:func:`out_scale`).
The counter names (b, h, row pair, group) and nothing about the tiling, so every
kernel family and tile size draws the same bits.

Every intermediate is a uint32 (numba types uint32 arithmetic as int64; each result
is truncated with ``uint32(...)``, the key bumps added in uint64 and masked), so
numba's CUDA simulator, which runs these functions on NumPy scalars, and the GPU give
the same bits.  The products go through ``ptx.mul_wide_u32``: written as uint64
products, LLVM kept the rounds in 64 bits (``mul.lo.s64`` and 64-bit XORs in the PTX
of the wgmma forward).
"""

from __future__ import annotations

from numba_flash import ptx
from numba_flash._numba_cuda import device_function, float32, uint32, uint64
# Host side (plain Python, one definition for the reference and the API):
from numba_flash.reference import keep_threshold, seed_key
from numba_flash.variant import KEEP_SCALE, KEEP_THRESHOLD, SEED_K0, SEED_K1

__all__ = ["ROUNDS", "philox4x32", "group_slot", "pair_half", "keep_values", "keep_value", "keep", "dropout_info",
           "kept_scale", "chunk_values", "byte_scale", "scale_of", "keep_msbs", "drop_slice", "apply_keep", "keep_chunk",
           "out_scale", "seed_key", "keep_threshold"]

M0 = uint64(0xD2511F53)  # Philox round multipliers
M1 = uint64(0xCD9E8D57)
W0 = uint64(0x9E3779B9)  # key bumps: the golden ratio and sqrt(3) − 1, as 32-bit fractions
W1 = uint64(0xBB67AE85)
MASK32 = uint64(0xFFFFFFFF)
LOW7 = uint32(0x7F7F7F7F)  # the low 7 bits of each byte
HIGH1 = uint32(0x80808080)  # the top bit of each byte
BYTES = uint32(0x01010101)
#: Philox rounds of the dropout bits (FlashAttention-2's ``philox``: 6 + 1).
ROUNDS = 7


@device_function
def philox4x32(c0, c1, c2, c3, k0, k1, rounds):
    """Philox4x32 with ``rounds`` rounds of the counter ``(c0, c1, c2, c3)`` under the
    key ``(k0, k1)``: four uint32 words (the module docstring).  The arguments are
    taken mod 2**32; ``rounds`` is a constant (the loop unrolls)."""
    c0 = uint32(uint64(c0) & MASK32)
    c1 = uint32(uint64(c1) & MASK32)
    c2 = uint32(uint64(c2) & MASK32)
    c3 = uint32(uint64(c3) & MASK32)
    k0 = uint32(uint64(k0) & MASK32)
    k1 = uint32(uint64(k1) & MASK32)
    for _ in range(rounds):
        hi0, lo0 = ptx.mul_wide_u32(M0, c0)
        hi1, lo1 = ptx.mul_wide_u32(M1, c2)
        c0, c1, c2, c3 = uint32(hi1 ^ c1 ^ k0), lo1, uint32(hi0 ^ c3 ^ k1), lo0
        # the key bump mod 2**32, added in 64 bits (a uint32 add overflowing would
        # warn in the simulator, which runs on NumPy scalars)
        k0 = uint32((uint64(k0) + W0) & MASK32)
        k1 = uint32((uint64(k1) + W1) & MASK32)
    return c0, c1, c2, c3


@device_function
def group_slot(j):
    """``(group, key_slot)`` of key ``j`` (≥ 0): its Philox call, and its part (0..7) of
    the value's slot (``(j // 32)·4 + (j % 8) // 2`` and ``((j % 32) // 8)·2 + j % 2``,
    in shifts and masks: signed // and % cost a dozen instructions more)."""
    return ((j >> 5) << 2) | ((j & 7) >> 1), (((j & 31) >> 3) << 1) | (j & 1)


@device_function
def pair_half(i):
    """``(pair, half)`` of query row ``i``: rows ``16a + r`` and ``16a + r + 8`` (r < 8)
    share the counter word ``pair``; ``half`` (0 or 1) is which of the two, the high
    bit of the value's slot (``i`` ≥ 0; shifts and masks, as :func:`group_slot`)."""
    return ((i >> 4) << 3) | (i & 7), (i >> 3) & 1


@device_function
def keep_values(b, h, i, group, k0, k1):
    """The four words of Philox call ``group`` of the row pair of query ``i``, head
    ``h``, batch (or varlen sequence) ``b``: the 16 values of rows ``i``, ``i ± 8`` at
    keys ``32·(group // 4) + 8c + 2·(group % 4) + {0, 1}``, c = 0..3."""
    pair, _ = pair_half(i)
    return philox4x32(group, pair, h, b, k0, k1, ROUNDS)


@device_function
def keep_value(x0, x1, x2, x3, slot):
    """The 8-bit value ``slot`` (0..15) of the words: ``(x[slot // 4] >> 8·(slot % 4))
    & 0xFF``, as a uint32."""
    w = x0
    if slot >= 12:
        w = x3
    elif slot >= 8:
        w = x2
    elif slot >= 4:
        w = x1
    return uint32((w >> (8 * (slot % 4))) & 0xFF)


@device_function
def keep(b, h, i, j, k0, k1, threshold):
    """True when element ``(b, h, i, j)`` is kept (``value < threshold``); one Philox
    call for this element alone."""
    group, key_slot = group_slot(j)
    _, half = pair_half(i)
    x0, x1, x2, x3 = keep_values(b, h, i, group, k0, k1)
    return keep_value(x0, x1, x2, x3, half * 8 + key_slot) < uint32(threshold)


# --- the kernels' dropout steps ------------------------------------------------------------


@device_function
def dropout_info(params, seq, h, mi):
    """``(seq, h, k0, k1, threshold, keep_scale, seqlen_q, seqlen_k)`` of query head
    ``h`` of sequence ``seq`` (``numba_flash.variant.params``; the lengths from the
    mask info ``mi``): what :func:`kept_scale` needs."""
    return (seq, h, uint32(params[SEED_K0]), uint32(params[SEED_K1]), uint32(params[KEEP_THRESHOLD]),
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
    if uint32((w >> (8 * byte)) & 0xFF) < di[4]:
        return di[5]
    return float32(0.0)


@device_function
def scale_of(x0, x1, x2, x3, slot, di):
    """``1 / (1 − p)`` when value ``slot`` (0..15) of the words is kept, else 0."""
    if keep_value(x0, x1, x2, x3, slot) < di[4]:
        return di[5]
    return float32(0.0)


# --- the 16-bit forwards: P dropped as packed pairs, O scaled once -----------------------


@device_function
def keep_msbs(w, di):
    """Bit 7 of byte n of the result is set where the 8-bit value n of word ``w`` is
    kept (``value < threshold``), the other bits are junk: four compares in three
    instructions (SWAR).  With ``t = threshold − 1`` in every byte (0..255: a
    threshold of 256 keeps all), ``d = (t | 0x80…) − (w & 0x7F…)`` has bit 7 of byte n
    set where t's low 7 bits ≥ the value's (no byte borrows: 128 + t7 − w7 ≥ 1), and
    ``t ≥ value`` is then the majority of (t, ¬w, d) at bit 7: t's top bit where the
    two top bits differ, else d's.  A threshold of 0 keeps byte values 0 here;
    :func:`out_scale` is then 0."""
    t = uint32(max(di[4], uint32(1)) - uint32(1))
    t4 = uint32(t * BYTES)
    nw = uint32(w ^ MASK32)
    d = uint32(uint32(t4 | HIGH1) - uint32(w & LOW7))
    return uint32((t4 & nw) | (t4 & d) | (nw & d))


@device_function
def drop_slice(frag, F0, wa, wb, di):
    """P ∘ Z on one k-slice of packed P (``frag[F0:F0+4]``, ``fragments.pack_a``'s
    layout: n-tiles 2ps, 2ps + 1 × rows g, g + 8, two keys a word) in place: dropped
    16-bit values become 0.  ``wa``, ``wb`` are the Philox words of rows g and g + 8
    holding this slice's keys (words ``ps % 2`` and ``2 + ps % 2`` of the 32-key
    stretch's call); bytes 0, 1 are n-tile 2ps's keys 2t, 2t + 1, bytes 2, 3
    n-tile 2ps + 1's (``ptx.prmt`` widens a byte's keep bit to its 16-bit value)."""
    apply_keep(frag, F0, keep_msbs(wa, di), keep_msbs(wb, di))


@device_function
def apply_keep(frag, F0, ka, kb):
    """:func:`drop_slice` from its keep words: ``ka``, ``kb`` are :func:`keep_msbs` of
    rows g's and g + 8's Philox words (a byte's bit 7: its element kept)."""
    frag[F0] = uint32(frag[F0] & ptx.prmt(ka, 0, 0x9988))
    frag[F0 + 1] = uint32(frag[F0 + 1] & ptx.prmt(kb, 0, 0x9988))
    frag[F0 + 2] = uint32(frag[F0 + 2] & ptx.prmt(ka, 0, 0xBBAA))
    frag[F0 + 3] = uint32(frag[F0 + 3] & ptx.prmt(kb, 0, 0xBBAA))


@device_function
def keep_chunk(i, group, di):
    """The keep words of Philox call ``group`` of query ``i``'s row pair, as
    :func:`apply_keep` takes them for the two k-slices of its 32-key stretch:
    ``(ka, kb)`` of the first slice, then of the second (:func:`keep_msbs` of words
    x0, x2, x1, x3).  ``fragments.drop_packed`` drops with them in place."""
    x0, x1, x2, x3 = chunk_values(i, group, di)
    return keep_msbs(x0, di), keep_msbs(x2, di), keep_msbs(x1, di), keep_msbs(x3, di)


@device_function
def out_scale(di):
    """What O is scaled by after dropping packed P (:func:`drop_slice`): ``1 / (1 − p)``,
    or 0 when the threshold is 0 (p rounded to 1: nothing is kept, and
    :func:`keep_msbs` kept the zero values)."""
    if di[4] == uint32(0):
        return float32(0.0)
    return di[5]
