"""Fixtures the planner tests share: the nvidia-h200-x2 machine's topology and calibration
(tests/runtime/fixtures/h200x2_*.json)."""

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
