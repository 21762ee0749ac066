"""Whole networks as fusebox pipelines: all-MiniLM-L6-v2 (minilm, minilm_embed, minilm_sentences,
minilm_verify) and ResNet-50 (resnet50, resnet50_check)."""
