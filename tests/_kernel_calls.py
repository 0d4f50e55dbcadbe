"""The kernel interface in the flat form the kernel tests write their cases in.

:class:`~lcx.attention.kernels.AbstractKernel` takes a :class:`~lcx.attention.blocks.QueryBlock`,
a :class:`~lcx.attention.blocks.KVBlock` and, in the backward, a
:class:`~lcx.attention.blocks.Cotangent`; the tests build their inputs as separate arrays.
"""

from lcx.attention.blocks import Cotangent, KVBlock, QueryBlock


def kernel_forward(kern, q, k, v, q_pos, k_pos, q_seg, k_seg, *, mask):
    """``kern.forward`` of the flat arrays: ``(out, lse)``."""
    return kern.forward(QueryBlock(q, q_pos, q_seg), KVBlock(k, v, k_pos, k_seg), mask=mask)


def kernel_backward(kern, q, k, v, q_pos, k_pos, q_seg, k_seg, out, lse, dout, *, mask):
    """``kern.backward`` of the flat arrays, given the final ``out``, ``lse`` and ``dout``:
    ``(dq, dk, dv)``."""
    ct = Cotangent.of(out, lse, dout)
    return kern.backward(QueryBlock(q, q_pos, q_seg), KVBlock(k, v, k_pos, k_seg), ct, mask=mask)
