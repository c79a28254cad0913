"""Learned sparse retrieval (SPLADEv2) through sentence-transformers' SparseEncoder.
"""
