"""pgrank: Neural PG-Rank, policy-gradient training of dense retrievers as Plackett-Luce ranking policies.

The package is laid out as the pipeline (``dvc.yaml``): ``core`` (the pure math), ``data`` (download),
``models``, ``retrieval/<kind>``, ``mining``, ``training``, ``evaluation``, ``reporting`` and ``pipeline``,
over the top-level ``config``, ``paths``, ``errors``, ``atomic`` and ``tracking``. See docs/architecture.md.
"""

__version__ = "0.1.0"
