"""`fusebox check --json` (docs/cli.md): its shape on every example graph,
resolved attributes, exact numbers and errors. Needs only the fusebox binary."""
import json
import math
import os

import pytest

from fusebox_tools.core.graph import CHECK_JSON_VERSION, default_graphs

EXAMPLES = default_graphs()
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8_e4m3": 1, "fp8_e5m2": 1, "int32": 4, "int64": 8, "uint8": 1}
TENSOR_KEYS = ["name", "kind", "dtype", "dims", "strides", "storage_bytes", "scalar", "values", "random_lo",
               "random_hi"]
OP_KEYS = ["name", "op", "inputs", "outputs", "primary_output", "compute_dtype", "attrs", "traits", "tolerances"]
SDPA_ATTR_KEYS = {"attn_scale", "causal", "alignment", "left_bound", "right_bound", "padding", "bias", "alibi",
                  "alibi_slopes", "dropout", "dump_dropout_mask"}
# The primary output of each op type (graph.h, op_output_roles: the first).
PRIMARY = {"conv_fprop": "y", "conv_dgrad": "dx", "conv_wgrad": "dw", "matmul": "y", "sdpa_fwd": "o",
           "sdpa_fp8_fwd": "o", "sdpa_bwd": "dq", "sdpa_fp8_bwd": "dq", "layernorm": "y", "rmsnorm": "y",
           "layernorm_bwd": "dx", "rmsnorm_bwd": "dx", "max_pool": "y", "avg_pool": "y", "global_avg_pool": "y",
           "batchnorm": "y", "batchnorm_inference": "y", "batchnorm_bwd": "dx", "reduce_sum": "y", "reduce_max": "y",
           "reduce_min": "y", "reduce_amax": "y", "reduce_mean": "y", "embedding": "y", "embedding_bwd": "dtable",
           "rope": "y", "rope_bwd": "dx", "cross_entropy": "loss", "cross_entropy_bwd": "dlogits",
           "transpose": "y", "quantize": "y"}
POINTWISE = {"add": ("a", "b"), "sub": ("a", "b"), "mul": ("a", "b"), "bias_add": ("x", "bias"),
             "scale": ("x", "scale"), "relu": ("x",), "gelu_tanh": ("x",), "gelu_erf": ("x",), "silu": ("x",),
             "sigmoid": ("x",), "tanh": ("x",), "relu_bwd": ("dy", "x"),
             "gelu_tanh_bwd": ("dy", "x"), "gelu_erf_bwd": ("dy", "x"), "silu_bwd": ("dy", "x"),
             "sigmoid_bwd": ("dy", "x"), "tanh_bwd": ("dy", "x")}


def name_of(path):
    return os.path.relpath(path, os.path.join(os.path.dirname(path), ".."))


def test_examples_found():
    assert len(EXAMPLES) >= 20, EXAMPLES
    assert any("/small/" in p for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=name_of)
