"""The ``cpu`` preset's probed time model (lcx.cost.probes) and experiments/step_time_cpu.py,
with the probes stubbed: nothing here measures the machine."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
from omegaconf import OmegaConf

from lcx.cost import hardware as hwmod
from lcx.cost import hardware_from_config, probes
from lcx.cost.timing import TimeModel

ROOT = pathlib.Path(__file__).resolve().parent.parent
STUB = probes.Probes(
    n_devices=8,
    host_peak_flops=64e9,
    linear_efficiency=0.5,
    attention_efficiency=0.25,
    kernel_call_s=1e-4,
    collective_latency_s=2e-4,
    bandwidth_per_device=1e9,
    step_overhead_s=3e-3,
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty probe cache, the host peak fixed, and every measurement counted in ``calls``."""
    monkeypatch.setenv("LCX_CACHE", str(tmp_path))
    monkeypatch.setattr(hwmod, "cpu_peak_flops", lambda *a, **k: STUB.host_peak_flops)
    calls: list[int] = []

    def measure(n):
        calls.append(n)
        return STUB

    monkeypatch.setattr(probes, "measure_in_subprocess", measure)
    return calls


def cpu_node(**time_model):
    node = OmegaConf.load(ROOT / "conf" / "hardware" / "cpu.yaml")
    if time_model:
        node.time_model = time_model
    return node


def test_cpu_preset_asks_for_probes():
    assert OmegaConf.to_container(cpu_node().time_model)["probe"] is True


def test_probed_preset_builds_a_time_model_once(cache):
    hw = hardware_from_config(cpu_node(), 8, probe_time_model=True)
    tm = hw.time_model
    assert isinstance(tm, TimeModel)
    assert tm.attention_efficiency == {"xla": 0.25}
    assert tm.linear_efficiency == 0.5
    assert (tm.kernel_call_s, tm.collective_latency_s, tm.step_overhead_s) == (1e-4, 2e-4, 3e-3)
    assert tm.ring_overlap == 0.0  # host copies on the compute's cores hide behind nothing
    assert hw.peak_flops_per_device == STUB.host_peak_flops / 8
    # one link per device: a collective's per-device bandwidth is the probed one
    assert hw.collective_bandwidth_per_device == hw.p2p_bandwidth_per_device == 1e9
    assert hardware_from_config(cpu_node(), 8, probe_time_model=True).time_model == tm
    assert cache == [8]  # measured once, then read from the cache
    data = json.loads((pathlib.Path(probes.cache_path())).read_text())
    assert any(k.endswith(f"probes-v{probes.PROBE_VERSION}-d8") for k in data)


def test_training_never_runs_the_time_model_probes(cache):
    """lcx.train reads the hardware without probe_time_model: only the (cached) peak."""
    hw = hardware_from_config(cpu_node(), 8)
    assert hw.time_model is None and cache == []


def test_probe_false_measures_nothing(cache, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("measured with probe=False")

    monkeypatch.setattr(hwmod, "cpu_peak_flops", boom)
    hw = hardware_from_config(cpu_node(), 8, probe=False)
    assert hw.time_model is None and hw.ici_bandwidth_per_chip is None
    assert cache == []


def test_time_model_keys_beside_probe_override_the_probes(cache):
    hw = hardware_from_config(cpu_node(probe=True, ring_overlap=0.5, linear_efficiency=0.9), 8, probe_time_model=True)
    assert hw.time_model is not None
    assert (hw.time_model.ring_overlap, hw.time_model.linear_efficiency) == (0.5, 0.9)
    assert hw.time_model.attention_efficiency == {"xla": 0.25}


def test_preset_bandwidth_wins_over_the_probe(cache):
    node = cpu_node()
    node.ici_bandwidth_per_chip = 5e9
    assert hardware_from_config(node, 8, probe_time_model=True).ici_bandwidth_per_chip == 5e9


def test_probe_on_a_tpu_preset_is_refused():
    node = OmegaConf.load(ROOT / "conf" / "hardware" / "tpu7.yaml")
    node.time_model = {"probe": True}
    with pytest.raises(ValueError, match="only the cpu preset"):
        hardware_from_config(node, 8, probe=False)


def test_efficiencies_above_one_are_capped():
    tm = probes.Probes(**{**STUB.__dict__, "linear_efficiency": 1.3}).time_model()
    assert tm.linear_efficiency == 1.0


def test_failed_probe_process_names_the_command(monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, stdout="", stderr="boom"))
    with pytest.raises(RuntimeError, match=r"(?s)lcx\.cost\.probes 8.*boom"):
        probes.measure_in_subprocess(8)


def test_step_time_cpu_gather_rank_and_csv(tmp_path, cache):
    sys.path.insert(0, str(ROOT / "experiments"))
    import _common as C
    import step_time_cpu as S

    hw = S.probed_cpu()
    base = C.compose(overrides=["hardware=cpu"])
    for model, strategy, seq_len, remat in S.grid()[:4]:  # tiny allgather/a2a x 2048/4096 x remat
        cfg = C.compose(
            overrides=[
                *S.MODELS[model],
                f"plan={strategy}",
                f"train.seq_len={seq_len}",
                f"model.remat={remat}",
                *S.COMMON,
            ]
        )
        d = tmp_path / S.run_name(model, strategy, seq_len, remat)
        d.mkdir()
        (d / "run_info.json").write_text(json.dumps({"config": OmegaConf.to_container(cfg, resolve=False)}))
        t = 1.0 + (seq_len == 4096) + 0.5 * (remat == "full")
        lines = [
            {"step": i, "loss": 1.0, "tokens_per_sec": 1.0, "step_time_s": t * (3 if i == 1 else 1)}
            for i in range(1, S.STEPS + 1)
        ]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert base.hardware.name == "cpu"
    rows = S.gather(tmp_path, hw)
    assert [r["measured_s"] for r in rows] == [1.0, 1.5, 2.0, 2.5]
    need = {"model", "strategy", "seq_len", "remat", "measured_s", "predicted_s", "roofline_s", "error"}
    assert need <= set(rows[0])
    for r in rows:
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
        assert r["predicted_s"] > r["roofline_s"]  # achieved rates below peak
    assert S.check(rows)[0].startswith("4 runs: median |error|")
    fake = [
        {"model": "m", "seq_len": 1, "remat": "none", "strategy": s, "measured_s": m, "predicted_s": p}
        for s, m, p in (("a", 1.0, 1.0), ("b", 1.1, 0.9), ("c", 2.0, 0.5))
    ]
    pairs = S.ranking(fake)
    assert [(p["faster"], p["slower"], p["same_order"]) for p in pairs] == [("a", "c", False), ("b", "c", False)]


def test_probes_beside_another_job_are_measured_again(cache, monkeypatch):
    shares = iter([0.5, 0.02, 0.0])
    calls = []

    def measure(n):
        calls.append(n)
        return probes.Probes(**{**STUB.__dict__, "foreign_share": next(shares)})

    p = probes.cpu_probes(8, measure=measure)
    assert (len(calls), p.foreign_share) == (2, 0.02)  # the quiet second try is kept
