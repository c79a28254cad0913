"""Datasets pgrank ships inside the package (``pgrank/download/datasets/``): zips that BEIR's server does not hold.

A ``data.sources`` entry ``{mirror: NAME.zip}`` names a zip of the BEIR mirror; when pgrank ships a zip of that name
(:data:`SHIPPED`), the mirror is optional for it: with no mirror named, or a mirror folder that lacks it, or a mirror
URL that does not serve it, ``pgrank download`` installs the copy shipped here (:func:`pgrank.download.sources.mirror_zip`).
Each shipped file is pinned by its SHA-256 and checked on every use (:func:`shipped_zip`); its provenance and license
are in ``pgrank/download/datasets/README.md``.
"""

from __future__ import annotations

from pathlib import Path

from pgrank.data.checksums import file_sha256
from pgrank.errors import DataError

FOLDER = Path(__file__).resolve().parent / "datasets"

# NAME.zip -> its SHA-256. The DBPedia-Entity subset of the CPU demo (profiles/demo.yaml): 50 queries of BEIR's
# DBPedia-Entity, 40 of them judged, over a 5,000-document pool; CC BY-SA 3.0, as DBpedia's.
SHIPPED: dict[str, str] = {
    "dbpedia-entity-subset.zip": "ca43eeff0b1b43eb42207ab126b0bb96d2d76b0c706e1aee86009d4abf8f35a1",
}


def shipped_zip(filename: str, folder: Path = FOLDER) -> Path | None:
    """The shipped copy of ``filename``, checked against its pinned SHA-256; ``None`` when pgrank ships no such file.

    Raises:
        DataError: the file is missing from the install, or its bytes are not the pinned ones.
    """
    pin = SHIPPED.get(filename)
    if pin is None:
        return None
    path = folder / filename
    if not path.is_file():
        raise DataError(f"{path}: pgrank's copy of {filename} is missing from this install; reinstall pgrank, or name "
                        f"a BEIR mirror that holds {filename}")
    digest = file_sha256(path)
    if digest != pin:
        raise DataError(f"{path}: sha256 mismatch (expected {pin}, pinned in pgrank/download/shipped.py, got {digest}); "
                        "the install is damaged: reinstall pgrank")
    return path
