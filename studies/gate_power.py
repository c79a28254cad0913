"""How often scheduled retraining promotes a model that is no better, per decision and per year, and how many gate
queries a real gain needs: ``python studies/gate_power.py``.

A Monte Carlo of the gate's rule (:func:`pgrank.core.promotion.simulate_years`, which decides with the p-values and
the rule :func:`pgrank.core.promotion.judge` uses) on SciFact's per-query spread: the per-query nDCG@10 of the
demo's warm start (all-MiniLM-L6-v2) and of its policy on scifact/test, reranking
(``studies/data/scifact-demo-per-query.json``, taken from a demo run with ``--spread``). Their difference is exactly 0
on 70% of the queries (both rank the query alike).

**The null keeps the ties.** A simulated year draws its gate once, ``gate_size`` queries resampled from the 300, and
takes 52 weekly decisions on those same queries. A challenger differs from the champion on a query by the real
pair's absolute difference there, with a random sign: a tie stays a tie (centring the differences at their mean
instead would turn the 70% ties into one negative value and skew the null). Two kinds of retraining:

* ``warm_start`` (every challenger trained afresh from one warm start): each model deviates from the common quality
  on a query by ``|d| * z / sqrt(2)``, z standard normal, so two models differ by the real spread with its ties, and
  the year's decisions share the champion's deviation on the frozen gate (positively dependent).
* ``continual`` (every challenger is the champion trained further): each difference is a fresh ``|d| * sign``,
  independent of the past, whoever the champion is; the decisions of a year are independent given the gate, the
  case in which a year's chances of a false promotion add up the most.

Under the null every promotion is false, so a year counts once its first decision promotes; until then the budget
rules' levels are those of a year without promotions, and what the champion becomes after a promotion does not
change the count. Rules: no budget (every decision at ``alpha`` 0.05, one-sided), and ``champion.budget`` 0.05 over
``horizon`` 52 decisions by ``spending`` and ``fallback`` (:mod:`pgrank.core.error_budget`; equal under the null).

**Power** of one decision whose challenger is truly better by ``delta`` nDCG@10: a sign is positive with
probability ``(1 + delta / mean|d|) / 2`` (the better model wins more of the queries the two rank differently, by
the same amounts), at each rule's level: ``alpha``, ``budget / horizon``, and twice that (``fallback`` right after a
promotion). The tests are the paired t-test and the signed-rank test (Pratt), both one-sided.

**Non-inferiority** with a margin of 0.01: the rate at the boundary (true gain -0.01, where a promotion is false)
and the chance to promote an equally good challenger.

Writes ``studies/out/gate_power.json`` (``--out``; :mod:`record`: the command, the machine, the results) and prints
Markdown tables; ``docs/generate.py`` renders the record through :func:`render`. A pure computation: a few
minutes on 2 cores.

Example:
    $ python studies/gate_power.py                              # 10,000 simulated years per cell (t-test)
    $ python studies/gate_power.py --spread runs/demo           # refresh the spread from a finished demo first
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

TITLE = "Champion gate: false promotions per decision and per year, and power"

SPREAD = ROOT / "studies" / "data" / "scifact-demo-per-query.json"
GATE_SIZES = (300, 1000)
POWER_SIZES = (100, 300, 1000)
DELTAS = (0.01, 0.02, 0.03)
TESTS = ("student", "wilcoxon")
ALPHA, BUDGET, HORIZON, MARGIN = 0.05, 0.05, 52, 0.01
WILCOXON_SHARE = 2  # the signed-rank test is slower: it simulates half the years
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
        "command": "pgrank demo; python studies/gate_power.py --spread runs/demo",
        **found})


def levels() -> dict[str, list[float]]:
    """Each rule's levels over a year without promotions (the null's history until its first false promotion)."""
    from pgrank.core.error_budget import RULES, schedule

    return {"none": [ALPHA] * HORIZON,
            **{rule: schedule(rule, BUDGET, HORIZON, [False] * HORIZON) for rule in RULES}}


def simulate(differences: np.ndarray, trials: int, seed: int) -> dict:
    """The null table, the power table and the non-inferiority table (see the module docstring)."""
    from pgrank.core.error_budget import BudgetState, level, spend
    from pgrank.core.promotion import simulate_years

    sequences = levels()
    null = []
    for test in TESTS:
        years = trials if test == "student" else max(trials // WILCOXON_SHARE, 100)
        for training in ("warm_start", "continual"):
            for n in GATE_SIZES:
                found = simulate_years(differences, sequences, gate_size=n, training=training, years=years, test=test,
                                       seed=seed)
                for rule, (decisions, yearly) in found.items():
                    null.append({"test": test, "training": training, "gate_size": n, "rule": rule,
                                 "level": sequences[rule][0], "decisions": decisions.trials,
                                 "promotions": decisions.promotions, "rate": decisions.rate, "error": decisions.error,
                                 "years": yearly.trials, "years_promoted": yearly.promotions,
                                 "yearly_rate": yearly.rate, "yearly_error": yearly.error})
    after = level("fallback", BUDGET, HORIZON, spend(BudgetState(), BUDGET / HORIZON, True))
    at = {"none": ALPHA, "spending": BUDGET / HORIZON, "fallback after a promotion": after}
    power = []
    for test in TESTS:
        years = max(trials // (10 if test == "student" else 10 * WILCOXON_SHARE), 20)
        for n in POWER_SIZES:
            for delta in DELTAS:
                found = simulate_years(differences, {k: [a] * HORIZON for k, a in at.items()}, gate_size=n,
                                       training="continual", gain=delta, years=years, test=test, seed=seed)
                power += [{"test": test, "gate_size": n, "delta": delta, "rule": rule, "level": at[rule],
                           "decisions": sim.trials, "promotions": sim.promotions, "rate": sim.rate,
                           "error": sim.error} for rule, (sim, _) in found.items()]
    margin = []
    for n in GATE_SIZES:
        for gain in (-MARGIN, 0.0):
            found = simulate_years(differences, {k: [a] * HORIZON for k, a in at.items() if k != "fallback after a promotion"},
                                   gate_size=n, training="continual", gain=gain, years=max(trials // 4, 20),
                                   margin=MARGIN, seed=seed)
            margin += [{"gate_size": n, "gain": gain, "rule": rule, "level": at[rule], "decisions": sim.trials,
                        "promotions": sim.promotions, "rate": sim.rate, "error": sim.error}
                       for rule, (sim, _) in found.items()]
    return {"rule": {"alpha": ALPHA, "budget": BUDGET, "horizon": HORIZON, "min_gain": 0.0, "margin": MARGIN},
            "null": null, "power": power, "non_inferiority": margin}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=10000, help="simulated years per cell of the t-test (at least 2,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spread", type=Path, default=None, metavar="DEMO",
                        help="first refresh studies/data/ from a finished demo workspace, e.g. runs/demo")
    add_out_option(parser, __file__)
    args = parser.parse_args()
    if args.trials < 2000:
        parser.error("--trials: at least 2,000 simulated years per cell")

    if args.spread is not None:
        write_spread(args.spread)
    record = new_record(TITLE)
    record.update(measure(args.trials, args.seed))
    save(record, args.out, render)


def measure(trials: int, seed: int, spread: Path = SPREAD) -> dict:
    """The record's results: the spread simulated, the null, power and non-inferiority tables, and the seconds they took."""
    differences, baseline, source = read_spread(spread)
    started = time.perf_counter()
    results = {"spread": {"source": source["source"], "params": source.get("params"),
                          "file": str(spread.relative_to(ROOT)) if spread.is_relative_to(ROOT) else str(spread),
                          "queries": len(differences), "warm_start_mean": float(baseline.mean()),
                          "mean_gain": float(differences.mean()), "sd_gain": float(differences.std(ddof=1)),
                          "ties": float(np.mean(differences == 0))},
               **simulate(differences, trials, seed)}
    results["seconds"] = round(time.perf_counter() - started, 1)
    return results


