"""``pgrank download``: the stage that makes every dataset of the configuration readable, and records it.

For each dataset it names (:func:`default_datasets`): a BEIR dataset is fetched, verified, extracted and
validated (:mod:`pgrank.download.beir_datasets`); a dataset of your own under ``data.sources`` is read in
place or fetched from its own zip, validated the same way (:mod:`pgrank.download.sources`), or built from
another dataset, after it: half documents of its corpus (:mod:`pgrank.download.halves`) or one of its splits cut
in two by query hash (:mod:`pgrank.download.hash_split`). Then each
dataset's content manifest is written (:mod:`pgrank.download.manifests`: what DVC tracks of the shared
datasets), and, when ``data.train``'s dataset is among them, the seeded carve-out (train-pg, validation, gate-pg)
(:mod:`pgrank.download.carve_out`).

Example:
    >>> report = download(params, paths, ["scifact"], mirror="../shared/data/beir")
    >>> report.datasets[0].status
    'downloaded'
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pgrank import tracking
from pgrank.config import Params
from pgrank.download.beir_datasets import Fetched, fetch_dataset, read_sha256sums
from pgrank.download.carve_out import CarveOut, write_carve_out
from pgrank.download.halves import install_halves
from pgrank.download.hash_split import install_split
from pgrank.download.manifests import write_manifest, write_validation_sets_manifest
from pgrank.download.mirror import resolve_source
from pgrank.download.sources import install_source
from pgrank.paths import Paths


@dataclass(frozen=True)
class DownloadReport:
    datasets: list[Fetched]
    carve_out: CarveOut | None


def default_datasets(params: Params) -> list[str]:
    """Every dataset named in ``data.train``, ``train.validation_sets`` and ``data.eval_sets``, in that
    order, once each."""
    names = [params.data.train.split("/")[0]] + [s.split("/")[0] for s in params.train.validation_sets] \
        + [s.split("/")[0] for s in params.data.eval_sets]
    return list(dict.fromkeys(names))


def with_parents(names: list[str], sources: dict) -> list[str]:
    """``names`` with the dataset that each derived source (half documents, a hash split) is built from placed
    before it (added when missing)."""
    out: list[str] = []
    for name in names:
        of = sources[name].derived_of if name in sources else None
        out += [of, name] if of is not None else [name]
    return list(dict.fromkeys(out))


def _install(name: str, params: Params, paths: Paths, source, sums, config_dir, progress: bool) -> Fetched:
    """One dataset made readable: a source of your own, half documents of another dataset, or a BEIR download."""
    own = params.data.sources
    if name not in own:
        return fetch_dataset(name, paths.dataset(name), source, sums, progress=progress)
    if own[name].halves is not None:
        of = own[name].halves.of
        status = install_halves(name, own[name].halves, paths.dataset(of), paths.dataset(name), paths.fingerprint_cache(of))
    elif own[name].split is not None:
        of = own[name].split.of
        status = install_split(name, own[name].split, paths.dataset(of), paths.dataset(name), paths.fingerprint_cache(of))
    else:
        status = install_source(name, own[name], paths.dataset(name), paths.fingerprint_cache(name),
                                config_dir or Path.cwd(), progress=progress, mirror=source, sums=sums)
    return Fetched(name, paths.dataset(name), status)


def download(
    params: Params, paths: Paths, datasets: list[str] | None = None, mirror: str | None = None,
    *, config_dir: str | Path | None = None, progress: bool = True,
) -> DownloadReport:
    """The ``pgrank download`` stage: fetch ``datasets`` and write the carve-out of ``data.train``.

    Args:
        params: the parsed ``params.yaml`` (reads ``data.*``).
        paths: artifact locations (datasets go to ``paths.dataset(name)``).
        datasets: BEIR names or ``data.sources`` names; default :func:`default_datasets`.
        mirror: folder or URL replacing BEIR's server; default ``$PGRANK_BEIR_MIRROR``, then ``data.mirror``.
        config_dir: the params file's folder, against which a relative ``data.mirror`` or source path is resolved.
        progress: show progress bars.

    Returns:
        What happened to each dataset, and the carve-out when ``data.train``'s dataset was among them.
        Each dataset's manifest (:mod:`pgrank.download.manifests`) is written, the DVC-tracked output.
    """
    names = list(dict.fromkeys(datasets)) if datasets else default_datasets(params)
    if params.data.train.split("/")[0] in names:  # its carve-out records the out-of-domain validation sets too
        names = list(dict.fromkeys(names + [s.split("/")[0] for s in params.train.validation_sets]))
    own = params.data.sources  # datasets of your own (pgrank.download.sources): read in place, or fetched from their URL
    names = with_parents(names, own)  # derived sources (halves, hash splits) come after the dataset they cut
    with tracking.stage_run(params, paths, "download", tags={"stage": "download"}, log_params={"datasets": names},
                            enabled=params.tracking.enabled, resources=True, spool=True):
        mirrored = [n for n in names if n not in own or own[n].mirror is not None]  # BEIR names, mirror zips
        source = resolve_source(mirror, params.data.mirror, config_dir=config_dir) if mirrored else None
        sums = read_sha256sums(source) if source is not None else None
        fetched = [_install(name, params, paths, source, sums, config_dir, progress) for name in names]
        for name in names:
            write_manifest(paths, name)
        carve = None
        if params.data.train.split("/")[0] in names:
            carve = write_carve_out(paths, params.data)
            write_validation_sets_manifest(paths, carve.dataset, params.train.validation_sets)
    return DownloadReport(fetched, carve)
