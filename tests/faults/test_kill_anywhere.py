"""kill -9 anywhere: every stage of the shrunk demo, SIGKILLed at seeded moments, then ``dvc repro`` again.

One uninterrupted reference run of the shrunk demo (``pgrank --profile demo --set ...``: sliced scifact,
the tiny in-code BERT, two epochs, 64-document embedding shards) is traced (durations, bytes written,
fault points passed; tests/faults/supervision.py). For each kill, a copy of the finished workspace is
put back at the same path, the stage is "unrun" (its lock entry, outputs, run cache and the shared
data it creates removed), ``dvc repro`` is started and the stage's process SIGKILLed at the moment;
then ``dvc repro`` runs again, unsupervised, and must

* complete, re-running that stage alone, besides ``always_changed`` stages that every ``dvc repro`` runs
  (download), whose outputs must not change (every other stage stays locked at the reference's hashes,
  so a stage downstream would run again only if the outputs differed);
* leave every file byte-identical to the reference: DVC outputs and ``dvc.lock``, metrics, runs,
  candidate sets, tables and figures, model weights, tokenizers and model cards, the shared datasets
  and corpus embeddings (content-keyed caches built on first use, the corpus store and the corpus
  embeddings, may be absent until the next stage that needs them; one that is there must be identical);
* leave no temporary, partial download or lock file anywhere;
* leave no MLflow run ``RUNNING``; a resumed training run names the killed run it continues.

A bytes or seconds moment that never comes (the stage, rerun on the restored workspace, wrote less or
finished sooner than in the reference run) is drawn again at the same share of the run it missed, up to
three times; the report gives both the moment drawn and the one the kill came at.

The default suite kills each stage kind once (download mid-extract, mining mid-encode, training
mid-epoch 2, evaluation mid-write, tables mid-swap; MLflow off, which more than doubles a small stage's
time); the sweep (``pytest -m slow tests/faults``) kills at least five seeded moments per stage of the
DAG, with MLflow on.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from pathlib import Path

import pytest
from shrunk import project_copy, shrunk_overrides, sliced_scifact_mirror
from supervision import Moment, always_changed, at_point, differences, draw_moments, leftovers, repro, snapshot, unrun

# The shrunk demo, with two epochs (a kill in epoch 2 resumes from epoch 1's state) and 64-document
# embedding shards (a kill mid-encode leaves some finished shards).
EXTRA = ["train.epochs=2", "train.keep_epochs=[0, 1, 2]", "mine.chunk_size=64"]
SEED = 13
ATTEMPTS = 3  # a bytes or seconds moment that never came is drawn again from the run it missed


class Reference:
    """The traced uninterrupted run; :meth:`restore` puts its finished state back at the same path."""

    def __init__(self, tmp: Path, mirror: Path, tiny_model_dir: Path, *, tracking: bool = True):
        from pgrank.pipeline.workspace import prepare

        self.work, self.pristine = tmp / "work", tmp / "pristine"
        self.project = project_copy(self.work / "project")
        self.ws, self.data = self.project / "runs" / "demo", self.project / "data"
        self.env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PGRANK_PROFILE")}
        self.env.update(PGRANK_BEIR_MIRROR=str(mirror), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        self.tracking = tracking
        prepare(self.project / "params.yaml", "demo",
                shrunk_overrides(tiny_model_dir) + EXTRA + [f"tracking.enabled={str(tracking).lower()}"])
        started = time.perf_counter()
        self.outcome = repro(self.ws, self.env, trace=tmp / "trace")
        self.seconds = time.perf_counter() - started
        assert self.outcome.returncode == 0, self.outcome.output[-3000:]
        self.files = snapshot(self.ws, self.data)
        shutil.copytree(self.work, self.pristine, symlinks=True)
        # Artifacts a stage creates outside the workspace, shared by profiles: gone before it first runs.
        self.shared = {"download": [self.data / "beir"], "mine-train": [self.data / "embeddings"]}
        # Content-keyed caches built on first use by whichever stage needs them (the corpus store, token stores, the corpus
        # embeddings and BM25 index): removed with the shared data above, they come back when next needed, so
        # after a rerun of that stage alone an entry may be absent, but one that is there must be identical.
        self.caches = (f"{self.data.name}/beir/.stores/", f"{self.data.name}/beir/.tokens/", f"{self.data.name}/embeddings/")

    def restore(self, stage: str) -> None:
        shutil.rmtree(self.work)
        shutil.copytree(self.pristine, self.work, symlinks=True)
        unrun(self.ws, stage, self.shared)


def _reference(tmp_path_factory, beir_mirror, tiny_model_dir, tracking: bool) -> Reference:
    tmp = tmp_path_factory.mktemp("faults")
    mirror = sliced_scifact_mirror(beir_mirror / "scifact.zip", tmp / "mirror")
    return Reference(tmp, mirror, tiny_model_dir, tracking=tracking)


@pytest.fixture(scope="module")
def fast_reference(tmp_path_factory, beir_mirror, tiny_model_dir) -> Reference:
    """Without MLflow (which more than doubles a small stage's time; test_killed_runs.py and the sweep cover it)."""
    return _reference(tmp_path_factory, beir_mirror, tiny_model_dir, tracking=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, beir_mirror, tiny_model_dir) -> Reference:
    return _reference(tmp_path_factory, beir_mirror, tiny_model_dir, tracking=True)


def _mlflow_runs(ws: Path) -> list:
    if not (ws / "mlflow.db").is_file():
        return []
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    return client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=5000)


