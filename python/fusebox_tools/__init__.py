"""fusebox's Python tools, by purpose (python/README.md):

core        graphs as fusebox's resolver gives them (graph), safetensors with numpy (safetensors_np),
            each op computed in PyTorch (torch_ops)
bench       speed against PyTorch on the GPU machine (bench_run, bench_report, ...)
models      whole networks as fusebox pipelines (minilm*, resnet50*)
crosscheck  correctness against independent computations (crosscheck, pipeline_crosscheck, ...)

Run a tool with `PYTHONPATH=python python3 -m fusebox_tools.SUB.MODULE`. core.graph needs only the
standard library and the fusebox binary; resnet50 and safetensors_np need numpy; most others torch."""
