"""The storage every stage reads: BEIR folders read with BEIR's contract, the corpus and candidate stores
(memory-mapped columns), TREC run files and file checksums. Writing the datasets is the ``download``
stage's (:mod:`pgrank.download`).
"""
