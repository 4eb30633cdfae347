"""What the tensor-core kernels compile to, read off `numba-flash inspect --ptx` (no GPU
needed): mma.sync m16n8k16, ldmatrix and cp.async are there, nothing goes to local
memory, and the backward's dQ uses no atomics."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from numba_flash_cli.main import main

CASES = [
    ("forward", "float16", 64, True),
    ("forward", "float16", 128, False),
    ("forward", "bfloat16", 64, False),
    ("forward", "bfloat16", 128, True),
    ("backward", "float16", 64, True),
    ("backward", "bfloat16", 128, True),
]


@pytest.mark.parametrize("pass_,dtype,head_dim,causal", CASES)
def test_tensor_core_ptx(pass_, dtype, head_dim, causal):
    args = ["inspect", "--pass", pass_, "--dtype", dtype, "--head-dim", str(head_dim), "--arch", "sm_90", "--ptx"]
    result = CliRunner().invoke(main, args + (["--causal"] if causal else []))
    assert result.exit_code == 0, result.output
    summary, _, ptx = result.output.partition("// =====")
    assert "tensor-core" in summary
    kind = "f16" if dtype == "float16" else "bf16"
    assert re.search(rf"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.{kind}\.{kind}\.f32", ptx)
    assert "ldmatrix.sync.aligned.m8n8.x4" in ptx and "cp.async.cg.shared.global" in ptx
    assert "ld.local" not in ptx and "st.local" not in ptx
    if pass_ == "backward":
        assert "ldmatrix.sync.aligned.m8n8.x4.trans" in ptx
        assert not re.search(r"\b(atom|red)\.", ptx)  # deterministic: no atomics
