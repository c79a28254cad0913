"""The ``train`` stage: Neural PG-Rank training of a sentence-transformers bi-encoder (batches,
cached-gradient encoding, checkpoints, DDP).
"""
