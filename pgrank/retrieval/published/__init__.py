"""The authors' published candidate sets (``mine.source: published``), converted to runs.
"""
