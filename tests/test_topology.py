"""The TPU torus shape of a slice, whole sub-tori, and the all-to-all term they switch on."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest
from omegaconf import OmegaConf

from lcx import cost
from lcx.cost import ActivationPolicy
from lcx.cost.local import StepSizes
from lcx.cost.search import strategy_meshes
from lcx.cost.topology import is_subtorus, slice_topology
from lcx.models.presets import preset
from lcx.sharding import AttentionConfig, Plan

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _hw(name):
    return cost.hardware_from_config(OmegaConf.load(ROOT / "conf" / "hardware" / f"{name}.yaml"), probe=False)


@pytest.mark.parametrize(
    "chips, shape",
    # cloud.google.com/tpu/docs/v5p topologies: v5p-128 (64 chips) 4x4x4, v5p-256 4x4x8, v5p-512 4x8x8,
    # v5p-1024 8x8x8, v5p-2048 8x8x16
    [(64, (4, 4, 4)), (128, (4, 4, 8)), (256, (4, 8, 8)), (512, (8, 8, 8)), (1024, (8, 8, 16))],
)
def test_slice_topology_is_the_published_torus(chips, shape):
    assert slice_topology(chips, 4) == shape


@pytest.mark.parametrize("chips", [1, 8, 32, 96, 100])
def test_a_sub_cube_or_ragged_slice_has_no_standard_torus(chips):
    assert slice_topology(chips, 4) is None


@pytest.mark.parametrize(
    "group, physical, whole",
    [
        (4, (4, 4, 4), True),
        (16, (4, 4, 4), True),
        (64, (4, 4, 4), True),
        (8, (4, 4, 4), False),  # half of one ring times another: splits a physical axis
        (2, (4, 4, 4), False),
        (32, (4, 4, 4), False),
        (8, (4, 4, 8), True),
        (2, (4, 4, 4, 2), True),  # TPU7's two cores per chip
        (1, (4, 4, 4), True),
    ],
)
def test_is_subtorus(group, physical, whole):
    assert is_subtorus(group, physical) is whole


def test_physical_mesh_adds_the_core_axis_and_refuses_a_wrong_topology():
    v5p, tpu7 = _hw("tpu_v5p"), _hw("tpu7")
    assert v5p.physical_mesh(64) == (4, 4, 4)
    assert tpu7.physical_mesh(128) == (4, 4, 4, 2)
    assert _hw("cpu").physical_mesh(8) is None
    assert dataclasses.replace(v5p, topology=(2, 4, 8)).physical_mesh(64) == (2, 4, 8)
    with pytest.raises(ValueError, match=r"hardware.topology=\[4, 4, 8\] holds 128 chips, but the step uses 64"):
        dataclasses.replace(v5p, topology=(4, 4, 8)).physical_mesh(64)
    with pytest.raises(ValueError, match=r"hardware.topology=\[4, 0, 4\] must list positive"):
        dataclasses.replace(v5p, topology=(4, 0, 4))


def _usp_estimate(hw, ulysses):
    """Llama 3.1 8B, 64 v5p chips, USP with ``ulysses`` x (64 / ulysses), at 64K tokens (MaxText PR #4893)."""
    cfg = preset("llama3_1_8b")
    (sm,) = [sm for s, sm in strategy_meshes(1, 64) if s == "usp" and dict(sm.mesh).get("ulysses") == ulysses]
    names = tuple(m for m, _ in sm.mesh)
    att = dataclasses.replace(AttentionConfig(strategy="usp", kernel="splash", layout="zigzag"), **dict(sm.attention))
    plan = Plan(
        mesh=sm.mesh, params=(("embed", names),), activations=(("batch", "data"), ("seq", sm.seq)), attention=att
    )
    S, B = 65536, 1
    plan.validate(64, dims=cfg.dims(), seq_len=S, global_batch=B)
    pol = ActivationPolicy(remat="full")
    return cost.estimate(cfg, plan, hw, 64, policy=pol, **StepSizes.of_model(cfg, S, B).args())


@pytest.mark.parametrize("ulysses, split", [(8, True), (16, False), (4, False), (32, True)])
def test_only_an_all_to_all_that_splits_a_torus_axis_pays_the_split_cost(ulysses, split):
    hw = _hw("tpu_v5p")
    tm = hw.time_model
    assert tm is not None and tm.split_all_to_all_s > 0
    e = _usp_estimate(hw, ulysses)
    flat = _usp_estimate(dataclasses.replace(hw, torus_cube=None), ulysses)  # no torus known: no split
    assert e.work.a2a_split_axis is split
    assert not flat.work.a2a_split_axis
    extra = e.work.a2a_collectives * tm.split_all_to_all_s if split else 0.0
    assert e.time.total == pytest.approx(flat.time.total + extra, rel=1e-9)
    assert e.work.a2a_collectives > 0
