"""How often the champion gate promotes by chance, and how many gate queries a real gain needs: ``python bench/gate_power.py``.

A Monte Carlo of the gate's decision (:func:`pgrank.core.promotion.simulate_gates`, which calls the rule the
gate itself uses, :func:`pgrank.core.promotion.judge`, and its choice among challengers,
:func:`pgrank.core.promotion.choose`) on SciFact's per-query spread: the per-query nDCG@10 of the demo's warm
start (all-MiniLM-L6-v2) and of its policy on scifact/test, reranking (``bench/data/scifact-demo-per-query.json``,
taken from a demo run with ``--spread``). Simulated gates resample those queries: the champion's values, and
each challenger's per-query gain, centred at zero (the null) and shifted by a true gain ``delta``. The rule is
``params.yaml``'s: paired t-test, ``alpha`` 0.05, ``min_gain`` 0.

1. **False promotions under the null** (true gain 0), for gate sizes 100, 300 and 1,000: one challenger, and
   three challengers chosen on the selection split (100 queries, what the gate does), and, for contrast,
   three chosen on the gate's own mean and then tested there (the rule the gate no longer uses).
2. **Power** of one challenger with a true gain of 0.01, 0.02 and 0.03 nDCG@10, for the same gate sizes.

Writes ``bench/out/gate_power.json`` (``--out``; :mod:`record`: the command, the machine, the results) and prints
Markdown tables; ``docs/generate.py`` renders the record through :func:`render`. A pure computation: about a minute on 2 cores.

Example:
    $ python bench/gate_power.py                              # 4,000 simulated gates per cell
    $ python bench/gate_power.py --spread runs/demo           # refresh the spread from a finished demo first
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from record import add_out_option, new_record, save, table  # noqa: E402

TITLE = "Champion gate: false promotions and power"

SPREAD = ROOT / "bench" / "data" / "scifact-demo-per-query.json"
GATE_SIZES = (100, 300, 1000)
DELTAS = (0.01, 0.02, 0.03)
SELECTION_SIZE = 100  # the demo's validation split
WARM, POLICY = "minilm", "pgrank-minilm"


def read_spread(path: Path = SPREAD) -> tuple[np.ndarray, np.ndarray, dict]:
    """(per-query differences policy - warm start, the warm start's values, the file's record), in query-id order."""
    record = json.loads(path.read_text(encoding="utf-8"))
    warm, policy = record["warm_start"], record["policy"]
    qids = sorted(set(warm) & set(policy))
    base = np.array([warm[q] for q in qids])
    return np.array([policy[q] for q in qids]) - base, base, record


def write_spread(demo: Path, path: Path = SPREAD) -> None:
    """Keep the per-query nDCG@10 of the demo's warm start and policy on scifact/test (reranking) in ``path``."""
    from pgrank.atomic import write_json

    composed = (demo / "params.yaml").read_text(encoding="utf-8").splitlines()[0].removeprefix("# ").split(";")[0]
    found = {}
    for key, folder in (("warm_start", demo / "results" / WARM), ("policy", demo / "results" / POLICY / "pg")):
        per_query = json.loads((folder / "scifact" / "test" / "rerank" / "per_query.json").read_text(encoding="utf-8"))
        found[key] = {q: round(v["ndcg@10"], 6) for q, v in sorted(per_query.items())}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, {
        "source": f"per-query nDCG@10 on scifact/test, reranking the demo's 100 candidates: the warm start ({WARM}, "
                  f"all-MiniLM-L6-v2) and its policy ({POLICY})",
        "params": composed,
        "command": f"PGRANK_BEIR_MIRROR=../shared/data/beir pgrank demo; python bench/gate_power.py --spread runs/demo",
        **found})


