"""Issue #11's speed bars for the variants, fp16, forward and backward, on one GPU, with
torch SDPA's flash backend (FlashAttention-2) in the same process where it has the variant.

    python3 scripts/bench_variants.py out.jsonl [--queued] [--dropout-only | --short-walks]

Each line of ``out.jsonl`` is one case: milliseconds (median of CUDA-event timings of
single calls after warm-up), TFLOP/s counting only the visible (query, key) pairs
(4·d FLOPs a pair forward, 2.5× that backward), and the ratio the issue asks for.
Printed last: a short table.  ``--queued`` times 10 back-to-back calls between two events
instead (the host's time per call hidden behind the GPU's, as torch.utils.benchmark times
FlashAttention-2): the kernels' speed, where single calls of short cases (the window and
varlen ones, under 1 ms) also count the API's host time.

* GQA (4, 32 q / 8 kv heads, 4096, 128) against MHA at the same q shape (≤ 5% slower);
  SDPA with ``enable_gqa=True``.
* window (1, 16, 16384, 128), window (1024, 0), against the plain causal kernel, TFLOP/s
  of visible keys (≥ 0.9×).
* varlen: 16 sequences, random lengths of mean 1024, total 16384, against the padded
  batch; with ``cu_seqlens`` on the device (the API copies them to the host to check
  them: the host waits for the GPU every call) and as NumPy arrays (no wait);
  batch of the same tokens (≥ 0.9× TFLOP/s; causal).
* softcap 30 and ALiBi against plain (4, 16, 4096, 128) causal (each ≤ 10% slower);
  dropout 0.1 against plain (forward ≤ 15% slower), SDPA flash with the same dropout.
  These four are timed in turn over five rounds (``interleaved``: medians), so that the
  GPU's clocks drifting over the run do not fall on the variants timed last; since session
  30 the GQA / MHA, window / causal and varlen / padded / uniform groups too, over three
  rounds (session 30's H100 run timed MHA's causal row alone at 1.53 ms against GQA's 1.01).
"""

import json
import sys

import cupy as cp
import numpy as np

import numba_flash
# visible_pairs: the (query, key) pairs a (batch, head) computes
from numba_flash.bench.cases import ragged_lengths, visible_pairs
from bench_table import median_ms  # the same timer as the shape table (scripts/ is on sys.path)

rng = np.random.default_rng(20261201)


def randn(*shape):
    return cp.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cp.float16)


QUEUED = "--queued" in sys.argv  # time 10 back-to-back calls between two events (host time hidden)


def queued_ms(fn):
    """Milliseconds a call from 10 back-to-back calls between two events."""
    return median_ms(fn, warmup=1, rep=7, calls=10)


def primed_ms(fn, calls=10, rep=7):
    """:func:`queued_ms` with the events behind one untimed call.  ``queued_ms`` starts
    each rep on an idle GPU: its start event fires at once, and the first call's host time
    (0.07–0.14 ms a call for issue #11's rows, session 47's ``host a call``) is inside the
    events, a tenth of it a call.  Here the start event fires as the untimed call ends,
    the next one already queued: the events hold the GPU's time a call alone, as long as
    the host issues calls faster than the GPU runs them (else the host's time a call).
    The loop is ``numba_flash.bench.decode._event_ms``'s with the untimed call added, kept
    here rather than as a library option: ``device_ab.sh``'s ``side old`` runs these scripts
    on older library trees, which would not have it."""
    fn()
    cp.cuda.runtime.deviceSynchronize()
    times = []
    for _ in range(rep):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        fn()  # untimed: the GPU busy when the start event is recorded
        s.record()
        for _ in range(calls):
            fn()
        e.record()
        e.synchronize()
        times.append(cp.cuda.get_elapsed_time(s, e) / calls)
    return float(np.median(times))


def calls(q, k, v, dout, **kw):
    """(forward, backward) of our API on the inputs: ``forward()`` gives (out, lse),
    ``backward(out, lse)`` the gradients."""
    fwd = lambda: numba_flash.flash_attention(q, k, v, return_lse=True, **kw)  # noqa: E731
    bwd = lambda o, l: numba_flash.flash_attention_backward(dout, q, k, v, o, l, **kw)  # noqa: E731
    return fwd, bwd


def varlen_calls(q, k, v, dout, cu, max_len, **kw):
    """:func:`calls` of the varlen API: packed (total, H, d) inputs, the same offsets ``cu``
    and longest length ``max_len`` for queries and keys (NumPy offsets: checked on the host,
    no wait for the GPU; device offsets are copied back to be checked, a sync a call)."""
    fwd = lambda: numba_flash.flash_attention_varlen(q, k, v, cu, cu, max_len, max_len, return_lse=True,  # noqa: E731
                                                     **kw)  # fmt: skip
    bwd = lambda o, l: numba_flash.flash_attention_varlen_backward(dout, q, k, v, o, l, cu, cu,  # noqa: E731
                                                                   max_len, max_len, **kw)  # fmt: skip
    return fwd, bwd


