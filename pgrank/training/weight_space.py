"""The policy's weights measured from the warm start's (beyond the paper): interpolation and an L2 pull.

Fine-tuning can gain in domain while it forgets out of domain. Two remedies act in weight space, with the warm
start's weights ``theta_0`` as the anchor:

* **Interpolation** (WiSE-FT: Wortsman et al., *Robust fine-tuning of zero-shot models*, CVPR 2022):
  ``theta = (1 - alpha) * theta_0 + alpha * theta_1`` for a trained ``theta_1``, at no training cost.
  ``train.selection.interpolation`` lists the alphas; every kept epoch's mixtures are validated in and out of
  domain, and the selection rule picks (epoch, alpha) (:mod:`pgrank.training.selection`).
* **L2 toward the warm start** (``train.l2_to_warm_start``, "L2-SP": Li et al., *Explicit inductive bias for
  transfer learning with convolutional networks*, ICML 2018): ``coef * ||theta - theta_0||^2`` added to the loss,
  its gradient ``2 * coef * (theta - theta_0)`` added to each trained parameter's gradient.

Both act on every floating-point parameter of the policy (in ``tower: query``, the query route's, which is what
trains). The anchor is a copy of those parameters taken before training (and before a resumed run loads its
state), on the policy's device.

Example:
    >>> anchor = Anchor.of(model)
    >>> with anchor.interpolated(model, 0.5):
    ...     metrics = validate(model, ...)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Anchor:
    """The warm start's parameters, by name."""

    weights: dict[str, torch.Tensor]

    @classmethod
    def of(cls, model: torch.nn.Module) -> "Anchor":
        return cls({n: p.detach().clone() for n, p in model.named_parameters() if p.is_floating_point()})

    @contextlib.contextmanager
    def interpolated(self, model: torch.nn.Module, alpha: float) -> Iterator[torch.nn.Module]:
        """``model`` with weights ``(1 - alpha) * anchor + alpha * current`` inside the block, restored after."""
        saved = {n: p.detach().clone() for n, p in model.named_parameters() if n in self.weights}
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in self.weights:
                    p.mul_(alpha).add_(self.weights[n], alpha=1.0 - alpha)
        try:
            yield model
        finally:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if n in saved:
                        p.copy_(saved[n])

    def add_l2_gradient(self, model: torch.nn.Module, coef: float) -> None:
        """Add ``2 * coef * (theta - theta_0)`` to the gradient of every trained parameter (those with one)."""
        if not coef:
            return
        with torch.no_grad():
            for n, p in model.named_parameters():
                if p.grad is not None and n in self.weights:
                    p.grad.add_(p - self.weights[n], alpha=2.0 * coef)

    def distance(self, model: torch.nn.Module) -> float:
        """``||theta - theta_0||`` over the anchored parameters (logged as a diagnostic)."""
        with torch.no_grad():
            total = sum(float((p - self.weights[n]).pow(2).sum()) for n, p in model.named_parameters() if n in self.weights)
        return total ** 0.5
