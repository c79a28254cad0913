"""Gather the wheels a lent GPU machine needs for ``bench/gpu_check.py``: ``python3 bench/gpu_wheels.py``.

The lent machines run an image with Python 3.12 on x86-64 Linux, PyTorch 2.11 (CUDA 13), transformers,
sentence-transformers, numpy, scipy, pyarrow, PyYAML, typer, filelock, pytest and much else, and no network. Of what
pgrank needs for the check's five sections (the paper-shape step, the encoders, ``pytest -m gpu`` with its whole
tiny training run, exact search), the image lacks only :data:`LACKING`; this script downloads exactly those, for
that Python and platform, into ``.whl/`` (ignored by git), with ``pip download --no-deps --only-binary=:all:``, at
the versions installed here (the ones the tests here run), and checks that the folder stays well under the 64 MiB
that may travel with the repository (:data:`LIMIT_MIB`).

On the lent machine (``bench/gpu_check.sh`` does it)::

    python3 -m pip install --no-index --find-links .whl --no-deps --target /tmp/pgrank-site .whl/*.whl
    export PYTHONPATH=/tmp/pgrank-site:$PWD

``--no-index`` keeps pip off the network; ``--no-deps`` because :data:`LACKING` names every wheel needed, the
dependencies of the image's own packages being there already.

Left out: ``faiss-gpu`` (its CUDA 12 wheel is 135 MB, over the limit: section 5 then times torch's exact search
alone and says so); MLflow, DVC and Prefect (the check and the GPU tests track nothing and run no pipeline).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the lent image lacks and the check imports: pgrank's config (pydantic and the three packages it needs beyond
# the image's typing-extensions) and validation's trec_eval (pytrec-eval-terrier, for pytest -m gpu's training run).
LACKING = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "pytrec-eval-terrier")
PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
LIMIT_MIB = 16  # well under the 64 MiB that travels, together with the repository (about 6 MiB)


def pins(names=LACKING) -> list[str]:
    """``name==version`` of each at the version installed here (unpinned where it is not installed)."""
    out = []
    for name in names:
        try:
            out.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            out.append(name)
    return out


def download(folder: Path, names=LACKING) -> list[Path]:
    """Download the wheels of ``names`` for the lent image's Python and platform into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               PYTHON, "--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(folder),
               *pins(names)]
    subprocess.run(command, check=True)
    return sorted(folder.glob("*.whl"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, default=ROOT / ".whl", help="where the wheels go (default .whl/)")
    args = parser.parse_args()
    wheels = download(args.folder)
    names = {w.name.split("-")[0].lower().replace("_", "-") for w in wheels}
    missing = [n for n in LACKING if n.replace("_", "-") not in names]
    mib = sum(w.stat().st_size for w in wheels) / 2**20
    for wheel in wheels:
        print(f"  {wheel.name} ({wheel.stat().st_size / 2**20:.1f} MiB)")
    print(f"{len(wheels)} wheels, {mib:.1f} MiB in {args.folder}")
    if missing:
        print(f"error: no wheel for {', '.join(missing)}", file=sys.stderr)
        return 1
    if mib > LIMIT_MIB:
        print(f"error: {mib:.1f} MiB of wheels, over the {LIMIT_MIB} MiB kept for them", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
