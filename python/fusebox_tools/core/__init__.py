"""What every fusebox tool shares: graphs as fusebox's resolver gives them (graph), safetensors
with numpy alone (safetensors_np), and each op computed in PyTorch (torch_ops)."""