def test_example_document(run_check, path):
    rc, doc, err = run_check(path)
    assert rc == 0, err
    assert doc["ok"] is True and doc["version"] == CHECK_JSON_VERSION
    assert list(doc)[:12] == ["ok", "version", "graph", "io_dtype", "intermediate_dtype", "compute_dtype",
                              "fingerprint", "shape", "flops", "bytes", "tensors", "ops"]
    # the concrete shape of a symbolic graph (its defaults here), {} for a static one
    symbolic = "symbols" in json.load(open(path))
    assert (doc["shape"] != {}) == symbolic and all(isinstance(v, int) and v > 0 for v in doc["shape"].values())
    assert int(doc["fingerprint"], 16) >= 0 and len(doc["fingerprint"]) >= 16
    # A graph that only moves data (a transpose) does no arithmetic.
    assert (doc["flops"] > 0 or all(op["op"] == "transpose" for op in doc["ops"])) and doc["bytes"] > 0
    tensors = {t["name"]: t for t in doc["tensors"]}
    assert len(tensors) == len(doc["tensors"])
    bytes_moved = 0
    for t in doc["tensors"]:
        assert list(t) == TENSOR_KEYS, t
        assert t["kind"] in ("input", "output", "virtual", "scalar")
        assert len(t["dims"]) == len(t["strides"]) and all(d >= 1 for d in t["dims"])
        span = 1 + sum((d - 1) * s for d, s in zip(t["dims"], t["strides"]))
        assert t["storage_bytes"] == span * DTYPE_BYTES[t["dtype"]], t
        assert (t["scalar"] is not None) == (t["kind"] == "scalar")
        if t["values"] is not None:
            assert t["kind"] == "input" and len(t["values"]) == math.prod(t["dims"])
        assert t["random_lo"] < t["random_hi"]
        if t["kind"] in ("input", "output"):
            bytes_moved += math.prod(t["dims"]) * DTYPE_BYTES[t["dtype"]]
    assert doc["bytes"] == bytes_moved
    # the input copies a timed run rotates through (fusebox/runtime.h, input_rotation_sets)
    input_bytes = sum(t["storage_bytes"] for t in doc["tensors"] if t["kind"] == "input")
    want = 1 if input_bytes <= 0 else max(1, min(int(2 * (60 << 20) / input_bytes) + 1, 16,
                                                 int(8 * (1 << 30) / input_bytes)))
    assert doc["rotation_sets"] == want, (doc["rotation_sets"], input_bytes)

    produced, compared = set(), set()
    for op in doc["ops"]:
        assert list(op) == OP_KEYS, op
        # topological order: every input is a graph input, a scalar or an earlier op's output
        for role, name in op["inputs"].items():
            assert name in produced or tensors[name]["kind"] in ("input", "scalar"), (op["name"], role)
        assert op["primary_output"] in op["outputs"]
        if op["op"] in PRIMARY:
            assert op["primary_output"] == PRIMARY[op["op"]], op["op"]
        else:
            assert op["op"] in POINTWISE and op["primary_output"] == "y"
        for role, name in op["outputs"].items():
            produced.add(name)
            assert tensors[name]["kind"] in ("output", "virtual")
            if tensors[name]["kind"] == "output":
                tol = op["tolerances"][role]
                assert list(tol) == ["rel_l2", "max_abs_rel", "saturate_at"]
                assert 0 < tol["rel_l2"] <= tol["max_abs_rel"] < 1
                # fp8 outputs saturate at their largest finite value; others are not clamped.
                fp8 = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
                assert tol["saturate_at"] == fp8.get(tensors[name]["dtype"], 0.0), (name, tol)
                compared.add(name)
            else:
                assert role not in op["tolerances"]
        if op["op"].startswith("sdpa"):
            assert SDPA_ATTR_KEYS <= set(op["attrs"]), op["attrs"]
            assert op["attrs"]["attn_scale"] > 0
            if op["attrs"]["causal"]:
                assert op["attrs"]["right_bound"] is not None
        elif op["op"] in ("conv_fprop", "conv_dgrad", "conv_wgrad"):
            first = "x" if op["op"] == "conv_fprop" else "dy"
            nsp = len(tensors[op["inputs"][first]]["dims"]) - 2
            assert [len(op["attrs"][k]) for k in ("padding", "stride", "dilation")] == [nsp] * 3
            if op["op"] == "conv_dgrad":
                assert op["attrs"]["x_dims"] == tensors[op["outputs"]["dx"]]["dims"]
            if op["op"] == "conv_wgrad":
                assert op["attrs"]["w_dims"] == tensors[op["outputs"]["dw"]]["dims"]
        elif op["op"] in ("layernorm", "rmsnorm"):
            a = op["attrs"]
            assert a["epsilon"] >= 0 and a["phase"] in ("inference", "training")
            assert (a["phase"] == "training") == ("inv_variance" in op["outputs"])
            # the normalized dims are where scale has x's dims, the trailing ones
            x, scale = tensors[op["inputs"]["x"]]["dims"], tensors[op["inputs"]["scale"]]["dims"]
            assert a["normalized_dims"] == list(range(a["normalized_dims"][0], len(x)))
            assert all(scale[d] == (x[d] if d in a["normalized_dims"] else 1) for d in range(len(x)))
        elif op["op"] in ("layernorm_bwd", "rmsnorm_bwd"):
            x = tensors[op["inputs"]["x"]]["dims"]
            assert op["attrs"]["normalized_dims"] and op["attrs"]["normalized_dims"][-1] == len(x) - 1
            assert tensors[op["outputs"]["dx"]]["dims"] == x
            assert tensors[op["outputs"]["dscale"]]["dims"] == tensors[op["inputs"]["scale"]]["dims"]
        elif op["op"] in ("batchnorm", "batchnorm_inference", "batchnorm_bwd"):
            x = tensors[op["inputs"]["x"]]["dims"]
            # statistics per channel: over every dim but 1
            assert op["attrs"]["normalized_dims"] == [0] + list(range(2, len(x)))
            assert tensors[op["inputs"]["scale"]]["dims"] == [1, x[1]] + [1] * (len(x) - 2)
            if op["op"] == "batchnorm":
                assert op["attrs"]["epsilon"] >= 0 and 0 <= op["attrs"]["momentum"] <= 1
        elif op["op"] in ("max_pool", "avg_pool", "global_avg_pool"):
            a = op["attrs"]
            x, y = tensors[op["inputs"]["x"]]["dims"], tensors[op["outputs"]["y"]]["dims"]
            assert a["mode"] == ("max" if op["op"] == "max_pool" else "avg")
            assert y[:2] == x[:2]
            for i in range(len(x) - 2):  # out = (in + 2*pad - window) // stride + 1
                assert y[i + 2] == (x[i + 2] + 2 * a["padding"][i] - a["window"][i]) // a["stride"][i] + 1
            if op["op"] == "global_avg_pool":
                assert a["window"] == x[2:] and y[2:] == [1] * (len(x) - 2)
        elif op["op"].startswith("reduce_"):
            # y keeps x's rank with 1 exactly on the (resolved, ascending) reduced dims
            x, y = tensors[op["inputs"]["x"]]["dims"], tensors[op["outputs"]["y"]]["dims"]
            dims = op["attrs"]["reduce_dims"]
            assert dims == sorted(set(dims)) and all(0 <= d < len(x) for d in dims), dims
            assert y == [1 if d in dims else x[d] for d in range(len(x))], (x, y, dims)
        elif op["op"] == "embedding_bwd":
            # dtable fp32 [rows, H, 1, 1] from ids [N, 1, 1, 1] and dy [N, H, 1, 1]; fusebox's own kernel
            ids, dy = tensors[op["inputs"]["ids"]], tensors[op["inputs"]["dy"]]
            dt = tensors[op["outputs"]["dtable"]]
            assert dt["dims"] == [op["attrs"]["vocab"], dy["dims"][1], 1, 1] and dt["dtype"] == "fp32"
            assert ids["dtype"] == "int32" and ids["dims"][0] == dy["dims"][0] and op["attrs"]["native_kernel"] is True
        elif op["op"] == "embedding":
            # y [N, H, 1, 1] from ids [N, 1, 1, 1] and table [V, H, 1, 1]; fusebox's own kernel
            ids, table = tensors[op["inputs"]["ids"]], tensors[op["inputs"]["table"]]
            y = tensors[op["outputs"]["y"]]["dims"]
            assert y == [ids["dims"][0], table["dims"][1], 1, 1] and ids["dtype"] == "int32"
            assert op["attrs"] == {"add": "add" in op["inputs"], "vocab": table["dims"][0], "native_kernel": True}
        elif op["op"] in ("rope", "rope_bwd"):
            # y like x [B, H, S, D]; freqs [1, 1, P, R/2]; fusebox's own kernel
            x = tensors[op["inputs"]["x" if op["op"] == "rope" else "dy"]]
            f = tensors[op["inputs"]["freqs"]]["dims"]
            a = op["attrs"]
            assert tensors[op["outputs"][op["primary_output"]]]["dims"] == x["dims"]
            assert 0 < a["rope_dim"] <= x["dims"][3] and a["rope_dim"] % 2 == 0 and f[3] == a["rope_dim"] // 2
            assert a["layout"] in ("half", "interleaved") and a["native_kernel"] is True
            assert a["offset"] == ("offset" in op["inputs"]) and f[2] >= x["dims"][2]
        elif op["op"] in ("cross_entropy", "cross_entropy_bwd"):
            # logits [N, V, 1, 1], labels int32 [N, 1, 1, 1]; fusebox's own kernel
            lg, lb = tensors[op["inputs"]["logits"]], tensors[op["inputs"]["labels"]]
            assert lb["dtype"] == "int32" and lb["dims"] == [lg["dims"][0], 1, 1, 1]
            assert op["attrs"] == {"classes": lg["dims"][1], "ignore_index": -100, "lse": "lse" in op["outputs"],
                                   "native_kernel": True}
        elif op["op"] == "quantize":
            # y = fp8(x * scale) in y's own layout, x's dims; fusebox's own kernel
            x, y = tensors[op["inputs"]["x"]], tensors[op["outputs"]["y"]]
            assert y["dims"] == x["dims"] and y["dtype"] in ("fp8_e4m3", "fp8_e5m2")
            assert op["attrs"] == {"amax": "amax" in op["outputs"], "y2": "y2" in op["outputs"], "native_kernel": True}
        elif op["op"] == "transpose":
            # y's dim i is x's dim permutation[i]; same dtype
            x, y = tensors[op["inputs"]["x"]], tensors[op["outputs"]["y"]]
            p = op["attrs"]["permutation"]
            assert sorted(p) == list(range(len(x["dims"]))) and y["dims"] == [x["dims"][i] for i in p]
            assert y["dtype"] == x["dtype"]
        else:
            assert op["attrs"] == {}
    assert compared == {n for n, t in tensors.items() if t["kind"] == "output"}


