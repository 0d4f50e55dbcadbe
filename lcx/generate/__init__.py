"""Context-parallel generation: prefill a batch of prompts under any plan, then decode.

The prompt and the KV cache are sharded over the plan's context axes exactly as a training batch
is (its layout, strategy per layer kind and kernel); a decode step attends each row's new query
to every device's own KV shard and merges the partial results by their logsumexp
(:func:`lcx.attention.merge_partials`), so greedy tokens equal single-device decoding. Layout of
the cache, its append rule (round robin over the devices) and the bounded rings of sliding and
chunked layers: :mod:`lcx.generate.cache`.

Public API:

- :func:`generate`: ``generate(model, prompts, *, plan, max_new_tokens, temperature=0.0,
  top_p=1.0, key=None, eos_id=None)`` -> int32 ``[B, max_new_tokens]``.
- :func:`prefill` / :func:`decode_step` (MaxText maxengine's split), :class:`DecodeState`,
  :class:`Prefilled`, :class:`KVCache`, :class:`CacheLayout` and :func:`cache_layout`.
- :func:`cache_bytes_per_device`: the ledger of the cache's bytes on one device.
- :func:`sample`: greedy, temperature and top-p sampling.

CLI: ``python -m lcx.generate checkpoint.dir=D generate.prompts=[...]`` (:mod:`lcx.generate.__main__`).
"""

from lcx.generate.cache import CacheGroup, CacheLayout, KVCache, cache_bytes_per_device, cache_layout
from lcx.generate.engine import DecodeState, Prefilled, decode_step, generate, prefill
from lcx.generate.sampling import sample

__all__ = [
    "CacheGroup",
    "CacheLayout",
    "cache_bytes_per_device",
    "cache_layout",
    "decode_step",
    "DecodeState",
    "generate",
    "KVCache",
    "prefill",
    "Prefilled",
    "sample",
]
