"""Benchmark of ``pgrank tables``: the time :func:`pgrank.reporting.tables.make_tables` takes. Measures; never asserts.

Writes ``bench/out/tables.json`` (``--out``; with the machine) and prints its figures.

Input: a full-size synthetic results set in a temporary project, shaped like the paper's run: the 15
eval sets x 6 systems (``params.yaml`` as committed: 4 comparison systems and 2 policies) x 2 stages,
plus the epoch ablation's ``pgrank-X@2`` (rerank), significance in every PG-Rank file, and a training
curve of paper size per warm start (6 epochs x ``--steps-per-epoch`` steps). No BEIR folder, so the
statistics table shows "—" on our side (counting the MS MARCO corpus is I/O, not table making).

    python bench/tables.py --repeats 3
    python bench/tables.py --formats md,tex      # without the PNG figures
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pgrank.config import load_params  # noqa: E402
from pgrank.paths import Paths  # noqa: E402
from pgrank.reporting.tables import make_tables, needed_systems, table_systems  # noqa: E402
from record import add_out_option, new_record, save, table  # noqa: E402

TITLE = "pgrank tables: making every table and figure of the paper's full results set"


def write_results(params, paths: Paths, steps_per_epoch: int, seed: int = 0) -> int:
    """Write metrics files for every (system, eval set, stage) and curves; return the file count."""
    rng = random.Random(seed)
    count = 0
    for system in needed_systems(params):
        stages = ("rerank",) if "@" in system else tuple(params.evaluate.stages)
        for eval_set in params.data.eval_sets:
            dataset, split = eval_set.split("/")
            for stage in stages:
                metrics = {f"ndcg@{k}": rng.random() for k in (1, 3, 5, 10)}
                metrics.update({"mrr@10": rng.random(), "recall@100": rng.random()})
                significance = None
                if system.startswith("pgrank-"):
                    significance = {"baseline": system.removeprefix("pgrank-").split("@")[0], "test": "student",
                                    "alpha": 0.05, "p_values": {k: rng.random() / 10 for k in metrics},
                                    "significant": {k: rng.random() < 0.5 for k in metrics}}
                folder = paths.results(system, dataset, split, stage)
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "metrics.json").write_text(json.dumps({
                    "system": system, "dataset": dataset, "split": split, "stage": stage, "queries": 100,
                    "metrics": metrics, "significance": significance}))
                count += 1
    for warm in params.train.warm_starts:
        folder = paths.training_log(warm)
        folder.mkdir(parents=True, exist_ok=True)
        rows = ["step,epoch,loss,utility,grad_norm,entropy"]
        for step in range(1, params.train.epochs * steps_per_epoch + 1):
            rows.append(f"{step},{(step - 1) // steps_per_epoch + 1},{rng.random():.6g},{rng.random():.6g},"
                        f"{rng.random():.6g},{rng.random():.6g}")
        (folder / "curve.csv").write_text("\n".join(rows) + "\n")
        history = [{"epoch": e, "val_ndcg@10": rng.random()} for e in range(params.train.epochs + 1)]
        (folder / "history.json").write_text(json.dumps(history))
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--formats", default="md,tex,png", help="tables.formats, comma-separated")
    parser.add_argument("--steps-per-epoch", type=int, default=2277, help="paper: ~501k queries / 220 per step")
    add_out_option(parser, __file__)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        overrides = ["paths.root=runs", "paths.data=data", "paths.embeddings=emb",
                     f"tables.formats=[{args.formats}]"]
        params = load_params(ROOT / "params.yaml", overrides=overrides)
        paths = Paths.from_config(params.paths, base=tmp)
        files = write_results(params, paths, args.steps_per_epoch)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            written = make_tables(params, paths)
            times.append(time.perf_counter() - start)
    record = new_record(TITLE)
    record.update(eval_sets=len(params.data.eval_sets), systems=len(table_systems(params)), metrics_files=files,
                  curve_steps=params.train.epochs * args.steps_per_epoch, formats=args.formats.split(","),
                  files_written=len(written), seconds=times)
    save(record, args.out, render)


def render(record: dict) -> str:
    """The record as the Markdown the script prints."""
    r = record
    return "\n".join([
        f"pgrank tables: {r['eval_sets']} eval sets x {r['systems']} systems, {r['metrics_files']} metrics files, "
        f"curves of {r['curve_steps']} steps, formats {','.join(r['formats'])}: {r['files_written']} files written", "",
        *table(["make_tables: best s", "median s", "runs"],
               [[f"{min(r['seconds']):.2f}", f"{statistics.median(r['seconds']):.2f}", len(r["seconds"])]], "rrr")])


if __name__ == "__main__":
    main()
