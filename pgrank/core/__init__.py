"""The pure math of Neural PG-Rank: the Plackett-Luce policy, ranking utilities, the policy-gradient
estimators, and run evaluation with trec_eval's conventions. Tensors in, tensors out; imports nothing of pgrank.
"""
