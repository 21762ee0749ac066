#!/usr/bin/env python3
"""Writes examples/pipelines/conv10.json: 10 chained conv+bias+relu 3x3 layers
(NHWC bf16, 64 channels, 56x56, batch 8; a ResNet-like stack), its graph and
its weights (examples/pipelines/weights/conv10_*.npy).

Weights are He-uniform (bound sqrt(6 / fan_in)) and biases small, both
quantized to multiples of 2^-10 with |k| < 128, so every value is exact in
float16 (stored as <f2, half the bytes of <f4) and in bf16 (what the graph
reads): no rounding anywhere between this file, fusebox and torch.

    python3 scripts/make_conv10_pipeline.py [--seed 10] [--layers 10]
"""
import argparse
import json
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "examples", "pipelines")
GRAPH = "graphs/conv_bias_relu_64c_56_b8.json"
N, C, H, W = 8, 64, 56, 56


def graph():
    return {
        "name": "conv_bias_relu_64c_56_b8",
        "io_dtype": "bf16", "intermediate_dtype": "fp32", "compute_dtype": "fp32",
        "tensors": [
            {"name": "x", "dims": [N, C, H, W], "layout": "nhwc"},
            {"name": "w", "dims": [C, C, 3, 3], "layout": "nhwc"},
            {"name": "b", "dims": [1, C, 1, 1], "layout": "nhwc"},
            {"name": "y", "layout": "nhwc"},
        ],
        "ops": [
            {"op": "conv_fprop", "name": "conv", "inputs": {"x": "x", "w": "w"}, "outputs": {"y": "conv_out"},
             "padding": [1, 1], "stride": [1, 1], "dilation": [1, 1]},
            {"op": "bias_add", "name": "bias", "inputs": {"x": "conv_out", "bias": "b"}, "outputs": {"y": "biased"}},
            {"op": "relu", "name": "act", "inputs": {"x": "biased"}, "outputs": {"y": "y"}},
        ],
    }


def quantized(rng, shape, bound):
    """Uniform in [-bound, bound] as multiples of 2^-10, |k| <= 127."""
    k = np.clip(np.round(rng.uniform(-bound, bound, size=shape) * 1024), -127, 127)
    return (k / 1024).astype(np.float16)


def pipeline(layers):
    graphs, buffers, bind = {}, {"image": {"kind": "input"}}, {}
    prev = "image"
    for i in range(1, layers + 1):
        stage = f"conv{i}"
        out = "out" if i == layers else f"act{i}"
        graphs[stage] = GRAPH
        buffers[f"w{i}"] = {"kind": "constant", "file": f"weights/conv10_w{i}.npy"}
        buffers[f"b{i}"] = {"kind": "constant", "file": f"weights/conv10_b{i}.npy"}
        buffers[out] = {"kind": "output" if i == layers else "intermediate"}
        bind[stage] = {"x": prev, "w": f"w{i}", "b": f"b{i}", "y": out}
        prev = out
    return {"name": "conv10", "graphs": graphs, "buffers": buffers, "bind": bind}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=10)
    ap.add_argument("--layers", type=int, default=10)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    os.makedirs(os.path.join(OUT, "graphs"), exist_ok=True)
    os.makedirs(os.path.join(OUT, "weights"), exist_ok=True)
    with open(os.path.join(OUT, GRAPH), "w") as f:
        json.dump(graph(), f, indent=2)
        f.write("\n")
    with open(os.path.join(OUT, "conv10.json"), "w") as f:
        json.dump(pipeline(args.layers), f, indent=2)
        f.write("\n")
    bound = (6.0 / (C * 9)) ** 0.5
    for i in range(1, args.layers + 1):
        np.save(os.path.join(OUT, "weights", f"conv10_w{i}.npy"), quantized(rng, (C, C, 3, 3), bound))
        np.save(os.path.join(OUT, "weights", f"conv10_b{i}.npy"), quantized(rng, (1, C, 1, 1), 0.0625))


if __name__ == "__main__":
    main()