def kill_and_rerun(ref: Reference, stage: str, moment: Moment) -> dict:
    """Kill ``stage`` at ``moment``, run ``dvc repro`` again, check everything; return what happened."""
    started = time.perf_counter()
    drawn = moment
    for _ in range(ATTEMPTS):
        ref.restore(stage)
        before = {r.info.run_id for r in _mlflow_runs(ref.ws)}
        killed = repro(ref.ws, ref.env, target=stage, moment=moment)
        if killed.killed or killed.returncode != 0 or moment.fraction is None:
            break
        # The stage wrote less or ended sooner than in the reference run: the same share of this run.
        moment = moment.redrawn(killed.traces[stage])
    assert killed.killed == stage and killed.returncode != 0, (
        f"{stage} was not killed {moment} (exit {killed.returncode}):\n{killed.output[-2000:]}")
    rerun = repro(ref.ws, ref.env)
    assert rerun.returncode == 0, f"rerun after killing {stage} {moment} failed:\n{rerun.output[-3000:]}"
    files = snapshot(ref.ws, ref.data)
    differ = differences(files, ref.files, ref.caches)
    assert not differ, f"after killing {stage} {moment}, these differ from the reference: {differ}"
    expected = {stage} | always_changed(ref.ws)
    assert rerun.ran() == expected, f"the rerun ran {sorted(rerun.ran())}, expected only {sorted(expected)}"
    assert not leftovers(ref.ws, ref.data), f"left behind after killing {stage} {moment}: {leftovers(ref.ws, ref.data)}"
    runs = [r for r in _mlflow_runs(ref.ws) if r.info.run_id not in before]
    running = [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    assert not running, f"MLflow runs left RUNNING after killing {stage} {moment}: {running}"
    by_id = {r.info.run_id: r for r in runs}
    resumed = [r for r in runs if "pgrank.resumed_from" in r.data.tags]
    for run in resumed:
        previous = by_id.get(run.data.tags["pgrank.resumed_from"])
        assert previous is not None and previous.info.status == "KILLED", run.data.tags
    return {"stage": stage, "moment": str(moment), "drawn": str(drawn), "killed": True, "resumed": bool(resumed) or "resuming" in rerun.output,
            "seconds": round(time.perf_counter() - started, 1)}


# --------------------------------------------------------------------------------------- one kill per stage kind


def _fast_moments(ref: Reference) -> list[tuple[str, Moment]]:
    """One seeded kill per stage kind, at the moment the issue names for it."""
    rng = random.Random(SEED)
    traces = ref.outcome.traces
    plan = [
        ("download", at_point(traces["download"], rng, "extract.chunk", label="mid-extract")),
        ("mine-train", at_point(traces["mine-train"], rng, "atomic.renamed", r"^shard-0000[0-2]", "mid-encode")),
        ("train@minilm-pg", Moment("output", (r"epoch 2/2", rng.randint(1, 3)), "mid-epoch 2")),
        ("evaluate-bm25@bm25-scifact", at_point(traces["evaluate-bm25@bm25-scifact"], rng, "run.query",
                                                label="mid-write of a run")),
        ("tables", at_point(traces["tables"], rng, "atomic.written", "^tables$", "tables written, not yet renamed")),
    ]
    assert all(moment is not None for _, moment in plan), plan
    return plan


@pytest.mark.integration  # a traced reference run plus five kills and reruns: minutes
@pytest.mark.timeout(3600)  # the reference run is shared with the sweep: its setup counts here
def test_one_kill_per_stage_leaves_what_an_uninterrupted_run_leaves(fast_reference):
    for stage, moment in _fast_moments(fast_reference):
        result = kill_and_rerun(fast_reference, stage, moment)
        assert result["resumed"] == stage.startswith("train"), result  # epoch 2 resumes from epoch 1's state


# --------------------------------------------------------------------------------------- the sweep


def _sweep(ref: Reference) -> list[tuple[str, Moment]]:
    """At least five seeded moments per stage; the kinds the issue names come first."""
    rng = random.Random(SEED)
    plan = []
    for stage, trace in sorted(ref.outcome.traces.items()):
        named = [at_point(trace, rng, point, detail, label) for point, detail, label in [
            ("download.chunk", "", "mid-transfer"), ("extract.chunk", "", "mid-extract"),
            ("atomic.renamed", r"^shard-", "mid-encode"), ("run.query", "", "mid-write of candidate sets or runs"),
            ("atomic.written", "", "mid-atomic write"), ("atomic.swapped", "", "mid-swap of a folder")]]
        named = [m for m in named if m is not None]
        if stage.startswith("train"):
            named += [Moment("output", (rf"epoch {epoch}/2", rng.randint(1, 3)), f"mid-epoch {epoch}") for epoch in (1, 2)]
        plan += [(stage, m) for m in draw_moments(trace, rng, max(5, len(named) + 2), named)]
    return plan


@pytest.mark.slow
@pytest.mark.timeout(6 * 3600)
def test_sweep_kills_every_stage_at_seeded_moments(reference, tmp_path):
    started = time.perf_counter()
    results, failures = [], []
    for stage, moment in _sweep(reference):
        try:
            results.append(kill_and_rerun(reference, stage, moment))
        except AssertionError as exc:
            failures.append(f"{stage} {moment}: {exc}")
            results.append({"stage": stage, "moment": str(moment), "failed": str(exc)[:500]})
    per_stage = {}
    for r in results:
        per_stage[r["stage"]] = per_stage.get(r["stage"], 0) + 1
    summary = {"kills": len(results), "per_stage": per_stage, "failures": len(failures),
               "sweep_seconds": round(time.perf_counter() - started), "reference_seconds": round(reference.seconds),
               "results": results}
    out = Path(os.environ.get("PGRANK_FAULT_REPORT", tmp_path / "sweep.json"))
    out.write_text(json.dumps(summary, indent=2))
    print(json.dumps({k: v for k, v in summary.items() if k != "results"}, indent=2))
    assert not failures, "\n".join(failures)
    assert all(n >= 5 for n in per_stage.values()) and len(per_stage) == 8, per_stage
