"""Question: Does the exported policy give pgrank's figures in plain sentence-transformers?
Record: ``studies/out/exported_policy-*.json``
Page: ``docs/findings/export.md``

A finished run's policy exported and searched with plain sentence-transformers, against what pgrank evaluated.

``python studies/exported_policy.py --profile demo`` exports the profile's policy (``pgrank export --to DIR``), then
in a separate Python process that never imports pgrank loads it with ``SentenceTransformer(DIR)`` and, for every
evaluation set of the profile (``data.eval_sets``), on the queries pgrank evaluated:

* **rerank**: scores each query's candidate set (the workspace's candidate store) with ``model.similarity`` of
  ``encode_query`` and ``encode_document``;
* **first stage**: encodes the whole corpus with ``encode_document`` and takes each query's 100 best documents.

The policy's warm start is searched the same way, loaded as plain ``SentenceTransformer`` from the folder pgrank
resolves it to (a ``tower: query`` policy's document route is the warm start, so their corpus embeddings are computed
once). nDCG@10 of those runs (pytrec_eval, as pgrank evaluates) is compared with the ``metrics.json`` that ``pgrank
evaluate`` wrote for the same system and stage. pgrank's evaluation may run a faster inference backend
(``models.backend``: ``auto`` picks ONNX int8 on a CPU without AMX; the demo runs its warm start on ONNX float32) and
reads corpus embeddings stored at float16; plain sentence-transformers runs the weights in float32. The record holds,
per set and stage, both figures of the policy and their difference, and the policy's gain over its warm start under
each: whether what pgrank reported holds for someone who loads both models in plain float32.

Example:
    $ python studies/exported_policy.py --profile demo --set paths.root=runs/demo-fresh \\
        --set paths.data=runs/demo-fresh-data/beir --set paths.embeddings=runs/demo-fresh-data/embeddings
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "bench"))  # record: the plumbing shared with bench/
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

from record import add_out_option, add_set_option, new_record, save, set_args, table  # noqa: E402

TOP_K = 100

PLAIN = """
import json, sys
import torch
from sentence_transformers import SentenceTransformer

policy_folder, task_file, out = sys.argv[1:]
task = json.load(open(task_file))
docs = [json.loads(line) for line in open(task["corpus"])]
ids = [i for i, _ in docs]
where = {i: j for j, i in enumerate(ids)}
runs, shared = {}, None
for name, folder, revision in (("policy", policy_folder, None),
                               ("warm_start", task["warm_start"], task["warm_start_revision"])):
    model = SentenceTransformer(folder, device="cpu", revision=revision)
    q = model.encode_query(task["queries"], batch_size=64, convert_to_tensor=True)
    if shared is None or not task["shared_documents"]:
        shared = model.encode_document([t for _, t in docs], batch_size=64, convert_to_tensor=True)
    scores = model.similarity(q, shared)
    rerank = {qid: {doc: float(scores[n, where[doc]]) for doc in task["candidates"][qid]}
              for n, qid in enumerate(task["qids"])}
    best = torch.topk(scores, min(task["top_k"], len(ids)), dim=1)
    full = {qid: {ids[j]: float(s) for s, j in zip(best.values[n].tolist(), best.indices[n].tolist())}
            for n, qid in enumerate(task["qids"])}
    runs[name] = {"rerank": rerank, "full": full}
runs["pgrank_imported"] = any(m.split(".")[0] == "pgrank" for m in sys.modules)
json.dump(runs, open(out, "w"))
"""


def task_of(params, paths, eval_set: str, systems: dict[str, str], folder: Path) -> tuple[dict, dict, dict]:
    """The plain process's task for one evaluation set (its corpus as a JSONL of ``[id, text]``), its qrels, and
    pgrank's recorded metrics per stage of each of ``systems`` (``{"policy": name, "warm_start": name}``)."""
    from pgrank.data.beir import load_topics
    from pgrank.data.candidate_store import open_candidates
    from pgrank.data.corpus_store import open_corpus

    dataset, split = eval_set.split("/")
    system = systems["policy"]
    recorded = {stage: {role: json.loads((paths.results(name, dataset, split, stage) / "metrics.json").read_text())
                        for role, name in systems.items()}
                for stage in params.evaluate.stages}
    evaluated = {stage: set(json.loads((paths.results(system, dataset, split, stage) / "per_query.json").read_text()))
                 for stage in params.evaluate.stages}
    qids = sorted(set.union(*evaluated.values()))
    queries, qrels = load_topics(paths, dataset, split)
    corpus = open_corpus(paths, dataset)
    candidates = open_candidates(paths, dataset, split)
    ids = corpus.ids
    texts = folder / f"{dataset}.jsonl"
    with open(texts, "w") as fh:
        for lo, block in corpus.text_blocks():
            for i, text in enumerate(block):
                fh.write(json.dumps([str(ids[lo + i]), text]) + "\n")
    task = {"qids": qids, "queries": [queries[q] for q in qids], "corpus": str(texts), "top_k": TOP_K,
            "candidates": {q: [str(ids[r]) for r in candidates.candidates(candidates.index(q))[0]] for q in qids}}
    return task, {q: qrels[q] for q in qids}, {"recorded": recorded, "evaluated": evaluated}


