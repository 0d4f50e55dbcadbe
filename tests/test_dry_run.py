"""``train.dry_run=true``: the run is validated and its memory checked for the hardware preset's
device count (128 TPU 7 TensorCores for the 14M recipe) on this CPU machine, without devices."""

import io
import json
import pathlib
import subprocess
import sys

import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
GiB = 2**30


def _config(*overrides):
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="lcx.conf", version_base="1.3"):
        return compose(config_name="config", overrides=["train.dry_run=true", *overrides])


@pytest.fixture
def no_devices(monkeypatch):
    """A dry run must not ask JAX for a device (a TPU slice's count is not this machine's)."""

    def refuse(*a, **k):
        raise AssertionError("the dry run asked JAX for its devices")

    for name in ("devices", "local_devices", "device_count", "process_index"):
        monkeypatch.setattr(jax, name, refuse)


def _dry_run(cfg, tmp_path):
    from lcx.config import run_config
    from lcx.training.preflight import dry_run

    out = io.StringIO()
    report = dry_run(run_config(cfg), tmp_path, file=out)
    return report, out.getvalue()


@pytest.mark.parametrize(
    "experiment,n,seq,local,hbm",
    [
        ("longctx_14m_tpu7", 128, 14_680_064, 114_688, 96.00),
        ("longctx_4m_v5p", 64, 4_194_304, 65_536, 95.00),
    ],
)
def test_published_recipes_pass_at_their_chip_counts(experiment, n, seq, local, hbm, tmp_path, no_devices):
    report, text = _dry_run(_config(f"experiment={experiment}"), tmp_path)
    assert report.n_devices == n and report.fits is True and report.memory_checked is True
    assert f"{seq:,} tokens" in text and f"{local:,} tokens per device" in text
    assert f"against: HBM {hbm:.2f} GiB per device" in text
    assert text.rstrip().endswith("nothing was compiled and no device was used")
    # the anatomy lists every component, with where it lives
    for row in (
        "parameters",
        "gradients",
        "optimizer state",
        "saved activations",
        "block backward",
        "attention backward",
        "logits",
    ):
        assert f"  {row} " in text, row
    m = report.memory_bytes_per_device
    assert 0 < m["total"] <= hbm * GiB and m["host"] <= report.host_limit_bytes
    host = report.host_parts_bytes_per_device
    assert sum(host.values()) == m["host"] and host["activations"] > 0  # block inputs + context offloaded
    assert report.policy["vocab_tiling"] == 16 and local % 16 == 0
    assert json.loads((tmp_path / "dry_run.json").read_text())["n_devices"] == n


def test_14m_recipe_offloads_its_state_to_host(tmp_path, no_devices):
    report, text = _dry_run(_config("experiment=longctx_14m_tpu7"), tmp_path)
    host = report.host_parts_bytes_per_device
    assert report.policy["offload_optimizer"] and report.policy["offload_params"]
    assert host["parameters"] > 0 and host["optimizer"] == 2 * host["parameters"]
    assert "  parameters          host" in text and "  optimizer state     host" in text


def test_cpu_dry_run_validates_the_simulated_devices(tmp_path, no_devices, monkeypatch):
    import lcx.cost

    monkeypatch.setattr(lcx.cost, "host_memory_available", lambda: (16 * GiB, "test"))
    report, text = _dry_run(_config(), tmp_path)
    assert report.n_devices == 8 and report.fits is True
    assert "x 8 simulated devices" in text and "16,384.00 MiB available (test)" in text
    # a mesh for another device count is refused as a real run would refuse it
    from lcx.sharding import PlanError

    with pytest.raises(PlanError, match="has 4 devices but 8 are available"):
        _dry_run(_config("plan.mesh.data=2", "plan.mesh.context=2"), tmp_path)


def test_tiling_that_does_not_divide_the_local_sequence_names_the_nearest(tmp_path, no_devices):
    # 14,680,064 / 128 = 114,688 = 2^14 x 7 local tokens: 15 does not divide it, 14 and 16 do
    with pytest.raises(
        ValueError,
        match=r"memory.vocab_tiling=15 does not divide the local sequence of 114,688 "
        r"tokens .*nearest valid N is 14 \(valid neighbours: 14, 16\): use "
        r"memory.vocab_tiling=14",
    ):
        _dry_run(_config("experiment=longctx_14m_tpu7", "memory.vocab_tiling=15"), tmp_path)