def interleaved(cases, rounds=5):
    """``{name: (forward ms, backward ms)}`` of ``cases`` (name: (forward, backward) as
    :func:`calls` gives them): medians over ``rounds`` rounds in which every case is
    timed in turn, so that a drift of the GPU's clocks over the run falls on all cases
    alike, not on the ones timed last (the variants' ratios to plain)."""
    outs = {name: fwd() for name, (fwd, _) in cases.items()}  # compiled and warm
    timer = queued_ms if QUEUED else median_ms
    times = {name: ([], []) for name in cases}
    for _ in range(rounds):
        for name, (fwd, bwd) in cases.items():
            out, lse = outs[name]
            times[name][0].append(timer(fwd))
            times[name][1].append(timer(lambda: bwd(out, lse)))  # noqa: B023 (called at once)
    return {name: (float(np.median(f)), float(np.median(b))) for name, (f, b) in times.items()}


def sdpa(q, k, v, dout, causal=False, gqa=False, dropout_p=0.0):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tq, tk, tv, tdo = (torch.as_tensor(x, device="cuda").transpose(1, 2) for x in (q, k, v, dout))
    tq, tk, tv = (x.detach().requires_grad_() for x in (tq, tk, tv))
    F = torch.nn.functional.scaled_dot_product_attention
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        def fwd():
            return F(tq, tk, tv, is_causal=causal, enable_gqa=gqa, dropout_p=dropout_p), None

        def bwd(o, _):
            return torch.autograd.grad(o, (tq, tk, tv), tdo, retain_graph=True)

        try:
            out, _ = fwd()
            timer = queued_ms if QUEUED else median_ms
            return timer(lambda: fwd()), timer(lambda: bwd(out, None))
        except RuntimeError as exc:  # the flash backend refuses the case
            return str(exc).splitlines()[0], None


def record(rows, name, pairs, d, ms, ref_name=None, ref_ms=None, bar=None, peer=None):
    fl = 4 * pairs * d
    row = dict(case=name, fwd_ms=ms[0], bwd_ms=ms[1], fwd_tflops=fl / ms[0] / 1e9, bwd_tflops=2.5 * fl / ms[1] / 1e9)
    if ref_ms is not None:
        row.update(ref=ref_name, ref_fwd_ms=ref_ms[0], ref_bwd_ms=ref_ms[1], bar=bar)
    if peer is not None and not isinstance(peer[0], str):
        row.update(sdpa_fwd_ms=peer[0], sdpa_bwd_ms=peer[1])
    elif peer is not None:
        row.update(sdpa=peer[0])
    rows.append(row)
    print(json.dumps(row), flush=True)


DROPOUT_ONLY = "--dropout-only" in sys.argv
SHORT_WALKS = "--short-walks" in sys.argv  # the window and varlen rows alone (with their references)


