"""The ``download`` stage: BEIR datasets fetched (:mod:`~pgrank.download.transfer`), verified, extracted and
validated, datasets of your own read in place, their content manifests, and the seeded validation carve-out
of ``data.train``. Only the ``download`` stage of ``dvc.yaml`` runs this package; every other stage reads
what it wrote through :mod:`pgrank.data`.
"""
