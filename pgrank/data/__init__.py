"""The ``download`` stage: BEIR datasets fetched, verified, extracted and validated; their content
manifests; the seeded validation carve-out; and the TREC run files every stage reads and writes.
"""
