"""The ``evaluate`` stages: second-stage reranking and first-stage retrieval of every system, with
paired significance of each policy against its warm start.
"""