def simulate(differences: np.ndarray, baseline: np.ndarray, trials: int, seed: int) -> dict:
    """The null table and the power table (see the module docstring)."""
    from pgrank.config import ChampionConfig
    from pgrank.core.promotion import simulate_gates

    cfg = ChampionConfig()
    rule = {"min_gain": cfg.min_gain, "test": cfg.test, "alpha": cfg.alpha}
    null, power = [], []
    for n in GATE_SIZES:
        for challengers, chosen_on in ((1, "selection"), (3, "selection"), (3, "gate")):
            sim = simulate_gates(differences, baseline, gate_size=n, challengers=challengers, choose_on=chosen_on,
                                 selection_size=SELECTION_SIZE, trials=trials, seed=seed, **rule)
            null.append({"gate_size": n, "challengers": challengers, "chosen_on": chosen_on, "trials": trials,
                         "promotions": sim.promotions, "rate": sim.rate, "error": sim.error})
        for delta in DELTAS:
            sim = simulate_gates(differences, baseline, gate_size=n, delta=delta, trials=trials, seed=seed, **rule)
            power.append({"gate_size": n, "delta": delta, "trials": trials, "promotions": sim.promotions,
                          "rate": sim.rate, "error": sim.error})
    return {"rule": rule, "selection_size": SELECTION_SIZE, "null": null, "power": power}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=4000, help="simulated gates per cell (at least 2,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spread", type=Path, default=None, metavar="DEMO",
                        help="first refresh bench/data/ from a finished demo workspace, e.g. runs/demo")
    add_out_option(parser, __file__)
    args = parser.parse_args()
    if args.trials < 2000:
        parser.error("--trials: at least 2,000 simulated gates per cell")

    if args.spread is not None:
        write_spread(args.spread)
    record = new_record(TITLE)
    record.update(measure(args.trials, args.seed))
    save(record, args.out, render)


def measure(trials: int, seed: int, spread: Path = SPREAD) -> dict:
    """The record's results: the spread simulated, the null table, the power table, and the seconds they took."""
    differences, baseline, source = read_spread(spread)
    started = time.perf_counter()
    results = {"spread": {"source": source["source"], "params": source.get("params"),
                          "file": str(spread.relative_to(ROOT)) if spread.is_relative_to(ROOT) else str(spread),
                          "queries": len(differences), "warm_start_mean": float(baseline.mean()),
                          "mean_gain": float(differences.mean()), "sd_gain": float(differences.std(ddof=1)),
                          "ties": float(np.mean(differences == 0))},
               **simulate(differences, baseline, trials, seed)}
    results["seconds"] = round(time.perf_counter() - started, 1)
    return results


def render(record: dict) -> str:
    """The record as Markdown: the spread, the false-promotion rates and the power table."""
    s, rule = record["spread"], record["rule"]
    cell = lambda r: f"{r['rate']:.4f} ± {r['error']:.4f}"  # noqa: E731
    sizes = sorted({r["gate_size"] for r in record["null"]})
    null = {(r["gate_size"], r["challengers"], r["chosen_on"]): r for r in record["null"]}
    deltas = sorted({r["delta"] for r in record["power"]})
    power = {(r["gate_size"], r["delta"]): r for r in record["power"]}
    return "\n".join([
        f"Simulated gates resample SciFact's per-query nDCG@10 ({s['source']}; {s['queries']} queries, `{s['file']}`): "
        f"the warm start's mean is {s['warm_start_mean']:.4f}; the policy's per-query gain has mean "
        f"{s['mean_gain']:+.4f} and standard deviation {s['sd_gain']:.4f}, and is exactly 0 on {s['ties']:.0%} of "
        f"the queries. Rule: paired {rule['test']} test, alpha {rule['alpha']:g}, min_gain {rule['min_gain']:g}; "
        f"{record['null'][0]['trials']:,} simulated gates per cell ({record['seconds']} s).", "",
        "**False promotions** (true gain 0; ± one Monte-Carlo standard error). The gain must be positive and the "
        "two-sided p below alpha, so one test promotes at about alpha / 2:", "",
        *table(["gate queries", "1 challenger", "3, best on selection (the gate's rule)", "3, best on the gate itself"],
               [[f"{n:,}", cell(null[n, 1, "selection"]), cell(null[n, 3, "selection"]), cell(null[n, 3, "gate"])]
                for n in sizes], "rrrr"), "",
        "**Power**: the share of gates that promote one challenger whose true gain is delta nDCG@10:", "",
        *table(["gate queries", *(f"delta {d:g}" for d in deltas)],
               [[f"{n:,}", *(f"{power[n, d]['rate']:.3f}" for d in deltas)] for n in sizes], "r" * (1 + len(deltas)))])


if __name__ == "__main__":
    main()
