"""The ``mine`` stage: stage-1 candidate sets, every judged-relevant document plus the retriever's best others.
"""
