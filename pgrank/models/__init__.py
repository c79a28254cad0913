"""Models: which weights a name means (``names``: aliases, hub ids at pinned revisions, offline copies with pinned
checksums), loading them as sentence-transformers models from safetensors only (``loading``), how they run forward
outside training (``backends``), and what pgrank records beside a checkpoint it trains (``checkpoint_meta``).
"""
