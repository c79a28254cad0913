"""The update after a step's backward: the fused AdamW the trainer makes, and its gradient clip."""

from __future__ import annotations

import io
import math

import pytest
import torch

from pgrank.training.step import adamw, clip_gradients


def _params(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(8, 4), (8,), (3, 8), (3,), (5,)]
    return [torch.randn(s, generator=g).requires_grad_(True) for s in shapes]


def _grads(params, step: int) -> None:
    g = torch.Generator().manual_seed(100 + step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)


def test_the_fused_update_equals_the_multi_tensor_one():
    fused, plain = _params(), _params()
    a = adamw(fused, lr=1e-2, weight_decay=0.01)
    b = torch.optim.AdamW(plain, lr=1e-2, weight_decay=0.01, foreach=True)
    assert a.param_groups[0]["fused"] is True  # the CPU has the fused kernel
    for step in range(4):
        for params, opt in ((fused, a), (plain, b)):
            _grads(params, step)
            opt.step()
            opt.zero_grad(set_to_none=True)
    for x, y, start in zip(fused, plain, _params()):
        assert not torch.equal(x, start)
        assert torch.allclose(x, y, atol=1e-6, rtol=1e-5)


def test_a_resumed_fused_optimizer_continues_exactly():
    params = _params()
    opt = adamw(params, lr=1e-2, weight_decay=0.01)
    for step in range(2):
        _grads(params, step)
        opt.step()
    buffer = io.BytesIO()
    torch.save({"weights": [p.detach().clone() for p in params], "optimizer": opt.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)  # as trainer.pt is read
    resumed = [w.clone().requires_grad_(True) for w in saved["weights"]]
    again = adamw(resumed, lr=1e-2, weight_decay=0.01)
    again.load_state_dict(saved["optimizer"])
    for params_, opt_ in ((params, opt), (resumed, again)):
        _grads(params_, 2)
        opt_.step()
    for x, y in zip(params, resumed):
        assert torch.equal(x, y)


def test_a_state_saved_by_the_multi_tensor_optimizer_resumes_in_the_fused_one():
    params, other = _params(), _params()
    old = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.01)
    _grads(params, 0)
    old.step()
    new = adamw(other, lr=1e-2, weight_decay=0.01)
    with torch.no_grad():
        for x, y in zip(other, params):
            x.copy_(y)
    buffer = io.BytesIO()
    torch.save(old.state_dict(), buffer)  # a copy, as trainer.pt holds it
    buffer.seek(0)
    new.load_state_dict(torch.load(buffer, weights_only=True))
    for params_, opt_ in ((params, old), (other, new)):
        _grads(params_, 1)
        opt_.step()
    for x, y in zip(params, other):
        assert torch.allclose(x, y, atol=1e-6, rtol=1e-5)


def test_parameters_on_a_device_without_the_fused_kernel_get_the_default_optimizer():
    meta = [torch.zeros(3, device="meta", requires_grad=True)]
    assert adamw(meta, lr=1e-3, weight_decay=0.0).param_groups[0]["fused"] is None


@pytest.mark.parametrize("max_norm", [0.5, 1e6, math.inf])
def test_clipping_equals_torch_clip_grad_norm(max_norm):
    ours, theirs = _params(), _params()
    _grads(ours, 0)
    _grads(theirs, 0)
    ours[2].grad = None  # a parameter without a gradient is left out, as torch leaves it
    theirs[2].grad = None
    a = clip_gradients(ours, max_norm)
    b = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    assert torch.equal(a, b)
    for x, y in zip(ours, theirs):
        assert (x.grad is None and y.grad is None) or torch.equal(x.grad, y.grad)
    if max_norm == 0.5:
        assert math.isclose(torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in ours if p.grad is not None])).item(),
                            0.5, rel_tol=1e-4)


def test_clipping_mixed_dtypes_goes_through_torch():
    params = [torch.randn(4, requires_grad=True), torch.randn(4, dtype=torch.float64, requires_grad=True)]
    for p in params:
        p.grad = torch.ones_like(p) * 3
    norm = clip_gradients(params, 1.0)
    assert math.isclose(float(norm), math.sqrt(8 * 9), rel_tol=1e-6)
    assert math.isclose(sum(float(p.grad.square().sum()) for p in params), 1.0, rel_tol=1e-4)


def test_clipping_nothing_returns_zero():
    assert float(clip_gradients([torch.zeros(2, requires_grad=True)], 1.0)) == 0.0
