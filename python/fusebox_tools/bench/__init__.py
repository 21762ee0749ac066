"""Speed, measured side by side with PyTorch on the GPU machine: `make bench`'s parts (bench_run),
their report and merge (bench_report, bench_merge), SDPA against torch (sdpa_compare), the older
per-graph comparison (torch_compare), MiniLM against sentence-transformers (st_compare) and the
torch.compile variants of whole networks (model_variants)."""
