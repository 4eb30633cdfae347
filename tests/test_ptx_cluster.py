"""Thread-block cluster intrinsics of ``numba_flash.ptx`` (the split-KV merge through
distributed shared memory, ``kernels.merge.merge_in_cluster``): ``cluster_ctarank``,
``cluster_arrive_release`` / ``cluster_wait_acquire``, ``mapa_shared_cluster``,
``ld_shared_cluster_f32`` / ``_v4_f32``, launched through ``_launch.launch(...,
cluster=S)`` (``cuLaunchKernelEx`` with the cluster dimension).

Each CTA writes values of its own into its shared memory, the cluster meets at its
barrier, and CTA z reads every rank's values (four floats by one 16-byte load, one by
a 4-byte load) into ``out[z, rank, :]``.  Under the simulator (one block at a time) a
cluster has one CTA: the twins are checked there, and ``mapa`` of another rank raises;
on a GPU (``-m gpu``) clusters of 2, 3, 4 and 8 CTAs.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import device, host

from numba_flash import ptx
from numba_flash._launch import launch
from numba_flash._numba_cuda import SIMULATOR, cuda, float32

_ALIGN = ptx.SMEM_ALIGN  # a module global, so numba sees a literal


@cuda.jit
def _cluster_probe(out, S):
    sh = cuda.shared.array(8, float32, alignment=_ALIGN)
    z = cuda.blockIdx.z
    t = cuda.threadIdx.x
    if t < 5:
        sh[t] = float32(10 * z + t)
    ptx.cluster_arrive_release()
    ptx.cluster_wait_acquire()  # every CTA's values, before any reads them
    if t < S:
        a = ptx.mapa_shared_cluster(ptx.smem_addr(sh, 0), t)
        out[z, t, 0], out[z, t, 1], out[z, t, 2], out[z, t, 3] = ptx.ld_shared_cluster_v4_f32(a)
        out[z, t, 4] = ptx.ld_shared_cluster_f32(a + 16)
        out[z, t, 5] = float32(ptx.cluster_ctarank())
    ptx.cluster_arrive_release()
    ptx.cluster_wait_acquire()  # no CTA exits while another reads its shared memory


def _expected(clusters: int, S: int) -> np.ndarray:
    z = np.arange(clusters * S)[:, None, None]
    rank = np.arange(S)[None, :, None]
    peer = (z // S) * S + rank  # the CTA of that rank in z's cluster
    vals = 10.0 * peer + np.arange(5)[None, None, :]
    return np.concatenate([np.broadcast_to(vals, (clusters * S, S, 5)),
                           np.broadcast_to(z % S, (clusters * S, S, 1))], axis=2).astype(np.float32)  # fmt: skip


def _run(clusters: int, S: int) -> np.ndarray:
    out = device(np.full((clusters * S, S, 6), np.nan, np.float32))
    launch(_cluster_probe, (1, 1, clusters * S), 64, 0, out, S, cluster=(1, 1, S))
    return host(out)


@pytest.mark.skipif(not SIMULATOR, reason="the twins of a cluster of one CTA: simulator only")
def test_cluster_of_one_in_the_simulator():
    """Three clusters of one CTA: rank 0, each CTA reads its own shared memory."""
    np.testing.assert_array_equal(_run(3, 1), _expected(3, 1))


@pytest.mark.skipif(not SIMULATOR, reason="the twins' limits: simulator only")
def test_simulator_has_no_clusters_of_more():
    """``mapa`` of rank 1 raises in the simulator, and so does a launch asking for clusters."""
    with pytest.raises(ValueError, match=r"cluster=\(1, 1, 2\)"):
        _run(1, 2)

    @cuda.jit
    def peer(out):
        sh = cuda.shared.array(4, float32, alignment=_ALIGN)
        out[0] = ptx.ld_shared_cluster_f32(ptx.mapa_shared_cluster(ptx.smem_addr(sh, 0), 1))

    with pytest.raises(ValueError, match="rank=1"):
        peer[1, 32](np.zeros(1, np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("S", [2, 3, 4, 8])
def test_clusters_read_each_others_shared_memory(S):
    """Clusters of S CTAs along z (several clusters): every CTA reads every rank's
    shared values, and its rank is z % S."""
    np.testing.assert_array_equal(_run(5, S), _expected(5, S))
