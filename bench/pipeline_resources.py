"""A profile's whole pipeline from an empty workspace: time, peak RSS and disk, per stage.

``python bench/pipeline_resources.py --profile demo --out bench/out/pipeline_resources-demo.json`` runs
``pgrank --profile demo repro`` (what ``pgrank demo`` runs before it prints its tables) with a workspace, a
dataset folder and an artifact folder that must not exist yet (``--set paths.root=... --set paths.data=...
--set paths.embeddings=...``: the profiles share the last two), so that every stage runs from nothing. It then
reads each stage process's wall time and peak RSS from its MLflow run (:func:`stage_resources.stage_resources`) and
the bytes the run left in the workspace, the downloaded datasets and the artifacts (corpus embeddings, ONNX
exports). Datasets come from ``$PGRANK_BEIR_MIRROR`` (or ``--mirror``)
when set, as for ``pgrank demo``; models from the hub or its offline copies, as the profile says.

Example:
    $ PGRANK_BEIR_MIRROR=M python bench/pipeline_resources.py --profile demo --set paths.root=runs/demo-fresh \\
        --set paths.data=runs/demo-fresh-data/beir --set paths.embeddings=runs/demo-fresh-data/embeddings \\
        --out bench/out/pipeline_resources-demo.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from record import add_out_option, add_set_option, new_record, save, set_args  # noqa: E402
from stage_resources import disk_bytes, group_table, stage_resources  # noqa: E402

MIB = 2**20


def render(record: dict) -> str:
    run = record["run"]
    disk = run["disk_bytes"]
    return "\n".join([
        f"`pgrank --profile {run['profile']} repro` from an empty workspace: {run['pipeline_s']:,.0f} s in all, "
        f"{len(run['stages'])} stage runs. Disk after the run: workspace {disk['workspace'] / MIB:,.1f} MiB, "
        f"datasets {disk['data'] / MIB:,.1f} MiB, artifacts (embeddings, exports) {disk['embeddings'] / MIB:,.1f} MiB.",
        "", *group_table(run["groups"])])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="the profile to run, e.g. demo")
    add_set_option(parser, "train.epochs=2", "the pipeline")
    parser.add_argument("--mirror", type=Path, default=None,
                        help="a BEIR mirror folder (default: $PGRANK_BEIR_MIRROR, else BEIR's server)")
    add_out_option(parser, __file__)
    args = parser.parse_args()
    from pgrank.config import load_params
    from pgrank.paths import Paths

    params = load_params(ROOT / "params.yaml", args.overrides, args.profile)
    paths = Paths.from_config(params.paths, base=ROOT)
    for folder in (paths.root, paths.data, paths.embeddings):
        if folder.exists():
            print(f"pipeline_resources: error: {folder} exists; every stage must run from nothing, so remove it or "
                  "point paths.root, paths.data and paths.embeddings at new folders with --set", file=sys.stderr)
            return 2
    env = dict(os.environ)
    if args.mirror:
        env["PGRANK_BEIR_MIRROR"] = str(args.mirror.resolve())
    elif env.get("PGRANK_BEIR_MIRROR"):
        env["PGRANK_BEIR_MIRROR"] = str(Path(env["PGRANK_BEIR_MIRROR"]).resolve())
    cmd = ["pgrank", "--profile", args.profile, *set_args(args.overrides), "repro"]
    print("+ " + " ".join(cmd), flush=True)
    started = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)
    record = new_record(f"The {args.profile} profile's pipeline from an empty workspace: time, RAM and disk per stage")
    record["run"] = {"profile": args.profile, "overrides": args.overrides,
                     "pipeline_s": round(time.perf_counter() - started, 1), **stage_resources(paths.root),
                     "disk_bytes": {"workspace": disk_bytes(paths.root), "data": disk_bytes(paths.data),
                                    "embeddings": disk_bytes(paths.embeddings)}}
    save(record, args.out, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
