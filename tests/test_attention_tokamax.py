"""The ``tokamax`` kernel (Tokamax's Pallas splash attention, interpret mode on CPU) against the
dense float32 reference, alone and as the per-device kernel of a context-parallel strategy; and
its refusal where tokamax cannot be installed (Python < 3.12), which runs everywhere.

The helpers, masks and tolerances are the splash tests' (tests/test_attention_splash.py): the
two kernels share the sorted-interval algorithm, and a kernel must match the reference to the
same bounds whatever library runs it. Shapes are tiny, blocks the smallest tokamax allows.
"""

import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernel_calls import kernel_backward, kernel_forward

from lcx.attention import Mask, make_kernel
from lcx.attention.kernels import KernelNotAvailableError, splash_intervals
from lcx.sharding import apply_layout

sys.path.insert(0, str(Path(__file__).parent))
import test_attention_splash as splash_tests  # noqa: E402  (reference, inputs, two-block run, tolerances)
import test_attention_strategies as strategies  # noqa: E402  (shared strategy-matrix helpers)


@pytest.fixture
def tokamax_kernel():
    """``make_kernel('tokamax', ...)`` (a factory); skips where tokamax is not installed."""
    pytest.importorskip("tokamax")
    return functools.partial(make_kernel, "tokamax")


# Every mask predicate and head layout at least once over this file (MHA: the odd-lengths test;
# each case ~15 s of interpret-mode compile and run on an idle core).
KERNEL_CASES = [("causal_doc", "gqa2"), ("full_doc_window", "mqa"), ("chunk_doc", "gqa2")]


@pytest.mark.parametrize("mask_name,heads", KERNEL_CASES, ids=[f"{m}-{h}" for m, h in KERNEL_CASES])
def test_tokamax_matches_reference_on_zigzag_positions(tokamax_kernel, mask_name, heads):
    """Device 0's zigzag shard of a packed sequence against the whole sequence as two ring-step
    K/V halves: forward out and lse merged through the logsumexp, then each half's backward
    with the GLOBAL out/lse (dq summed, dk/dv concatenated), against the dense reference."""
    mask = splash_tests.MASKS[mask_name]
    N, K = splash_tests.HEADS[heads]
    B, S, H, P = 1, 512, 16, 2
    T = S // P
    q, k, v, do = splash_tests._inputs(B, T, S, N, K, H, seed=len(mask_name))
    pos, seg = splash_tests._zigzag_documents(B, S, P, seed=len(mask_name))
    if not mask.document:  # one long document: positions are the (zigzagged) global indices
        pos, seg = apply_layout(np.broadcast_to(np.arange(S, dtype=np.int32), (B, S)), "zigzag", P, axis=1), seg * 0
    qp, qs, kp, ks = (jnp.asarray(x) for x in (pos[:, :T], seg[:, :T], pos, seg))
    out, lse, grads = splash_tests._two_block_run(tokamax_kernel(128, 128), mask, q, k, v, qp, kp, qs, ks, do)
    splash_tests._assert_matches(out, lse, grads, *splash_tests._reference(mask, q, k, v, qp, kp, qs, ks, do))


def test_tokamax_pads_odd_lengths_chunks_long_kv_and_handles_empty_rows(tokamax_kernel, monkeypatch):
    """Lengths that are not multiples of 128, K/V cut into 3 chunks (MAX_KV_CHUNK lowered to
    128), unsorted key positions, and queries that see no key (out 0, lse -inf, zero grads:
    tokamax never visits their blocks); MHA, a forward query block below 128 (64) and the
    backward's own (block_q_dkv=128)."""
    monkeypatch.setattr(splash_intervals, "MAX_KV_CHUNK", 128)
    mask = Mask(document=True)
    B, T, S, N, K, H = 2, 40, 300, 2, 2, 8
    q, k, v, do = splash_tests._inputs(B, T, S, N, K, H, seed=5)
    rng = np.random.default_rng(5)
    kp = jnp.asarray(np.stack([rng.permutation(S) for _ in range(B)]), jnp.int32)
    ks = jnp.asarray(rng.random((B, S)) < 0.5, jnp.int32)
    qp = jnp.asarray(rng.integers(-20, S, size=(B, T)), jnp.int32)  # negative positions see no key
    qs = jnp.asarray(rng.random((B, T)) < 0.5, jnp.int32)
    kern = tokamax_kernel(64, 128, 128, None)

    @functools.partial(jax.jit, compiler_options=splash_tests.FAST_COMPILE)
    def run(q, k, v, qp, kp, qs, ks, do):
        out, lse = kernel_forward(kern, q, k, v, qp, kp, qs, ks, mask=mask)
        return out, lse, kernel_backward(kern, q, k, v, qp, kp, qs, ks, out, lse, do, mask=mask)

    out, lse, grads = run(q, k, v, qp, kp, qs, ks, do)
    ref_out, ref_grads, ref_lse = splash_tests._reference(mask, q, k, v, qp, kp, qs, ks, do)
    empty = jnp.isneginf(ref_lse)
    assert bool(empty.any()) and bool((~empty).any())
    assert bool(jnp.all(jnp.where(empty[..., None], out, 0) == 0))
    splash_tests._assert_matches(out, lse, grads, ref_out, ref_grads, ref_lse)


def test_ring_with_tokamax_matches_reference(tokamax_kernel, monkeypatch):
    """The ring (4 devices of the 8 simulated: every ring step a partial K/V block, the
    backward with the global logsumexp) on a packed causal document mask, GQA, both layouts."""
    monkeypatch.setattr(strategies, "BLOCK_Q", 128)
    monkeypatch.setattr(strategies, "BLOCK_KV", 128)
    mp = strategies.make_mesh_plan("ring", 4, kernel="tokamax")
    assert mp.plan.attention.kernel == "tokamax"
    strategies.check_against_reference(mp, "causal_doc", "gqa4")


def test_tokamax_refuses_blocks_it_cannot_tile(tokamax_kernel):
    for args, what, unit in (
        ((60, 128), "block_q", 8),
        ((128, 200), "block_kv", 128),
        ((128, 128, 64, None), "block_q_dkv", 128),
        ((128, 128, None, 64), "block_kv_dkv", 128),
    ):
        with pytest.raises(
            ValueError, match=f"kernel='tokamax' needs plan.attention.{what} to be a positive multiple of {unit} tokens"
        ):
            tokamax_kernel(*args)
    with pytest.raises(ValueError, match="block_kv to be a positive multiple of 128 tokens and <= 16384"):
        tokamax_kernel(128, 32768)
    with pytest.raises(ValueError, match="least common multiple 49152 exceeds 16384"):
        tokamax_kernel(128, 16384, None, 384)
    assert tokamax_kernel(8, 128).blocks.block_q == 8


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="tokamax installs on Python >= 3.12")
def test_tokamax_without_tokamax_names_the_install_and_the_python_floor():
    """On Python 3.11 (lcx's floor) tokamax cannot be installed: building the kernel, before any
    compile, raises KernelNotAvailableError naming the extra, the Python floor and the
    alternatives -- never a silent fallback to another kernel."""
    with pytest.raises(KernelNotAvailableError, match=r"Python >= 3\.12.*pip install \"lcx\[tokamax\]\".*'splash'"):
        make_kernel("tokamax", 128, 128)
    assert issubclass(KernelNotAvailableError, NotImplementedError)
