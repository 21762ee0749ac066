#!/usr/bin/env python3
"""Writes examples/pipelines/weights/two_convs.safetensors from the two_convs
.npy weights, as a model checkpoint would hold them: torch-style names,
biases 1-D ([16], not the graph's [1, 16, 1, 1]), conv1's weight in BF16 (it
feeds a bf16 tensor: exact), the rest F32. examples/pipelines/two_convs_st.json
reads it (docs/pipeline-format.md, "Constants from safetensors")."""
import os

import numpy as np

from fusebox_tools.core import safetensors_np
from fusebox_tools.core.graph import REPO_ROOT as ROOT

W = os.path.join(ROOT, "examples", "pipelines", "weights")
t = {"conv1.weight": np.load(f"{W}/two_convs_w1.npy"), "conv1.bias": np.load(f"{W}/two_convs_b1.npy").reshape(-1),
     "conv2.weight": np.load(f"{W}/two_convs_w2.npy"), "conv2.bias": np.load(f"{W}/two_convs_b2.npy").reshape(-1)}
safetensors_np.write(f"{W}/two_convs.safetensors", t, {"conv1.weight": "BF16"}, {"format": "pt"})
print(f"wrote {W}/two_convs.safetensors")
