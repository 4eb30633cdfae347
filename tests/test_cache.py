"""numba-flash's on-disk kernel cache (``numba_flash._cache``): what tells kernels apart,
and, on a GPU, that a second process loads what the first compiled and computes the
same bits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import SIMULATOR


KEYS_SCRIPT = textwrap.dedent("""
    import json
    from numba_flash import _cache, config
    from numba_flash.kernels import simt_blocked_forward, tc_backward, tc_forward, wgmma_backward
    from numba_flash.variant import Variant

    t64, t128 = config.tc_forward_tiles(64), config.tc_forward_tiles(128)
    kernels = [
        tc_forward.tc_forward_kernel(t64, Variant(), "float16"),
        tc_forward.tc_forward_kernel(t64, Variant(causal=True), "float16"),
        tc_forward.tc_forward_kernel(t64, Variant(), "bfloat16"),
        tc_forward.tc_forward_kernel(t128, Variant(), "float16"),
        tc_backward.tc_bwd_dq_kernel(config.tc_backward_tiles(64), Variant(), "float16"),
        simt_blocked_forward.simt_blocked_forward_kernel(config.blocked_forward_tiles(64), Variant()),
        # kernels that differ only in a device function's closure (its dtype, head dim, chain shape)
        tc_backward.tc_bwd_stats_kernel(64, "float16"),
        tc_backward.tc_bwd_stats_kernel(64, "bfloat16"),
        tc_backward.tc_bwd_stats_kernel(128, "float16"),
        tc_backward.tc_bwd_preprocess_kernel(64, "float16"),
        tc_backward.tc_bwd_preprocess_kernel(128, "float16"),
        wgmma_backward.wgmma_bwd_kernel(wgmma_backward.tiles(128)[0], Variant(), "float16"),
        wgmma_backward.wgmma_bwd_kernel(wgmma_backward.tiles(128)[0], Variant(), "bfloat16"),
    ]
    keys = [_cache.variant_key(k.py_func) for k in kernels]
    assert keys == [_cache.variant_key(k.py_func) for k in kernels]
    print(json.dumps(dict(keys=keys, source=_cache.source_hash())))
""")


def _keys_in_a_fresh_process() -> dict:
    """Build the dispatchers as on a GPU (``NUMBA_ENABLE_CUDASIM=0``: building needs no
    device, only compiling does; the simulator's twins are plain functions, which the
    cache refuses to key) and return their keys."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    done = subprocess.run([sys.executable, "-c", KEYS_SCRIPT], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_kernel_variant_has_its_own_key_and_keeps_it_across_processes():
    """Tiles, causal and dtype (an intrinsic in the closure) all change the key, also
    where they reach the kernel only through a device function a factory made (the
    preprocess's row sum, the wgmma chains: a loaded kernel of another dtype or head
    dim computed wrong delta and read past the rows on the H200), and two processes
    agree on every key (numba's own key pickles a per-process uuid of every intrinsic,
    so it never hits across processes)."""
    first, second = _keys_in_a_fresh_process(), _keys_in_a_fresh_process()
    assert len(set(first["keys"])) == len(first["keys"]) == 13
    assert first == second
    assert len(first["source"]) == 64


def test_closure_values_without_a_stable_text_are_refused():
    from numba_flash import _cache

    assert _cache.stable_text((1, True, "x", None)) == "(int:1,bool:True,str:'x',NoneType:None)"
    with pytest.raises(TypeError, match="no stable cache key"):
        _cache.stable_text(object())


def test_enable_is_idempotent_and_can_be_turned_off(monkeypatch):
    from numba_flash import _cache

    class Dispatcher:  # what enable() touches of a numba dispatcher
        py_func = staticmethod(lambda: None)

    monkeypatch.setenv("NUMBA_FLASH_CACHE", "0")
    d = Dispatcher()
    _cache.enable(d)
    assert not hasattr(d, "_cache")


@pytest.mark.gpu
@pytest.mark.skipif(SIMULATOR, reason="the on-disk cache stores cubins: it needs a GPU")
def test_a_second_process_loads_the_kernels_and_computes_the_same_bits(tmp_path):
    script = textwrap.dedent('''
        import json, sys, time
        import cupy as cp, numpy as np
        import numba_flash
        rng = np.random.default_rng(0)
        q, k, v, do = (cp.asarray(rng.standard_normal((1, 200, 2, 64)).astype(np.float16)) for _ in range(4))
        t = time.perf_counter()
        out, lse = numba_flash.flash_attention(q, k, v, causal=True, return_lse=True)
        dq, dk, dv = numba_flash.flash_attention_backward(do, q, k, v, out, lse, causal=True)
        cp.cuda.runtime.deviceSynchronize()
        seconds = time.perf_counter() - t
        bits = [cp.asnumpy(x).view(np.uint16).tobytes().hex() for x in (out, dq, dk, dv)]
        print(json.dumps(dict(seconds=seconds, bits=bits)))
    ''')
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                      check=True).stdout.strip().splitlines()[-1]) for _ in range(2)]  # fmt: skip
    assert runs[0]["bits"] == runs[1]["bits"]
    assert any(p.suffix == ".nbc" for p in (tmp_path / "cache").rglob("*"))
    assert runs[1]["seconds"] < 0.5 * runs[0]["seconds"], runs
