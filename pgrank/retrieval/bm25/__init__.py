"""BM25 (bm25s, Anserini-like analysis) and the BM25 retriever used by mining and evaluation.
"""
