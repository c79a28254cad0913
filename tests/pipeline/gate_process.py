"""One gate decision in a process of its own, as :func:`pgrank.pipeline.retraining.gate_workspace` takes it, minus
the model evaluation: the lease in the registry, the reconciliation, with ``--freeze WORKSPACE`` the freeze of the
gate set (a toy project's gate split, ``tests/toy_project.py``), the error budget's level, the rule, the four steps of
the ledger (record, alias, tag, run) and the release. ``tests/pipeline/test_gate_server.py`` runs two at
once against one tracking server, and kills one with SIGKILL at a chosen step.

    python tests/pipeline/gate_process.py URI MODEL CHALLENGER [--worse] [--hold-until FILE] [--ttl S] [--wait S]
        [--freeze WORKSPACE] [--kill-at STEP]

Per-query values are made up (300 gate queries, a clear gain, or a clear loss with ``--worse``); everything else is
the product's code. A refused lease prints the product's one ``pgrank: error:`` line and exits 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

STEPS = ("lease", "freeze", "freeze tag", "freeze adopted", "record", "counter", "alias", "version tag", "run",
         "run logged", "mark", "release")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("uri")
    parser.add_argument("model")
    parser.add_argument("challenger")
    parser.add_argument("--worse", action="store_true")
    parser.add_argument("--hold-until", type=Path, default=None,
                        help="'evaluate' while holding the lease until this file exists (at most 300 s)")
    parser.add_argument("--ttl", type=float, default=600.0)
    parser.add_argument("--wait", type=float, default=0.0)
    parser.add_argument("--kill-at", choices=STEPS, default=None)
    parser.add_argument("--freeze", type=Path, default=None,
                        help="freeze the gate split of the toy project in this folder (tests/toy_project.py) first")
    args = parser.parse_args()

    import mlflow
    import numpy as np

    from pgrank.config import parse_params
    from pgrank.errors import PgrankError
    from pgrank.paths import Paths
    from pgrank.pipeline import decisions, gate
    from pgrank.pipeline.champion import champion, decide, log_decision
    from pgrank.pipeline.retraining import budget_after, budget_level, budget_words

    where = {"root": "r", "data": "d", "embeddings": "e"}
    data = {"train": "x/train", "eval_sets": ["x/test"]}
    if args.freeze:  # the toy project's layout and carve-out (tests/toy_project.py, data.gate_size 6)
        where = {"root": str(args.freeze / "runs"), "data": str(args.freeze / "data"), "embeddings": str(args.freeze / "emb")}
        data = {"train": "toy/train", "validation_size": 6, "gate_size": 6, "eval_sets": ["toy/train"], "mirror": None}
    params = parse_params({"paths": where, "data": data, "train": {"warm_starts": ["m"]},
                           "evaluate": {"systems": {"dense": ["m"]}},
                           "tracking": {"uri": args.uri, "experiment": "pgrank", "registered_model": args.model},
                           "champion": {"alpha": None, "budget": 0.05, "horizon": 52, "budget_rule": "elond",
                                        "first": "promote"}})
    paths = Paths.from_config(params.paths, base=os.getcwd())
    client = mlflow.MlflowClient(args.uri)

    def step(name: str):
        """SIGKILL this process when it reaches step ``name`` (before the step's write), if told to."""
        if args.kill_at == name:
            os.kill(os.getpid(), signal.SIGKILL)

    def before(method: str):
        original = getattr(client, method)

        def wrapped(*a, **kw):
            key = a[1] if method == "set_registered_model_tag" and len(a) > 1 else None
            name = {"create_registered_model": "lease", "set_registered_model_alias": "alias",
                    "set_model_version_tag": "version tag", "delete_registered_model": "release"}.get(method)
            if method == "set_registered_model_tag":
                name = ("counter" if key == decisions.COUNTER else "mark" if str(key).endswith(".run")
                        else "record" if str(key).startswith(decisions.RECORD_PREFIX)
                        else "freeze tag" if key == gate.GATE_SET_TAG else None)
            if name:
                step(name)
            done = original(*a, **kw)
            if name == "freeze tag":
                step("freeze adopted")  # the model names the set; its run has not ended
            return done
        setattr(client, method, wrapped)

    for method in ("create_registered_model", "set_registered_model_tag", "set_registered_model_alias",
                   "set_model_version_tag", "delete_registered_model"):
        before(method)

    def log(decision, key=None):
        original = mlflow.log_text

        def dying(*a, **kw):  # the run exists, RUNNING, with its tags; its artifacts are not written yet
            step("run")
            return original(*a, **kw)

        mlflow.log_text = dying
        try:
            run_id = log_decision(params, paths, decision, parent_run_id=None, record=key)
        finally:
            mlflow.log_text = original
        step("run logged")
        return run_id

    try:
        with decisions.gate_lock(client, args.model, ttl=args.ttl, wait=args.wait) as lease:
            decisions.recover(client, args.model, "champion", log, lease.check)
            current = champion(client, args.model, "champion")
            gate_id = ""
            if args.freeze:
                decisions.settle_gate_set_runs(client, "pgrank", args.model, gate.frozen_run(client, params))
                original = mlflow.log_artifacts

                def dying(*a, **kw):  # inside the gate-set run, before its artifacts
                    step("freeze")
                    return original(*a, **kw)

                mlflow.log_artifacts = dying
                try:
                    gate.frozen_gate_set(client, params, paths) or gate.freeze_gate_set(client, params, paths, None)
                finally:
                    mlflow.log_artifacts = original
                gate_id = gate.frozen_run(client, params)
            print("holding", flush=True)
            deadline = time.monotonic() + 300
            while args.hold_until is not None and not args.hold_until.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            rng = np.random.default_rng(int(args.challenger))
            base = rng.uniform(0.2, 0.7, 300)
            new = np.clip(base + (-0.05 if args.worse else 0.08) + rng.normal(0, 0.05, 300), 0, 1)
            per_query = lambda v: {f"q{i}": {"ndcg@10": float(x)} for i, x in enumerate(v)}  # noqa: E731
            if current is None:
                decision = decide(per_query(new), None, params.champion.model_copy(update={"budget": None}),
                                  challenger=args.challenger, champion=None, metrics=[])
                level, before_budget = None, None
            else:
                level, before_budget = budget_level(params, client, args.model)
                decision = decide(per_query(new), per_query(base), params.champion, challenger=args.challenger,
                                  champion=current, metrics=[], level=level, budget=budget_words(before_budget, level))
            decisions.settle(client, args.model, "champion", decision, log, gate_set=gate_id, guard=lease.check, level=level,
                             budget=budget_after(params, before_budget, level, decision.promoted))
            print("decided", decision.promoted, flush=True)
    except PgrankError as e:
        print(f"pgrank: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
