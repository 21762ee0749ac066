"""CPU checks of fusebox_tools.core.torch_ops' norm math (the torch side of the
cross-check): hand-computed values, and the backward formulas against
autograd through torch's own layer norm / an RMS norm when the statistics are
x's own; batchnorm (running statistics by hand, the backward against autograd
through F.batch_norm) and pooling by hand. Needs torch (skipped without it).

    python3 -m pytest tests/python/test_norm_torch_ops.py
"""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (CPU torch is enough: pip install torch)")
import torch.nn.functional as F  # noqa: E402

from fusebox_tools.core import torch_ops


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


# ---------------------------------------------------------------- batchnorm and pooling

def bn_op(kind, outputs, **attrs):
    a = {"normalized_dims": [0, 2, 3]}
    a.update(attrs)
    return {"op": kind, "name": "bn", "attrs": a, "outputs": {r: r for r in outputs}}


def test_batchnorm_training_by_hand():
    # x [2, 1, 1, 2] = 1, 3, 5, 7: mean 4, biased var 5, unbiased 20/3.
    x = torch.tensor([1.0, 3.0, 5.0, 7.0]).reshape(2, 1, 1, 2)
    one = lambda v: torch.tensor([v]).reshape(1, 1, 1, 1)  # noqa: E731
    outs = ["y", "mean", "inv_variance", "next_running_mean", "next_running_var"]
    res = torch_ops.apply_op(bn_op("batchnorm", outs, epsilon=0.0, momentum=0.25),
                             {"x": x, "scale": one(2.0), "bias": one(0.5), "running_mean": one(1.0),
                              "running_var": one(2.0)})
    assert res["mean"].item() == pytest.approx(4.0)
    assert res["inv_variance"].item() == pytest.approx(5 ** -0.5)
    assert res["next_running_mean"].item() == pytest.approx(0.75 + 1.0)
    assert res["next_running_var"].item() == pytest.approx(0.75 * 2 + 0.25 * 20 / 3)
    assert res["y"].flatten().tolist() == pytest.approx([(v - 4) * 5 ** -0.5 * 2 + 0.5 for v in (1, 3, 5, 7)])


def test_batchnorm_backward_is_autograds_gradient():
    gen = torch.Generator().manual_seed(5)
    n, c, h, w, eps = 3, 4, 5, 5, 1e-5
    x = (torch.rand(n, c, h, w, generator=gen, dtype=torch.float64) * 2 - 1).requires_grad_(True)
    g = (torch.rand(c, generator=gen, dtype=torch.float64) + 0.5).requires_grad_(True)
    b = (torch.rand(c, generator=gen, dtype=torch.float64) - 0.5).requires_grad_(True)
    dy = torch.rand(n, c, h, w, generator=gen, dtype=torch.float64) * 2 - 1
    y = F.batch_norm(x, None, None, g, b, training=True, eps=eps)
    y.backward(dy)
    mean = x.detach().mean(dim=(0, 2, 3), keepdim=True)
    var = ((x.detach() - mean) ** 2).mean(dim=(0, 2, 3), keepdim=True)
    ins = {"dy": dy, "x": x.detach(), "scale": g.detach().reshape(1, c, 1, 1), "mean": mean,
           "inv_variance": torch.rsqrt(var + eps)}
    res = torch_ops.apply_op(bn_op("batchnorm_bwd", ["dx", "dscale", "dbias"]), ins)
    assert torch.allclose(res["dx"].double(), x.grad, atol=1e-5)
    assert torch.allclose(res["dscale"].double().flatten(), g.grad, atol=1e-4)
    assert torch.allclose(res["dbias"].double().flatten(), b.grad, atol=1e-4)


def pool_op(kind, **attrs):
    return {"op": kind, "name": "p", "attrs": attrs, "outputs": {"y": "y"}}


def test_pooling_by_hand():
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    geometry = dict(window=[3, 3], stride=[2, 2], padding=[1, 1])
    y = torch_ops.apply_op(pool_op("max_pool", mode="max", count_include_pad=True, **geometry), {"x": x})
    assert y.flatten().tolist() == [5, 7, 13, 15]
    y = torch_ops.apply_op(pool_op("avg_pool", mode="avg", count_include_pad=False, **geometry), {"x": x})
    assert y.flatten().tolist() == pytest.approx([10 / 4, 24 / 6, 51 / 6, 90 / 9])
    y = torch_ops.apply_op(pool_op("global_avg_pool", mode="avg", count_include_pad=True, window=[4, 4],
                                   stride=[4, 4], padding=[0, 0]), {"x": x})
    assert y.flatten().tolist() == [7.5]