def main(path):
    rows = []
    if not DROPOUT_ONLY:  # --dropout-only: the softcap, ALiBi and dropout rows alone
        # GQA vs MHA at the same q shape (not with --short-walks: the window and varlen rows alone)
        B, H, Hk, N, d = 4, 32, 8, 4096, 128
        for causal in () if SHORT_WALKS else (False, True):
            q, dout = randn(B, N, H, d), randn(B, N, H, d)
            k, v = randn(B, N, Hk, d), randn(B, N, Hk, d)
            km, vm = randn(B, N, H, d), randn(B, N, H, d)
            ms = interleaved({"mha": calls(q, km, vm, dout, causal=causal), "gqa": calls(q, k, v, dout, causal=causal)},
                             rounds=3)  # fmt: skip
            mha, gqa = ms["mha"], ms["gqa"]
            pairs = B * H * visible_pairs(N, N, causal)
            record(rows, f"gqa 32/8 {'causal' if causal else 'full'}", pairs, d, gqa, "mha", mha, "time <= 1.05x mha",
                   sdpa(q, k, v, dout, causal, gqa=True))  # fmt: skip
            del q, dout, k, v, km, vm
        # window (1024, 0) vs causal
        B, H, N, d = 1, 16, 16384, 128
        q, k, v, dout = randn(B, N, H, d), randn(B, N, H, d), randn(B, N, H, d), randn(B, N, H, d)
        ms = interleaved({"causal": calls(q, k, v, dout, causal=True),
                          "window": calls(q, k, v, dout, causal=True, window_size=(1024, 0))}, rounds=3)  # fmt: skip
        causal_ms, win = ms["causal"], ms["window"]
        record(rows, "causal 16384", B * H * visible_pairs(N, N, True), d, causal_ms, peer=sdpa(q, k, v, dout, True))
        record(rows, "window (1024,0) 16384", B * H * visible_pairs(N, N, True, (1024, 0)), d, win, "causal", causal_ms,
               "visible TFLOP/s >= 0.9x causal")  # fmt: skip
        del q, k, v, dout
        # varlen vs padded batch of the same tokens (causal)
        lens = ragged_lengths(rng)
        H, d = 16, 128
        total = int(lens.sum())
        cu_host = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        q, k, v, dout = (randn(total, H, d) for _ in range(4))
        pairs = H * sum(visible_pairs(n, n, True) for n in lens)
        Np = int(lens.max())
        Nu = total // len(lens)
        qp, kp, vp, dop = (randn(len(lens), Np, H, d) for _ in range(4))
        qu, ku, vu, dou = (randn(len(lens), Nu, H, d) for _ in range(4))
        # device offsets: copied to the host to be checked (a sync a call); NumPy offsets: checked
        # on the host, uploaded without waiting for the GPU; all five timed in turn
        ms = interleaved({"device": varlen_calls(q, k, v, dout, cp.asarray(cu_host), Np, causal=True),
                          "host": varlen_calls(q, k, v, dout, cu_host, Np, causal=True),
                          "padded": calls(qp, kp, vp, dop, causal=True),
                          "uniform": calls(qu, ku, vu, dou, causal=True)}, rounds=3)  # fmt: skip
        var_ms, host_ms, pad_ms, uni_ms = ms["device"], ms["host"], ms["padded"], ms["uniform"]
        pad_pairs = len(lens) * H * visible_pairs(Np, Np, True)
        record(rows, f"padded batch 16x{Np}", pad_pairs, d, pad_ms)
        record(rows, f"varlen 16 seqs total {total}", pairs, d, var_ms, "padded", pad_ms, "TFLOP/s >= 0.9x padded")
        record(rows, "varlen, NumPy cu_seqlens", pairs, d, host_ms, "padded", pad_ms, "TFLOP/s >= 0.9x padded")
        # the other reading of "the padded batch with the same tokens": its time for them (what
        # padding costs a user), not its TFLOP/s over the padded pairs (the bar's rows above)
        record(rows, "varlen (NumPy) time / padded", pairs, d, host_ms, "padded", pad_ms,
               "time (no bar: the same tokens padded)")  # fmt: skip
        # the same tokens as 16 sequences of the mean length: what the varlen kernels lose to
        # their ragged lengths alone (not to shorter sequences than the padded batch's)
        del qp, kp, vp, dop
        record(rows, f"uniform batch 16x{Nu}", len(lens) * H * visible_pairs(Nu, Nu, True), d, uni_ms)
        record(rows, "varlen vs uniform", pairs, d, var_ms, "uniform", uni_ms, "TFLOP/s (no bar: diagnosis)")
        del qu, ku, vu, dou
        del q, k, v, dout
    if SHORT_WALKS:
        return report(rows, path)
    # softcap and ALiBi vs plain
    B, H, N, d = 4, 16, 4096, 128
    q, k, v, dout = randn(B, N, H, d), randn(B, N, H, d), randn(B, N, H, d), randn(B, N, H, d)
    pairs = B * H * visible_pairs(N, N, True)
    slopes = cp.asarray((2.0 ** -np.arange(1, H + 1)).astype(np.float32))
    ms = interleaved({"plain": calls(q, k, v, dout, causal=True),
                      "softcap": calls(q, k, v, dout, causal=True, softcap=30.0),
                      "alibi": calls(q, k, v, dout, causal=True, alibi_slopes=slopes),
                      "dropout": calls(q, k, v, dout, causal=True, dropout_p=0.1, seed=1234)})  # fmt: skip
    plain = ms["plain"]
    record(rows, "plain causal 4x16x4096", pairs, d, plain, peer=sdpa(q, k, v, dout, True))
    record(rows, "softcap 30", pairs, d, ms["softcap"], "plain", plain, "time <= 1.10x plain")
    record(rows, "alibi", pairs, d, ms["alibi"], "plain", plain, "time <= 1.10x plain")
    record(rows, "dropout 0.1", pairs, d, ms["dropout"], "plain", plain, "fwd time <= 1.15x plain",
           sdpa(q, k, v, dout, True, dropout_p=0.1))  # fmt: skip
    report(rows, path)


def write_jsonl(rows, path):
    """The rows, a JSON line each, to ``path`` (this script's and ``bench_fa2.py``'s)."""
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def report(rows, path):
    write_jsonl(rows, path)
    print(f"\n{'case':32} {'fwd TF/s':>9} {'bwd TF/s':>9}  {'fwd ratio':>9} {'bwd ratio':>9}  bar")
    for r in rows:
        ratio = ""
        if "ref" in r:
            if "TFLOP" in r["bar"]:  # TFLOP/s ratio (counted pairs differ)
                ref = next(x for x in rows if x["case"].startswith({"causal": "causal 16384", "padded": "padded",
                                                                     "uniform": "uniform"}[r["ref"]]))
                ratio = f"{r['fwd_tflops'] / ref['fwd_tflops']:9.3f} {r['bwd_tflops'] / ref['bwd_tflops']:9.3f}"
            else:  # time ratio
                ratio = f"{r['fwd_ms'] / r['ref_fwd_ms']:9.3f} {r['bwd_ms'] / r['ref_bwd_ms']:9.3f}"
        print(f"{r['case']:32} {r['fwd_tflops']:9.1f} {r['bwd_tflops']:9.1f}  {ratio:19}  {r.get('bar', '')}")


if __name__ == "__main__":
    main(sys.argv[1])  # options after the path: --queued
