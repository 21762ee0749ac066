"""CPU checks of fusebox_tools.torch_ops' norm math (the torch side of the
cross-check): hand-computed values, and the backward formulas against
autograd through torch's own layer norm / an RMS norm when the statistics are
x's own. Needs torch (skipped without it).

    python3 -m pytest tests/python/test_norm_torch_ops.py
"""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CPU torch is enough: pip install torch)")
import torch.nn.functional as F  # noqa: E402

from fusebox_tools import torch_ops  # noqa: E402


def op(kind, outputs, **attrs):
    """An op as check --json gives it: x [rows, n, 1, 1] normalized over dims 1..3."""
    a = {"normalized_dims": [1, 2, 3]}
    a.update(attrs)
    return {"op": kind, "name": "n", "attrs": a, "outputs": {r: r for r in outputs}}


def test_layernorm_by_hand():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).reshape(1, 4, 1, 1)
    scale = torch.tensor([1.0, 2.0, 0.5, -1.0]).reshape(1, 4, 1, 1)
    bias = torch.tensor([0.0, 0.25, -0.5, 1.0]).reshape(1, 4, 1, 1)
    res = torch_ops.apply_op(op("layernorm", ["y", "mean", "inv_variance"], epsilon=0.75, phase="training"),
                             {"x": x, "scale": scale, "bias": bias})
    inv = 2 ** -0.5  # var 1.25 + 0.75
    assert res["mean"].item() == pytest.approx(2.5)
    assert res["inv_variance"].item() == pytest.approx(inv)
    want = (x - 2.5) * inv * scale + bias
    assert torch.allclose(res["y"], want, atol=1e-6)


def test_rmsnorm_by_hand():
    x = torch.tensor([3.0, 4.0]).reshape(1, 2, 1, 1)
    scale = torch.tensor([1.0, 2.0]).reshape(1, 2, 1, 1)
    res = torch_ops.apply_op(op("rmsnorm", ["y", "inv_variance"], epsilon=3.5, phase="training", bias=False),
                             {"x": x, "scale": scale})
    assert res["inv_variance"].item() == pytest.approx(0.25)  # 1/sqrt(12.5 + 3.5)
    assert res["y"].flatten().tolist() == pytest.approx([0.75, 2.0])


@pytest.mark.parametrize("kind", ["layernorm_bwd", "rmsnorm_bwd"])
def test_backward_is_autograds_gradient(kind):
    gen = torch.Generator().manual_seed(3)
    rows, n, eps = 6, 32, 1e-5
    x = (torch.rand(rows, n, 1, 1, generator=gen, dtype=torch.float64) * 2 - 1).requires_grad_(True)
    g = torch.rand(1, n, 1, 1, generator=gen, dtype=torch.float64) + 0.5
    b = torch.rand(1, n, 1, 1, generator=gen, dtype=torch.float64) - 0.5
    g.requires_grad_(True)
    b.requires_grad_(True)
    dy = torch.rand(rows, n, 1, 1, generator=gen, dtype=torch.float64) * 2 - 1
    if kind == "layernorm_bwd":
        y = F.layer_norm(x, (n, 1, 1), g.reshape(n, 1, 1), b.reshape(n, 1, 1), eps)
        mean = x.detach().mean(dim=(1, 2, 3), keepdim=True)
        var = ((x.detach() - mean) ** 2).mean(dim=(1, 2, 3), keepdim=True)
        stats = {"mean": mean, "inv_variance": torch.rsqrt(var + eps)}
    else:
        inv = torch.rsqrt((x * x).mean(dim=(1, 2, 3), keepdim=True) + eps)
        y = x * inv * g + b
        stats = {"inv_variance": inv.detach()}
    y.backward(dy)
    ins = dict(stats, x=x.detach(), dy=dy, scale=g.detach())
    res = torch_ops.apply_op(op(kind, ["dx", "dscale", "dbias"]), ins)
    # torch_ops computes in float32 (as the cross-check does)
    assert torch.allclose(res["dx"].double(), x.grad, atol=1e-5)
    assert torch.allclose(res["dscale"].double(), g.grad, atol=1e-5)
    assert torch.allclose(res["dbias"].double(), b.grad, atol=1e-5)
