"""Cached-gradient chunks add their parameter gradients in one operation, to what ``backward`` accumulates."""

from __future__ import annotations

import torch

from pgrank.training.grad_cache import add_gradients


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(6, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.shift = torch.nn.Parameter(torch.randn(4))  # gets the very tensor autograd gives ``other`` below
        self.other = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return self.norm(self.lin(x)) + self.shift + self.other


def _passes(seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 6, generator=g), torch.randn(5, 4, generator=g)) for _ in range(3)]


def test_added_gradients_equal_backward_accumulation():
    ours, theirs = _Net(), _Net()
    params = list(ours.parameters())
    for x, g in _passes(0):
        add_gradients(ours(x), g, params)
        theirs(x).backward(g)
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters()):
        assert torch.equal(a.grad, b.grad), name
        assert a.grad.stride() == a.stride(), name


def test_parameters_given_one_tensor_by_autograd_keep_gradients_of_their_own():
    net = _Net()
    add_gradients(net(torch.randn(5, 6)), torch.ones(5, 4), list(net.parameters()))
    assert net.shift.grad.data_ptr() != net.other.grad.data_ptr()
    net.shift.grad.mul_(0.0)  # as a clip scales each gradient in place
    assert torch.equal(net.other.grad, torch.full((4,), 5.0))


def test_the_gradients_of_inputs_come_back_and_unused_parameters_keep_none():
    net, spare = _Net(), torch.nn.Parameter(torch.ones(2))
    x = torch.randn(5, 6, requires_grad=True)
    (dx,) = add_gradients(net(x).square().sum(), None, [*net.parameters(), spare], [x])
    y = x.detach().clone().requires_grad_(True)
    _Net()(y).square().sum().backward()
    assert torch.equal(dx, y.grad) and x.grad is None and spare.grad is None
