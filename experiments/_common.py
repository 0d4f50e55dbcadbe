"""Shared helpers of the experiment scripts: compose an ``experiment=`` config, launch its Hydra
multirun, find run directories, read ``metrics.jsonl`` / ``run_info.json``, write CSVs.

Every script in ``experiments/`` is ``python experiments/<name>.py``: it runs the experiment
(usually ``python -m lcx.train -m experiment=<name>`` in a subprocess, so the device count is
fixed by Hydra's first job exactly as a user's multirun would), then gathers the run directories
into ``experiments/results/<name>.csv`` and ``.png``. ``--runs DIR`` gathers existing runs only.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
MIB = 2**20


def compose(experiment: str | None = None, overrides: Sequence[str] = (), config_name: str = "config"):
    """The training config of ``experiment=<experiment>`` plus ``overrides`` (no run)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    from lcx.config import register

    register()  # the schemas the YAML tree refers to (plan/schema, schema/*)

    ov = ([f"experiment={experiment}"] if experiment else []) + list(overrides)
    with initialize_config_module("lcx.conf", version_base="1.3"):
        return hydra_compose(config_name, overrides=ov)  # ${hydra:...} values stay unresolved


def new_sweep_dir(name: str) -> pathlib.Path:
    """``multirun/<name>/<timestamp>`` under the repository root (git-ignored)."""
    return ROOT / "multirun" / name / datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def latest_sweep_dir(name: str) -> pathlib.Path:
    """The newest ``multirun/<name>/*`` directory.

    Raises:
      FileNotFoundError: none exists (run the experiment first).
    """
    base = ROOT / "multirun" / name
    dirs = sorted(p for p in base.glob("*") if p.is_dir()) if base.exists() else []
    if not dirs:
        raise FileNotFoundError(f"no runs under {base}; run `python experiments/{name}.py` first")
    return dirs[-1]


def run_multirun(experiment: str, sweep_dir: pathlib.Path, overrides: Sequence[str] = ()) -> None:
    """``python -m lcx.train -m experiment=<experiment> hydra.sweep.dir=<sweep_dir> <overrides>``.

    Raises:
      subprocess.CalledProcessError: a job failed (Hydra stops the sweep at the first failure).
    """
    run_command(
        [
            sys.executable,
            "-m",
            "lcx.train",
            "-m",
            f"experiment={experiment}",
            f"hydra.sweep.dir={sweep_dir}",
            *overrides,
        ]
    )


def run_command(cmd: Sequence[str]) -> None:
    """Print ``cmd`` and run it from the repository root.

    Raises:
      subprocess.CalledProcessError: it failed.
    """
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run(list(cmd), cwd=ROOT, check=True)


def ruler_eval(
    ckpt: pathlib.Path,
    out: pathlib.Path,
    *,
    tasks: Sequence[str],
    lengths: Sequence[int],
    depths: Sequence[float],
    per_depth: int,
    perplexity_docs: int,
    extra: Sequence[str] = (),
) -> pathlib.Path:
    """``python -m lcx.eval eval=ruler`` of ``ckpt`` into the run directory ``out`` (``extra``:
    more overrides), unless ``out/ruler.json`` exists (an earlier call on the same directory)."""
    if not (out / "ruler.json").is_file():
        run_command(
            [
                sys.executable,
                "-m",
                "lcx.eval",
                "eval=ruler",
                f"checkpoint.dir={ckpt}",
                f"eval.tasks=[{','.join(tasks)}]",
                f"eval.lengths=[{','.join(str(s) for s in lengths)}]",
                f"eval.depths=[{','.join(str(d) for d in depths)}]",
                f"eval.per_depth={per_depth}",
                f"eval.perplexity_docs={perplexity_docs}",
                *extra,
                f"hydra.run.dir={out}",
            ]
        )
    return out


def read_jsonl(path: pathlib.Path) -> list[dict[str, Any]]:
    """Records of a ``metrics.jsonl`` (a line cut short by a crash ends the list)."""
    out = []
    for line in pathlib.Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            break
    return out