def test_primary_output_of_every_op_type(run_check, write_graph, repo_root):
    """Every op type's primary output role; pointwise types through a small
    matmul graph each, the sdpa types through the examples."""
    seen = {}
    for kind, roles in POINTWISE.items():
        tensors = [{"name": "a", "dims": [1, 4, 8]}, {"name": "b", "dims": [1, 8, 4]}, {"name": "y"}]
        ins = {roles[0]: "mm"}
        if len(roles) == 2:
            tensors.append({"name": "other", "dims": [1, 1, 4]})
            ins[roles[1]] = "other"
        doc = {"name": kind, "tensors": tensors,
               "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "mm"}},
                       {"op": kind, "name": "pw", "inputs": ins, "outputs": {"y": "y"}}]}
        rc, out, err = run_check(write_graph(doc, kind + ".json"))
        assert rc == 0, (kind, err)
        for op in out["ops"]:
            seen[op["op"]] = op["primary_output"]
    for kind in [k for k in PRIMARY if k.startswith("reduce_")]:  # reduce_mean has only an invalid_ example
        doc = {"name": kind, "tensors": [{"name": "x", "dims": [2, 3]}, {"name": "y"}],
               "ops": [{"op": kind, "name": "r", "inputs": {"x": "x"}, "outputs": {"y": "y"}}]}
        rc, out, err = run_check(write_graph(doc, kind + ".json"))
        assert rc == 0, (kind, err)
        seen[kind] = out["ops"][0]["primary_output"]
    # batchnorm_inference (+ relu) is refused by cuDNN on the H200: it has only invalid_ examples
    for path in EXAMPLES + [os.path.join(repo_root, "examples/graphs/invalid_batchnorm_inference_relu.json")]:
        rc, out, err = run_check(path)
        for op in out["ops"]:
            seen[op["op"]] = op["primary_output"]
    assert seen == dict(PRIMARY, **{k: "y" for k in POINTWISE})


