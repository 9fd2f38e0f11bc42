"""Copies between the GPU and the host state never straddle the edge of a page-locked range.

pin_units registers a streamed unit's moments from the page the unit starts on; that page may hold the end of
the unit before it, which the GPUs update (device_layers). A CUDA copy of that unit spanning registered and
unregistered pages fails (cudaErrorInvalidValue: seen on the GPU edge-update exactness test once AutoPolicy
streamed the layers after the device layers), so DeviceUpdate copies a unit in the pieces dma_pieces gives."""
from types import SimpleNamespace

import torch
from slidedp.step.device_update import DeviceUpdate
from slidedp.step.host_state import split_at


def test_split_at_cuts_at_every_edge_inside_the_view_only():
    base, size = 4096, 4
    assert split_at(base, 10, size, set()) == [(0, 10)]
    # edges at the view's start and end, or outside it, cut nothing
    assert split_at(base, 10, size, {base, base + 40, 0, base + 4000}) == [(0, 10)]
    assert split_at(base, 10, size, {base + 12}) == [(0, 3), (3, 10)]
    assert split_at(base, 10, size, {base + 32, base + 12, base + 32}) == [(0, 3), (3, 8), (8, 10)]


class _State:
    """A host state of two 8-element units whose flat moments have a registration edge 3 elements into unit 1."""

    def __init__(self):
        self.master = torch.zeros(16)
        self.exp_avg = torch.zeros(16)
        self.exp_avg_sq = torch.zeros(16)
        self.delivery = self.master
        self.edge = self.exp_avg.data_ptr() + 11 * 4
        self.asked = []

    def _unit(self, t, u):
        return t[8 * u : 8 * u + 8]

    def master_unit(self, u):
        return self._unit(self.master, u)

    def exp_avg_unit(self, u):
        return self._unit(self.exp_avg, u)

    def exp_avg_sq_unit(self, u):
        return self._unit(self.exp_avg_sq, u)

    def dma_pieces(self, view):
        self.asked.append(view.data_ptr())
        return split_at(view.data_ptr(), view.numel(), view.element_size(), {self.edge})


def test_device_update_copies_units_in_pieces_that_respect_the_edges():
    upd = object.__new__(DeviceUpdate)
    upd.state = _State()
    upd.units = [1]
    upd.shards = SimpleNamespace(own_range=lambda u: (0, 8))
    upd.master = {1: torch.arange(8.0)}
    upd.exp_avg = {1: torch.arange(8.0) + 10}
    upd.exp_avg_sq = {1: torch.arange(8.0) + 20}
    pieces = []
    real = upd._copy

    def spy(dst, src, host):
        pieces.append(upd.state.dma_pieces(host))
        real(dst, src, host)

    upd._copy = spy
    upd.write_back()
    assert torch.equal(upd.state.exp_avg[8:], torch.arange(8.0) + 10)
    assert torch.equal(upd.state.exp_avg_sq[8:], torch.arange(8.0) + 20)
    assert torch.equal(upd.state.master[8:], torch.arange(8.0))
    assert [(0, 3), (3, 8)] in pieces  # the exp_avg copy was cut where the registration starts