def load_runs(sweep_dir: pathlib.Path) -> list[dict[str, Any]]:
    """Every run directory under ``sweep_dir`` holding a ``metrics.jsonl`` (searched recursively).

    Returns:
      dicts with ``dir`` (Path), ``metrics`` (list of records), ``info`` (``run_info.json``, {} if
      absent) and ``config`` (the resolved config from ``run_info.json``, else Hydra's
      ``.hydra/config.yaml``), sorted by directory name.
    """
    runs = []
    for m in sorted(pathlib.Path(sweep_dir).rglob("metrics.jsonl")):
        d = m.parent
        info = json.loads((d / "run_info.json").read_text()) if (d / "run_info.json").exists() else {}
        cfg = info.get("config")
        if cfg is None and (d / ".hydra" / "config.yaml").exists():
            from omegaconf import OmegaConf

            cfg = OmegaConf.to_container(OmegaConf.load(d / ".hydra" / "config.yaml"), resolve=False)
        runs.append({"dir": d, "metrics": read_jsonl(m), "info": info, "config": cfg or {}})
    return runs


def summarize(metrics: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-run numbers from ``metrics.jsonl`` records.

    ``tokens_per_sec`` and ``step_time_s`` are medians over the steps after the first (the first
    includes warm-up), or the first step's if there is only one; ``final_loss`` is the last
    step's loss; ``temp_mib_per_device`` and ``compile_s`` come from the first record.
    """
    if not metrics:
        return {}
    steady = [r for r in metrics if r.get("step", 0) > metrics[0]["step"]] or list(metrics)
    first = metrics[0]
    temp = first.get("temp_bytes_per_device")
    vals = [r["val_loss"] for r in metrics if r.get("val_loss") is not None]
    return {
        "steps": metrics[-1]["step"],
        "tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in steady),
        "step_time_s": statistics.median(r["step_time_s"] for r in steady) if "step_time_s" in first else math.nan,
        "mfu": statistics.median(r["mfu"] for r in steady) if "mfu" in first else math.nan,
        "first_loss": first["loss"],
        "final_loss": metrics[-1]["loss"],
        "val_loss": vals[-1] if vals else math.nan,
        "temp_mib_per_device": temp / MIB if temp is not None else math.nan,
        "compile_s": first.get("compile_s", math.nan),
    }


def out_file(stem: pathlib.Path, ext: str) -> pathlib.Path:
    """The result file ``--out stem`` names for extension ``ext`` (``".csv"``, ``".png"``): the
    extension appended, so a stem with a dot keeps it (``run.v2`` -> ``run.v2.csv``, where
    ``with_suffix`` would write ``run.csv`` over another run's); a stem already ending in a result
    extension drops it first (``run.csv`` -> ``run.csv``, ``run.png``)."""
    if stem.suffix in (".csv", ".png"):
        stem = stem.with_suffix("")
    return stem.parent / f"{stem.name}{ext}"


def write_csv(rows: Iterable[Mapping[str, Any]], path: pathlib.Path) -> pathlib.Path:
    """Write ``rows`` (dicts with the same keys) to ``path``; floats with 10 significant digits."""
    rows = list(rows)
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.10g}" if isinstance(v, float) else v) for k, v in r.items()})
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} ({len(rows)} rows)")
    return path


def read_csv(path: pathlib.Path) -> list[dict[str, str]]:
    with pathlib.Path(path).open() as f:
        return list(csv.DictReader(f))


def rel(p: pathlib.Path) -> str:
    """``p`` relative to the repository root where possible (CSV cells stay machine-independent)."""
    p = pathlib.Path(p).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def pyplot():
    """matplotlib's pyplot with the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: pathlib.Path) -> pathlib.Path:
    """Lay out, write ``path`` (PNG, 110 dpi), close ``fig`` and say where it went."""
    plt = pyplot()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {rel(path)}")
    return path


def provenance(info: Mapping[str, Any]) -> dict[str, str]:
    """What a result row records about the run that made it (never a local path): the lcx git
    commit (12 hex digits, ``+dirty`` when files differed from it), the Python and jax versions,
    from the run's ``run_info.json`` (``{}`` gives ``unrecorded``)."""
    commit = info.get("git_commit") or "unrecorded"
    if commit != "unrecorded":
        commit = commit[:12] + ("+dirty" if info.get("git_dirty") else "")
    return {
        "git_commit": commit,
        "python": info.get("python") or "unrecorded",
        "jax": (info.get("packages") or {}).get("jax") or "unrecorded",
    }


def machine_note(info: Mapping[str, Any] | None = None) -> str:
    """One line naming where the numbers were measured (for plot titles and CSV readers)."""
    import platform

    n = os.cpu_count()
    jax_v = (info or {}).get("packages", {}).get("jax") if info else None
    return f"{platform.machine()} CPU, {n} cores" + (f", jax {jax_v}" if jax_v else "")