def test_resolved_defaults(run_check, write_graph):
    doc = {"name": "defaults", "tensors": [
        {"name": "x", "dims": [1, 8, 6, 6], "layout": "nhwc"}, {"name": "w", "dims": [4, 8, 3, 3], "layout": "nhwc"},
        {"name": "q", "dims": [1, 2, 16, 64]}, {"name": "k", "dims": [1, 2, 16, 64]},
        {"name": "v", "dims": [1, 2, 16, 64]}, {"name": "y"}, {"name": "o"}],
        "ops": [{"op": "conv_fprop", "name": "c", "inputs": {"x": "x", "w": "w"}, "outputs": {"y": "y"}},
                {"op": "sdpa_fwd", "name": "s", "inputs": {"q": "q", "k": "k", "v": "v"}, "outputs": {"o": "o"},
                 "causal": True}]}
    rc, out, err = run_check(write_graph(doc))
    assert rc == 0, err
    conv, sdpa = out["ops"]
    assert conv["attrs"] == {"padding": [0, 0], "stride": [1, 1], "dilation": [1, 1]}
    a = sdpa["attrs"]
    assert a["attn_scale"] == 1.0 / math.sqrt(64) and a["causal"] is True and a["right_bound"] == 0
    assert a["left_bound"] is None and a["alignment"] == "top_left" and a["dropout"] is None
    assert a["generate_stats"] is False and a["padding"] is False and a["alibi_slopes"] is None
    t = {t["name"]: t for t in out["tensors"]}
    assert t["y"]["dims"] == [1, 4, 4, 4] and t["y"]["kind"] == "output"
    assert t["x"]["strides"] == [288, 1, 48, 8]
    assert t["o"]["dims"] == [1, 2, 16, 64] and t["o"]["dtype"] == "bf16"