def measure(overrides: list[str], profile: str) -> dict:
    from pgrank.config import load_params
    from pgrank.core.trec_eval import evaluate_run, mean_metrics
    from pgrank.evaluation.systems import warm_start_of
    from pgrank.export.folder import default_policy
    from pgrank.models.names import resolve_model
    from pgrank.paths import Paths

    params = load_params(ROOT / "params.yaml", overrides, profile)
    ws = ROOT / params.paths.root
    params = load_params(ws / "params.yaml")
    paths = Paths.from_config(params.paths, base=ws)
    system = default_policy(params, paths)
    warm = warm_start_of(system)
    ref = resolve_model(warm, params.models)
    systems = {"policy": system, "warm_start": warm}
    out = {"policy": system, "warm_start": warm, "backend": params.models.backend,
           "backends": dict(params.models.backends), "tower": params.train.tower, "sets": {}}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    with tempfile.TemporaryDirectory(prefix="exported-policy-") as tmp:
        folder = Path(tmp)
        cmd = ["pgrank", "--profile", profile, *set_args(overrides), "export", "--to",
               str(folder / "policy")]
        subprocess.run(cmd, cwd=ROOT, check=True)
        for eval_set in params.data.eval_sets:
            task, qrels, facts = task_of(params, paths, eval_set, systems, folder)
            task.update(warm_start=ref.source, warm_start_revision=ref.revision,
                        shared_documents=params.train.tower == "query")
            (folder / "task.json").write_text(json.dumps(task))
            subprocess.run([sys.executable, "-c", PLAIN, str(folder / "policy"), str(folder / "task.json"),
                            str(folder / "run.json")], cwd=folder, env=env, check=True)
            plain = json.loads((folder / "run.json").read_text())
            assert not plain["pgrank_imported"]
            stages = {}
            for stage, recorded in facts["recorded"].items():
                asked = {q: qrels[q] for q in facts["evaluated"][stage]}
                ndcg = {}
                for role in systems:
                    run = {q: plain[role][stage][q] for q in asked}
                    _, per_query = evaluate_run(asked, run, (10,),
                                                ignore_identical_ids=params.evaluate.ignore_identical_ids)
                    ndcg[role] = (mean_metrics(per_query)["ndcg@10"], recorded[role]["metrics"]["ndcg@10"])
                (mine, theirs), (warm_mine, warm_theirs) = ndcg["policy"], ndcg["warm_start"]
                stages[stage] = {"queries": len(asked), "plain": round(mine, 6), "pgrank": round(theirs, 6),
                                 "difference": round(mine - theirs, 6),
                                 "warm_start_plain": round(warm_mine, 6), "warm_start_pgrank": round(warm_theirs, 6),
                                 "gain_plain": round(mine - warm_mine, 6), "gain_pgrank": round(theirs - warm_theirs, 6)}
            out["sets"][eval_set] = stages
    return out


def render(record: dict) -> str:
    r = record["result"]
    rows = [(eval_set, stage, s["queries"], f"{s['pgrank']:.4f}", f"{s['plain']:.4f}", f"{s['difference']:+.4f}")
            for eval_set, stages in r["sets"].items() for stage, s in stages.items()]
    per_model = "".join(f", `models.backends.{name}: {b}`" for name, b in (r.get("backends") or {}).items())
    lines = [
        f"Policy `{r['policy']}` exported and loaded with plain `SentenceTransformer(DIR)` (float32), against "
        f"`pgrank evaluate` (`models.backend: {r['backend']}`{per_model}, corpus embeddings stored at float16): "
        "nDCG@10 on the queries pgrank evaluated.", "",
        *table(("set", "stage", "queries", "pgrank evaluate", "plain sentence-transformers", "difference"), rows,
               "llrrrr")]
    gains = [(eval_set, stage, f"{s['warm_start_pgrank']:.4f}", f"{s['warm_start_plain']:.4f}",
              f"{s['gain_pgrank']:+.4f}", f"{s['gain_plain']:+.4f}")
             for eval_set, stages in r["sets"].items() for stage, s in stages.items() if "gain_plain" in s]
    if gains:  # records written before the warm start was searched too hold the policy alone
        lines += ["", f"The policy's gain over its warm start `{r['warm_start']}`, searched the same two ways "
                  "(nDCG@10, policy − warm start):", "",
                  *table(("set", "stage", "warm start, pgrank evaluate", "warm start, plain", "gain, pgrank evaluate",
                          "gain, plain"), gains, "llrrrr")]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True, help="the profile whose finished run to check, e.g. demo")
    add_set_option(parser, "paths.root=runs/demo-2", "the finished run: the overrides it was made with")
    add_out_option(parser, __file__)
    args = parser.parse_args()
    record = new_record("A trained policy exported and searched with plain sentence-transformers")
    record["result"] = measure(args.overrides, args.profile)
    save(record, args.out, render)
    return 0


if __name__ == "__main__":
    sys.exit(main())
