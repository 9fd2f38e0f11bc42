"""Fixtures the planner tests share: the nvidia-h200-x2 machine's topology and calibration
(tests/runtime/fixtures/h200x2_*.json), and the one-H200 machine's (h200x1_*.json)."""

import json
import os

import pytest

FIX = os.path.join(os.path.dirname(__file__), "fixtures")


@pytest.fixture(scope="module")
def x2():
    """(topologies by link kind, calibrations by shape) of the two-H200 machine; fresh per test module."""
    with open(os.path.join(FIX, "h200x2_topology.json")) as fh:
        topo = json.load(fh)
    with open(os.path.join(FIX, "h200x2_calibration.json")) as fh:
        cal = json.load(fh)
    return topo, cal


@pytest.fixture(scope="module")
def one_h200():
    """(topology, calibrations by shape) of the one-H200 machine, from its measured runs; fresh per test module."""
    with open(os.path.join(FIX, "h200x1_measured_hbm.json")) as fh:
        cals = json.load(fh)
    with open(os.path.join(FIX, "h200x1_qwen3-1.7b.json")) as fh:
        topo = json.load(fh)["topology"]
    return topo, cals