def test_exact_numbers_round_trip(run_check, write_graph):
    """Doubles come back bit-exact (no 6-digit printing anywhere on the way)."""
    scale = 0.1 + 2 ** -56  # 0.1's neighbour: differs in the last bit
    assert scale != 0.1
    attn = 0.12345678901234568
    drop = 0.30000000000000004
    doc = {"name": "exact", "tensors": [
        {"name": "a", "dims": [1, 4, 8]}, {"name": "b", "dims": [1, 8, 4]}, {"name": "s", "scalar": scale},
        {"name": "y"},
        {"name": "q", "dims": [1, 2, 16, 64]}, {"name": "k", "dims": [1, 2, 16, 64]},
        {"name": "v", "dims": [1, 2, 16, 64]}, {"name": "o"},
        {"name": "seed", "dims": [1, 1, 1, 1], "dtype": "int64", "values": [7]},
        {"name": "offset", "dims": [1, 1, 1, 1], "dtype": "int64"}],
        "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "mm"}},
                {"op": "scale", "name": "sc", "inputs": {"x": "mm", "scale": "s"}, "outputs": {"y": "y"}},
                {"op": "sdpa_fwd", "name": "attn", "inputs": {"q": "q", "k": "k", "v": "v", "seed": "seed",
                                                               "offset": "offset"},
                 "outputs": {"o": "o"}, "attn_scale": attn, "dropout": drop}]}
    rc, out, err = run_check(write_graph(doc))
    assert rc == 0, err
    t = {t["name"]: t for t in out["tensors"]}
    assert t["s"]["scalar"] == scale and t["s"]["kind"] == "scalar"
    assert t["seed"]["values"] == [7.0] and t["offset"]["values"] is None
    assert (t["offset"]["random_lo"], t["offset"]["random_hi"]) == (0, 2147483647)
    attrs = out["ops"][2]["attrs"]
    assert attrs["attn_scale"] == attn and attrs["dropout"] == drop


