"""Which weights a model name means (aliases, hub ids, offline copies with pinned checksums) and loading
them as sentence-transformers models, from safetensors only.
"""
