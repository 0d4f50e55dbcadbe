"""Context-parallel attention: masks, per-device kernels, strategies (allgather, a2a, ring, usp)."""

from lcx.attention.api import attention as attention
from lcx.attention.masks import CAUSAL as CAUSAL, FULL as FULL, Mask as Mask
from lcx.attention.reference import reference_attention as reference_attention
