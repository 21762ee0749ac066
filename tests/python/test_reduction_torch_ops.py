"""CPU checks of fusebox_tools.core.torch_ops' reductions (the torch side of the
cross-check) against hand-computed values. Needs torch (skipped without it).

    python3 -m pytest tests/python/test_reduction_torch_ops.py
"""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CPU torch is enough: pip install torch)")

from fusebox_tools.core import torch_ops


def op(kind, reduce_dims):
    return {"op": kind, "name": "r", "attrs": {"reduce_dims": reduce_dims}, "outputs": {"y": "y"}}


X = torch.tensor([[1.0, -4.0, 2.0], [3.0, 0.5, -1.0]]).reshape(1, 2, 3)


@pytest.mark.parametrize("kind,dims,want", [
    ("reduce_sum", [2], [[[-1.0], [2.5]]]),
    ("reduce_mean", [1], [[[2.0, -1.75, 0.5]]]),
    ("reduce_max", [0, 1, 2], [[[3.0]]]),
    ("reduce_min", [1, 2], [[[-4.0]]]),
    ("reduce_amax", [0, 1, 2], [[[4.0]]]),
])
def test_reduction_by_hand(kind, dims, want):
    y = torch_ops.apply_op(op(kind, dims), {"x": X})
    assert y.shape == torch.tensor(want).shape  # x's rank, 1 on the reduced dims
    assert torch.equal(y, torch.tensor(want))
