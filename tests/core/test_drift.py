"""The query tower's drift from the document tower (train.document_anchor): a pure tensor function."""

from __future__ import annotations

import math

import pytest
import torch

from pgrank.core.drift import cosine_drift


def test_no_drift_where_every_row_points_where_its_target_does():
    target = torch.randn(5, 8)
    assert cosine_drift(target * 3.0, target).item() == pytest.approx(0.0, abs=1e-6)  # scale does not count


def test_the_drift_is_the_mean_of_one_minus_the_cosines():
    embedded = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    target = torch.tensor([[1.0, 1.0], [0.0, -1.0]])
    expected = ((1 - math.cos(math.pi / 4)) + 2.0) / 2  # 45 degrees, then opposite
    assert cosine_drift(embedded, target).item() == pytest.approx(expected, rel=1e-6)


def test_the_gradient_moves_the_embedding_only():
    embedded = torch.randn(4, 6, requires_grad=True)
    target = torch.randn(4, 6, requires_grad=True)
    cosine_drift(embedded, target).backward()
    assert embedded.grad is not None and embedded.grad.abs().sum() > 0
    assert target.grad is None


@pytest.mark.parametrize("shapes", [((3, 4), (3, 5)), ((0, 4), (0, 4)), ((4,), (4,))])
def test_mismatched_or_empty_inputs_are_refused(shapes):
    with pytest.raises(ValueError, match="expected two equal"):
        cosine_drift(torch.zeros(shapes[0]), torch.zeros(shapes[1]))
