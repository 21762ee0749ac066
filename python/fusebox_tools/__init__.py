"""fusebox's Python tools: graphs as fusebox resolves them (graph), the same
ops in PyTorch (torch_ops), and the checks and benchmarks built on them
(crosscheck, sdpa_compare, torch_compare; run each with `python3 -m`), and
models as pipelines (resnet50, numpy only; resnet50_check against torchvision).

Only graph needs nothing beyond the standard library and the fusebox binary;
resnet50 needs numpy; the others need torch and numpy."""