def test_random_ranges(run_check, repo_root):
    rc, out, err = run_check(os.path.join(repo_root, "examples/graphs/small/sdpa_fp8_small.json"))
    assert rc == 0, err
    for t in out["tensors"]:
        if t["name"].startswith(("descale_", "scale_")) and t["kind"] == "input":
            assert (t["random_lo"], t["random_hi"]) == (0.5, 2.0), t
        elif t["kind"] == "input":
            assert (t["random_lo"], t["random_hi"]) == (-1.0, 1.0), t
    rc, out, err = run_check(os.path.join(repo_root, "examples/graphs/sdpa_gqa_padding.json"))
    t = {t["name"]: t for t in out["tensors"]}
    op = out["ops"][0]
    for role, src in (("seq_len_q", "q"), ("seq_len_kv", "k")):
        lens = t[op["inputs"][role]]
        assert (lens["random_lo"], lens["random_hi"]) == (1, t[op["inputs"][src]]["dims"][2])


def test_alibi_slopes(run_check, repo_root):
    rc, out, err = run_check(os.path.join(repo_root, "examples/graphs/small/sdpa_alibi_small.json"))
    assert rc == 0, err
    op = out["ops"][0]
    heads = {t["name"]: t for t in out["tensors"]}[op["inputs"]["q"]]["dims"][1]
    slopes = op["attrs"]["alibi_slopes"]
    n = 2 ** int(math.log2(heads))
    want = [2 ** (-8 * (h + 1) / n) for h in range(n)] + [2 ** (-4 * (2 * m + 1) / n) for m in range(heads - n)]
    assert len(slopes) == heads
    assert all(abs(s - w) <= 1e-6 * w for s, w in zip(slopes, want)), (slopes, want)


def test_fingerprint_stable_and_shape_sensitive(run_check, write_graph):
    def doc(m):
        return {"name": "fp", "tensors": [{"name": "a", "dims": [1, m, 8]}, {"name": "b", "dims": [1, 8, 4]},
                                          {"name": "y"}],
                "ops": [{"op": "matmul", "name": "mm", "inputs": {"a": "a", "b": "b"}, "outputs": {"y": "y"}}]}
    fp = [run_check(write_graph(doc(m), f"{m}.json"))[1]["fingerprint"] for m in (4, 4, 5)]
    assert fp[0] == fp[1] != fp[2]


def test_errors(run_check, repo_root, tmp_path):
    rc, out, err = run_check(os.path.join(repo_root, "examples/graphs/invalid_shapes.json"))
    assert rc == 2 and out["ok"] is False and out["code"] == "InvalidArgument"
    assert "invalid_shapes.json" in out["error"] and "[" in out["error"], out
    assert out["error"] in err
    rc, out, err = run_check(tmp_path / "missing.json")
    assert rc == 2 and out["ok"] is False and out["code"] == "IoError" and "missing.json" in out["error"]
    path = os.path.join(repo_root, "examples/graphs/small/sdpa_padding_small.json")
    rc, out, err = run_check(path, "--inputs", "nope=x.npy")
    assert rc == 2 and out["code"] == "InvalidArgument"
    assert "'nope' is not an input" in out["error"] and "seq_len_q" in out["error"]
    rc, out, err = run_check(path, "--inputs", "seq_len_q")
    assert rc == 2 and "is not NAME=FILE.npy" in out["error"]
    rc, out, err = run_check(path, "--inputs", f"seq_len_q={tmp_path / 'absent.npy'}")
    assert rc == 2 and "absent.npy" in out["error"]
