"""Dense retrieval: inference encoding, corpus-embedding artifacts, exact inner-product search, and the
dense retriever used by mining and evaluation.
"""
