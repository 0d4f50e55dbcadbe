"""Ledger vs XLA: per-device memory predicted by lcx.cost against the compiled train step.

For a tiny Llama on 8 simulated CPU devices, every strategy (allgather, a2a, ring, usp) is
compiled with lcx.training's real train step (``jit(...).lower(...).compile()``, nothing runs)
and its ``memory_analysis()`` per-device footprint (arguments + outputs - aliased + temporaries)
is compared with ``lcx.cost.memory_breakdown``. Prints one row per strategy and exits non-zero
if any differs by more than 15%.

    python experiments/ledger_vs_compiled.py [--seq-len 4096] [--remat full]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import equinox as eqx  # noqa: E402
import numpy as np  # noqa: E402

from lcx import cost  # noqa: E402
from lcx.models import init_model, model_shardings  # noqa: E402
from lcx.models.config import preset  # noqa: E402
from lcx.sharding import bind  # noqa: E402
from lcx.sharding.config import preset as plan_preset  # noqa: E402
from lcx.training.optim import make_optimizer  # noqa: E402
from lcx.training.step import BATCH_KEYS, make_steps  # noqa: E402

PLANS = {
    "allgather": lambda: plan_preset("allgather").with_mesh(data=1, context=8),
    "a2a": lambda: plan_preset("a2a").with_mesh(data=1, context=8),
    "ring": lambda: plan_preset("ring").with_mesh(data=1, context=8),
    "usp": lambda: plan_preset("usp").with_mesh(data=1, ulysses=2, ring=4),
}


def compiled_bytes(cfg, plan, seq_len, batch):
    devices = jax.devices()[:8]
    mp = bind(plan, devices)
    key = jax.random.key(0)
    model = init_model(cfg, key=key)  # tiny: a few MiB; only its structure and shapes are used
    shard = model_shardings(model, mp)
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), eqx.filter(model, eqx.is_array))
    opt, _ = make_optimizer(lr=1e-3, steps=10, warmup_steps=1, min_lr_ratio=0.1, weight_decay=0.1, b1=0.9,
                            b2=0.95, grad_clip=1.0)
    steps = make_steps(model, opt, mp, shard)
    opt_state = jax.eval_shape(opt.init, params)
    b = {k: jax.ShapeDtypeStruct((batch, seq_len), np.int32) for k in BATCH_KEYS}
    b["loss_mask"] = jax.ShapeDtypeStruct((batch, seq_len), np.float32)
    c = steps.train.lower(params, opt_state, b).compile()
    m = c.memory_analysis()
    total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    return total, m


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--remat", default="full")
    ap.add_argument("--tolerance", type=float, default=0.15)
    args = ap.parse_args(argv)
    cfg = preset("tiny").replace(remat=args.remat)
    policy = cost.ActivationPolicy.from_model(cfg)
    print(f"tiny Llama, remat={args.remat}, S={args.seq_len}, B={args.batch}, 8 CPU devices, float32")
    print(f"{'strategy':10s} {'ledger MiB':>11s} {'compiled MiB':>13s} {'temp MiB':>9s} {'ratio':>6s}")
    worst = 0.0
    for name, make in PLANS.items():
        plan = make()
        mem = cost.memory_breakdown(cfg, plan, 8, seq_len=args.seq_len, global_batch=args.batch, policy=policy,
                                    dtype=cfg.dtype, param_dtype=cfg.param_dtype)
        got, m = compiled_bytes(cfg, plan, args.seq_len, args.batch)
        r = mem.total / got
        worst = max(worst, abs(r - 1))
        print(f"{name:10s} {mem.total / 2**20:11.2f} {got / 2**20:13.2f} {m.temp_size_in_bytes / 2**20:9.2f} {r:6.2f}")
    ok = worst <= args.tolerance
    print(f"worst relative difference {100 * worst:.1f}% ({'within' if ok else 'OUTSIDE'} {100 * args.tolerance:.0f}%)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