def render(record: dict) -> str:
    """The record as Markdown: the spread, the false-promotion rates, the power and the non-inferiority tables."""
    s, rule = record["spread"], record["rule"]
    rate = lambda r: f"{r['rate']:.5f} ± {r['error']:.5f}"  # noqa: E731
    yearly = lambda r: f"{r['yearly_rate']:.3f} ± {r['yearly_error']:.3f}"  # noqa: E731
    rules = list(dict.fromkeys(r["rule"] for r in record["null"]))
    null = {(r["test"], r["training"], r["gate_size"], r["rule"]): r for r in record["null"]}
    keys = sorted({(r["test"], r["training"], r["gate_size"]) for r in record["null"]},
                  key=lambda k: (k[0] != "student", k[1], k[2]))
    named = {"none": f"no budget (alpha {rule['alpha']:g})", "spending": "spending", "fallback": "fallback"}
    per = {(r["test"], r["gate_size"], r["delta"], r["rule"]): r for r in record["power"]}
    at = list(dict.fromkeys(r["rule"] for r in record["power"]))
    levels = {r["rule"]: r["level"] for r in record["power"]}
    deltas = sorted({r["delta"] for r in record["power"]})
    sizes = sorted({r["gate_size"] for r in record["power"]})
    tests = list(dict.fromkeys(r["test"] for r in record["power"]))
    ni = {(r["gate_size"], r["gain"], r["rule"]): r for r in record["non_inferiority"]}
    ni_sizes, ni_rules = sorted({r["gate_size"] for r in record["non_inferiority"]}), list(dict.fromkeys(
        r["rule"] for r in record["non_inferiority"]))
    student_years = null[keys[0] + (rules[0],)]["years"]
    return "\n".join([
        f"Simulated gates resample SciFact's per-query nDCG@10 ({s['source']}; {s['queries']} queries, `{s['file']}`): "
        f"the warm start's mean is {s['warm_start_mean']:.4f}; the policy's per-query gain has mean "
        f"{s['mean_gain']:+.4f} and standard deviation {s['sd_gain']:.4f}, and is exactly 0 on {s['ties']:.0%} of "
        f"the queries. Null: the real absolute differences with random signs (ties kept). A year is "
        f"{rule['horizon']} decisions on one frozen gate set; budget {rule['budget']:g} over {rule['horizon']} "
        f"decisions (level {rule['budget'] / rule['horizon']:.6f} per decision before any promotion); one-sided "
        f"tests, min_gain {rule['min_gain']:g}; {student_years:,} simulated years per t-test cell "
        f"({record['seconds']} s).", "",
        "**False promotions** (true gain 0; ± one Monte-Carlo standard error): the rate per decision, and the share "
        "of years with at least one false promotion:", "",
        *table(["test", "retraining", "gate queries", *(f"{named[r]}: per decision" for r in rules),
                *(f"{named[r]}: per year" for r in rules)],
               [[t, tr.replace("_", " "), f"{n:,}", *(rate(null[t, tr, n, r]) for r in rules),
                 *(yearly(null[t, tr, n, r]) for r in rules)] for t, tr, n in keys], "llr" + "r" * 2 * len(rules)),
        "",
        "**Power**: the share of decisions that promote a challenger whose true gain is delta nDCG@10, at each "
        "rule's level:", "",
        *table(["test", "gate queries", *(f"{r} ({levels[r]:.3g}), delta {d:g}" for r in at for d in deltas)],
               [[t, f"{n:,}", *(f"{per[t, n, d, r]['rate']:.3f}" for r in at for d in deltas)]
                for t in tests for n in sizes], "lr" + "r" * len(at) * len(deltas)), "",
        f"**Non-inferiority** (margin {rule['margin']:g}, t-test): the rate at the boundary (true gain "
        f"-{rule['margin']:g}, a false promotion) and the chance to promote an equally good challenger (true gain 0):",
        "",
        *table(["gate queries", *(f"{r} ({ni[ni_sizes[0], -rule['margin'], r]['level']:.3g}): {what}"
                                  for r in ni_rules for what in ("at the boundary", "equal"))],
               [[f"{n:,}", *(v for r in ni_rules for v in (rate(ni[n, -rule["margin"], r]), f"{ni[n, 0.0, r]['rate']:.3f}"))]
                for n in ni_sizes], "r" + "rr" * len(ni_rules))])


if __name__ == "__main__":
    main()
