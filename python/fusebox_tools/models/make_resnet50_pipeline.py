#!/usr/bin/env python3
"""Writes ResNet-50 inference (torchvision's architecture, bf16 NHWC, batch
norm folded into the convolutions) as a fusebox pipeline: models/resnet50/
(git-ignored) gets resnet50.json, graphs/ (one per distinct layer shape),
weights/ (folded, .npy) and resnet50_state_dict.npz (the unfolded weights in
torchvision's state_dict names, for the torch reference). docs/models.md.

    PYTHONPATH=python python3 -m fusebox_tools.models.make_resnet50_pipeline [--out models/resnet50] [--batch 8] [--seed 50]
        [--max-batch M]

--max-batch M makes the batch a symbolic dim N in [1, M] (default --batch)
in every graph; without it the graphs are static. The folder must be new,
empty or made by this script (it then rewrites its files).
"""
import argparse
import os
import sys
import time

from fusebox_tools.core.graph import REPO_ROOT as ROOT
from fusebox_tools.models import resnet50


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "models", "resnet50"), help="output folder")
    ap.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    ap.add_argument("--seed", type=int, default=50, help="weights seed (default 50)")
    ap.add_argument("--max-batch", type=int, default=None,
                    help="make the batch a symbolic dim N in [1, MAX_BATCH], default --batch")
    args = ap.parse_args()
    t = time.time()
    try:
        path = resnet50.write_resnet50(args.out, batch=args.batch, seed=args.seed, max_batch=args.max_batch)
    except (ValueError, OSError) as e:
        print(f"make_resnet50_pipeline: {e}", file=sys.stderr)
        return 2
    print(f"make_resnet50_pipeline: wrote {path} (batch {args.batch}, seed {args.seed}) in {time.time() - t:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
