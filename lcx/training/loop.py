"""The training loop: validate the plan, build data, model and optimizer, train, log, evaluate.

Everything that can be wrong with the configuration (plan vs devices, model and batch; data
paths; sequence length) is checked before anything compiles.
"""

from __future__ import annotations

import json
import math
import pathlib
import time
from typing import Any

import equinox as eqx
import jax
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from lcx.cost import hardware_from_config, training_flops
from lcx.data import make_data
from lcx.models import ModelConfig, init_model, model_shardings
from lcx.sharding import MeshPlan, bind
from lcx.sharding.config import plan_from_config
from lcx.training.optim import make_optimizer
from lcx.training.runinfo import run_info
from lcx.training.step import init_opt_state, make_steps, put_batch


def setup(cfg: DictConfig, devices=None) -> dict[str, Any]:
    """Resolve and validate everything a run needs, before compiling anything.

    Returns a dict with ``plan`` (MeshPlan), ``model_cfg``, ``devices``.

    Raises:
      PlanError / ValueError: an invalid plan, model, batch or sequence configuration, with a
        message that names the value and the fix.
    """
    devices = list(jax.devices() if devices is None else devices)
    plan = plan_from_config(cfg.plan)
    model_cfg = ModelConfig.from_dict(OmegaConf.to_container(cfg.model, resolve=True))
    plan.validate(
        len(devices), dims=model_cfg.dims(), seq_len=int(cfg.train.seq_len), global_batch=int(cfg.train.global_batch)
    )
    return {"plan": bind(plan, devices), "model_cfg": model_cfg, "devices": devices}


def train(cfg: DictConfig, run_dir: str | pathlib.Path, devices=None) -> dict[str, Any]:
    """Train as configured; write ``metrics.jsonl`` and ``run_info.json`` in ``run_dir``.

    Returns:
      Summary dict: ``losses`` (per step), ``val_loss`` (last), ``final_loss``, ``params``
      (final parameters, for tests), ``run_dir``.
    """
    run_dir = pathlib.Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    t = cfg.train
    ctx = setup(cfg, devices)
    mp: MeshPlan = ctx["plan"]
    model_cfg = ctx["model_cfg"]
    devices = ctx["devices"]
    data = make_data(
        cfg.data,
        seq_len=int(t.seq_len),
        global_batch=int(t.global_batch),
        layout=mp.plan.attention.layout,
        context_degree=mp.context_degree,
        seed=int(t.seed),
    )
    hw = hardware_from_config(cfg.hardware, len(devices))
    flops = training_flops(model_cfg, int(t.seq_len), int(t.global_batch), window=model_cfg.sliding_window)

    info = run_info(devices)
    info["config"] = OmegaConf.to_container(cfg, resolve=True)
    info["plan"] = repr(mp.plan)
    info["mesh"] = dict(mp.mesh.shape)
    info["peak_flops_per_device"] = hw.peak_flops_per_device
    info["model_flops_per_step"] = flops.total
    (run_dir / "run_info.json").write_text(json.dumps(info, indent=2, default=str))

    key = jax.random.key(int(t.seed))
    abstract = eqx.filter_eval_shape(init_model, model_cfg, key=key)
    p_shard = model_shardings(abstract, mp)
    _, static = eqx.partition(abstract, eqx.is_array)
    params = jax.jit(lambda k: eqx.filter(init_model(model_cfg, key=k), eqx.is_array), out_shardings=p_shard)(key)
    optimizer, schedule = make_optimizer(
        lr=float(t.lr),
        steps=int(t.steps),
        warmup_steps=int(t.warmup_steps) if t.warmup_steps is not None else max(1, int(t.steps) // 10),
        min_lr_ratio=float(t.min_lr_ratio),
        weight_decay=float(t.weight_decay),
        b1=float(t.b1),
        b2=float(t.b2),
        grad_clip=float(t.grad_clip),
    )
    steps = make_steps(eqx.combine(params, static), optimizer, mp, p_shard)
    opt_state = init_opt_state(optimizer, params, steps.opt_shardings)

    first = put_batch(next(data.train), steps.batch_sharding)
    t0 = time.perf_counter()
    train_c = steps.train.lower(params, opt_state, first).compile()
    compile_s = time.perf_counter() - t0
    mem = train_c.memory_analysis()
    temp_bytes = getattr(mem, "temp_size_in_bytes", None) if mem is not None else None

    tokens_per_step = int(t.seq_len) * int(t.global_batch)
    peak_total = hw.peak_flops_per_device * len(devices)
    metrics_path = run_dir / "metrics.jsonl"
    losses: list[float] = []
    val_loss = None
    log_every = max(1, int(t.log_every))
    eval_every = int(t.eval_every)
    with metrics_path.open("w") as mf, tqdm(total=int(t.steps), desc=f"train[{mp.plan.name}]", unit="step") as bar:
        batch = first
        for step in range(1, int(t.steps) + 1):
            ts = time.perf_counter()
            params, opt_state, m = train_c(params, opt_state, batch)
            loss = float(m["loss"])  # blocks: the step time below is the whole step
            dt = time.perf_counter() - ts
            if not math.isfinite(loss):
                raise FloatingPointError(
                    f"non-finite loss {loss} at step {step}; grad_norm={float(m['grad_norm'])}. "
                    "Lower train.lr or check the data"
                )
            losses.append(loss)
            if step < int(t.steps):
                batch = put_batch(next(data.train), steps.batch_sharding)
            rec = {
                "step": step,
                "loss": loss,
                "tokens_per_sec": tokens_per_step / dt,
                "mfu": flops.total / dt / peak_total,
                "step_time_s": dt,
                "lr": float(schedule(step - 1)),
                "grad_norm": float(m["grad_norm"]),
                "valid_tokens": float(m["tokens"]),
            }
            if step == 1:
                rec["compile_s"] = compile_s
                rec["temp_bytes_per_device"] = temp_bytes
            if eval_every > 0 and (step % eval_every == 0 or step == int(t.steps)):
                val_loss = evaluate(steps, params, data.val_batches(int(t.eval_batches)))
                rec["val_loss"] = val_loss
            if step % log_every == 0 or "val_loss" in rec or step == int(t.steps):
                mf.write(json.dumps(rec) + "\n")
                mf.flush()
            post = {"loss": f"{loss:.3f}", "tok/s": f"{rec['tokens_per_sec']:.0f}"}
            if val_loss is not None:
                post["val"] = f"{val_loss:.3f}"
            bar.set_postfix(post)
            bar.update(1)
    return {
        "losses": losses,
        "final_loss": losses[-1],
        "val_loss": val_loss,
        "params": params,
        "static": static,
        "run_dir": str(run_dir),
        "compile_s": compile_s,
    }


def evaluate(steps, params, batches) -> float:
    """Validation loss in nats/token: global sum over all batches / global valid-token count."""
    total, count = 0.0, 0.0
    for b in batches:
        s, c = steps.evaluate(params, put_batch(b, steps.batch_sharding))
        total += float(s)
        count += float(c)
    if count == 0:
        raise ValueError("validation set has no valid tokens; raise data.val_fraction")
    return total / count

