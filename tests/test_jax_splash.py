"""The guard around JAX's private splash functions (lcx.attention.kernels.jax_splash): the
installed JAX passes it (.ci/run runs this file on both stacks, jax 0.10.2 and 0.12.0.1), and a
JAX outside the supported range, or a private function whose signature moved, is refused with
KernelNotAvailableError naming the tested versions and the fix, before anything compiles."""

from __future__ import annotations

import types

import jax
import pytest

from lcx.attention.kernels import KernelNotAvailableError, make_kernel
from lcx.attention.kernels import jax_splash as J


def test_the_installed_jax_passes_the_guard():
    assert J.SUPPORTED_JAX[0] <= tuple(jax.__version_info__) < J.SUPPORTED_JAX[1]
    sp = J.splash_internals()
    for fn in (sp.forward, sp.bwd_dq, sp.bwd_dkv, sp.mask_info, sp.block_sizes):
        assert callable(fn)
    assert sp.mask_value < 0


@pytest.mark.parametrize("version", [(0, 10, 2), (0, 11, 3), (0, 12, 0, 1), (0, 12, 9)])
def test_supported_versions_are_accepted(version):
    J.check_jax_version(version)


@pytest.mark.parametrize("version", [(0, 7, 0), (0, 10, 1), (0, 13, 0), (1, 0, 0)])
def test_versions_outside_the_range_are_refused_naming_the_tested_ones(version):
    with pytest.raises(KernelNotAvailableError) as e:
        J.check_jax_version(version)
    msg = str(e.value)
    assert ".".join(map(str, version)) in msg
    assert "tested on jax 0.10.2 and 0.12.0.1" in msg and "plan.attention.kernel='xla'" in msg


def _fake_module(**changes):
    """A stand-in splash module whose three functions take exactly what lcx passes, with
    ``changes`` applied (a name -> None removes that function)."""

    def make(positional, keywords):
        ns: dict = {}
        exec(f"def f({', '.join(positional)}, *, {', '.join(keywords)}): pass", ns)
        return ns["f"]

    fns = {name: make(*J.EXPECTED[name]) for name in J.EXPECTED}
    fns.update(changes)
    return types.SimpleNamespace(**{k: v for k, v in fns.items() if v is not None})


def test_signature_check_accepts_what_lcx_passes_and_refuses_each_change():
    J.check_signatures(_fake_module())
    with pytest.raises(KernelNotAvailableError, match="_splash_attention_bwd_dq is gone"):
        J.check_signatures(_fake_module(_splash_attention_bwd_dq=None))

    def reordered(q, v, k, segment_ids, sinks, logsumexp, do, di, **kw):
        pass

    with pytest.raises(KernelNotAvailableError, match=r"_splash_attention_bwd_dkv takes \['q', 'v', 'k'"):
        J.check_signatures(_fake_module(_splash_attention_bwd_dkv=reordered))

    def renamed(fwd_mask_info, q, k, v, segment_ids, sinks, *, block_sizes, save_residuals):
        pass

    with pytest.raises(KernelNotAvailableError, match="no longer takes.*interpret"):
        J.check_signatures(_fake_module(_splash_attention_forward=renamed))


def test_the_splash_kernel_is_refused_before_compiling_on_an_unsupported_jax(monkeypatch):
    J.splash_internals.cache_clear()
    monkeypatch.setattr(jax, "__version_info__", (0, 13, 0))
    try:
        with pytest.raises(KernelNotAvailableError, match="outside the versions"):
            make_kernel("splash")
    finally:
        monkeypatch.undo()
        J.splash_internals.cache_clear()
    make_kernel("splash")  # the real version again