def test_untiled_logits_are_refused_with_a_tiling_hydra_accepts(tmp_path, no_devices):
    from lcx.config import run_config
    from lcx.training.preflight import resolve

    cfg = _config("experiment=longctx_14m_tpu7", "memory.vocab_tiling=1")
    with pytest.raises(
        ValueError,
        match=r"does not fit: .* GiB of HBM per device, but hardware.hbm_bytes is "
        r"96.00 GiB; the largest part is logits .*use vocabulary tiling "
        r"\(memory.vocab_tiling=(\d+): .*then it fits\)",
    ) as e:
        _dry_run(cfg, tmp_path)
    n = int(str(e.value).split("memory.vocab_tiling=")[1].split(":")[0])
    assert 114_688 % n == 0
    # the advice is an override the config accepts, and with it the check passes
    resolve(run_config(_config("experiment=longctx_14m_tpu7", f"memory.vocab_tiling={n}")), 128, local_devices=128)


def test_state_advice_offers_only_offloads_that_lower_the_estimate(tmp_path, no_devices):
    # Llama 3.1 8B on one v5p chip: parameters, gradients and AdamW state alone exceed 95 GiB
    cfg = _config(
        "model=llama3_1_8b",
        "hardware=tpu_v5p",
        "hardware.chips=1",
        "plan=ring_cp",
        "train.seq_len=4096",
        "train.global_batch=1",
    )
    with pytest.raises(
        ValueError,
        match=r"the parameters, gradients and AdamW state alone need .* use host offload "
        r"of the optimizer \(memory.offload_optimizer=true: ",
    ) as e:
        _dry_run(cfg, tmp_path)
    from lcx.config import run_config
    from lcx.training.memory import memory_check

    config = run_config(cfg)
    t = config.train
    kw = dict(seq_len=t.seq_len, global_batch=t.global_batch, hardware=config.hardware, memory=config.memory)
    base = memory_check(config.model, config.plan, 1, **kw)
    for key in ("offload_optimizer", "offload_params"):
        import dataclasses

        c = memory_check(config.model, config.plan, 1, **kw, policy=dataclasses.replace(base.policy, **{key: True}))
        assert (f"memory.{key}=true" in str(e.value)) == (c.need < base.need), key


def test_accelerator_preset_without_chips_is_refused(tmp_path, no_devices):
    with pytest.raises(
        ValueError,
        match=r"train.dry_run=true with hardware=tpu7 needs the slice's size: set "
        r"hardware.chips=<chips>",
    ):
        _dry_run(_config("hardware=tpu7", "plan=ring_cp"), tmp_path)


def _cli(tmp_path, *overrides):
    return subprocess.run(
        [sys.executable, "-m", "lcx.train", "train.dry_run=true", f"hydra.run.dir={tmp_path}", *overrides],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_cli_dry_run_of_the_14m_recipe_exits_0_on_this_cpu_machine(tmp_path):
    r = _cli(tmp_path, "experiment=longctx_14m_tpu7")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tpu7 x 64 chips = 128 devices" in r.stdout and "the cost ledger says the step fits" in r.stdout
    assert "JAX found no accelerator" not in r.stderr and not (tmp_path / "metrics.jsonl").exists()


def test_cli_dry_run_that_does_not_fit_exits_2_with_one_line(tmp_path):
    r = _cli(tmp_path, "experiment=longctx_4m_v5p", "memory.vocab_tiling=1")
    assert r.returncode == 2, r.stderr[-2000:]
    err = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert len(err) == 1 and "model=llama3_1_8b_longctx does not fit" in err[0] and "memory.vocab_tiling=" in err[0]
    assert "memory anatomy per device" in r.stdout  # what it judged, printed before the verdict
    r = _cli(tmp_path, "train.dry_run=yes")
    assert r.returncode == 2 and "train.dry_run='yes': must be true or false" in r.stderr


def test_a_host_overflow_names_the_largest_host_part(tmp_path, no_devices):
    # 4 sequences of the 4M recipe: the offloaded block inputs and contexts overflow the host share
    with pytest.raises(
        ValueError,
        match=r"of offloaded bytes per device, but its share of host memory is .*"
        r"the largest part is activations offloaded to host",
    ):
        _dry_run(_config("experiment=longctx_4m_v5p", "train.global_batch=4"), tmp_path)
