"""Correctness against independent computations: fusebox's outputs against PyTorch per graph
(crosscheck) and per pipeline (pipeline_crosscheck), the Python module against the CLI
(pymod_check), random valid graphs for sweeps (graph_gen) and chunked attention recombined
(sdpa_chunks)."""
