"""The ``tables`` stage: every table of the paper regenerated next to the published numbers (Markdown,
LaTeX, figures).
"""
