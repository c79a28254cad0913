"""Question: How often does the champion gate promote a challenger that is no better, and how much power does it keep?
Record: ``studies/out/gate_power.json``
Page: ``docs/retraining.md``

How often the champion gate promotes a challenger that is no better, whatever the shape of its per-query gains,
how much power it keeps, and which error-budget rule keeps the most: ``python studies/gate_power.py``.

A Monte Carlo of the gate's rule at ``params.yaml``'s settings (budget 0.05 over a horizon of 52 decisions: the
level of a decision before any promotion is ``a = 0.05 / 52``, and ``2a`` after one under ``elond`` or
``fallback``), through the p-values of :func:`pgrank.core.promotion.gate_p_values` (the betting test's are
:func:`judge`'s: :mod:`pgrank.core.betting`, its bets tuned for ``a``). Each decision meets a fresh draw of
``gate_size`` per-query differences (challenger minus champion).

**Nulls, none symmetric by construction** (true mean gain exactly 0; for non-inferiority exactly ``-margin``):

* ``ties``: 70% ties, 27% at +0.01, 3% at -0.09 (a challenger that wins a little on many queries, loses a lot on
  a few);
* ``two-point``: 88% at +0.01, 12% at -0.0733 (the same, without ties);
* ``scifact``: the real per-query nDCG@10 differences of the demo's policy and its warm start on scifact/test
  (``studies/data/scifact-demo-per-query.json``, 300 queries, 70% ties), exponentially tilted to mean 0 (weights
  ``exp(theta d)``): the same support and ties, only the weights move;
* non-inferiority (margin 0.01): ``two-point`` with its loss moved to -0.1567 and ``scifact`` tilted, both to mean
  exactly -0.01.

Every null cell reports the per-decision promotion rate, the goal ``rate <= 1.5 x level`` and, from the number of
decisions, the chance that a rule whose true rate were twice its level would pass that check anyway (the check's
resolution). The rank test (``wilcoxon``) and the t-test are simulated beside the betting test to show how they fail.

**Power**: per-query differences Normal(delta, 0.15) clipped to [-1, 1], and SciFact's tilted to mean delta, for
delta 0.01, 0.02, 0.03 and 100, 300, 1,000 gate queries, at ``a`` and ``2a``; and the smallest gain each gate size
detects with 80% power (bisection on common random numbers).

**Rules over a year** (52 decisions, 1,000 gate queries): each week's challenger is better by 0.02 (SciFact's shape
tilted to +0.02) with probability ``share``, else no better (tilted to 0); ``spending``, ``fallback`` and ``elond``
(:mod:`pgrank.core.error_budget`) decide on the same betting e-values: true and false promotions per year, the
chance of any false promotion, and the false discovery rate.

Writes ``studies/out/gate_power.json`` (``--out``) and prints Markdown tables; ``docs/generate.py`` renders the
record through :func:`render`. A pure computation with numpy: a few minutes on 2 cores.

Example:
    $ nice -n 5 python studies/gate_power.py                     # 20,000 decisions per null cell
    $ python studies/gate_power.py --spread runs/demo            # refresh the SciFact spread from a finished demo first
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from record import add_out_option, new_record, save, table  # noqa: E402

TITLE = "Champion gate: false promotions under skewed nulls, power, and the error-budget rules"

SPREAD = ROOT / "studies" / "data" / "scifact-demo-per-query.json"
BUDGET, HORIZON, MARGIN, NOISE = 0.05, 52, 0.01, 0.15
LEVEL = BUDGET / HORIZON  # a decision's level before any promotion (every rule), and the betting test's tuning
GATE_SIZES = (100, 300, 1000)
DELTAS = (0.01, 0.02, 0.03)
TESTS = ("betting", "student", "wilcoxon")
FACTOR = 1.5  # the goal: a per-decision promotion rate at most FACTOR x its level
SHARES = (0.0, 0.5)  # the share of truly better challengers in a simulated year
CHUNK = 2_000_000  # values drawn at once
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


# --------------------------------------------------------------------------------------- distributions


class Discrete:
    """A distribution on finitely many values: drawn by inverse CDF, so that common uniforms give common draws."""

    def __init__(self, values, weights):
        order = np.argsort(values, kind="stable")
        self.values = np.asarray(values, dtype=np.float64)[order]
        w = np.asarray(weights, dtype=np.float64)[order]
        self.cdf = np.cumsum(w / w.sum())

    @property
    def mean(self) -> float:
        return float(np.dot(np.diff(self.cdf, prepend=0.0), self.values))

    def draw(self, uniforms: np.ndarray) -> np.ndarray:
        return self.values[np.minimum(np.searchsorted(self.cdf, uniforms, side="right"), len(self.values) - 1)]


def tilted(values: np.ndarray, target: float) -> Discrete:
    """The empirical distribution of ``values`` exponentially tilted to mean ``target`` (weights ``exp(theta v)``):
    the same support and ties, only the weights move."""
    from scipy.optimize import brentq

    v = np.asarray(values, dtype=np.float64)

    def weights(theta: float) -> np.ndarray:  # exp(theta v), scaled so that the largest is 1
        return np.exp(theta * (v - (v.max() if theta > 0 else v.min())))

    def mean(theta: float) -> float:
        w = weights(theta)
        return float(np.dot(w, v) / w.sum()) - target

    return Discrete(v, weights(brentq(mean, -500.0, 500.0, xtol=1e-12)))


def null_shapes(differences: np.ndarray) -> dict[str, tuple[Discrete, float]]:
    """Name -> (the null distribution, its margin): superiority nulls at mean 0, non-inferiority nulls at -MARGIN."""
    loss = -0.01 * 0.88 / 0.12  # -0.0733: the two-point null's mean is exactly 0
    loss_ni = (-MARGIN - 0.01 * 0.88) / 0.12  # -0.1567: exactly -MARGIN
    return {"ties": (Discrete([0.0, 0.01, -0.09], [0.70, 0.27, 0.03]), 0.0),
            "two-point": (Discrete([0.01, loss], [0.88, 0.12]), 0.0),
            "scifact": (tilted(differences, 0.0), 0.0),
            "two-point, margin": (Discrete([0.01, loss_ni], [0.88, 0.12]), MARGIN),
            "scifact, margin": (tilted(differences, -MARGIN), MARGIN)}


def _decisions(draw, decisions: int, gate_size: int, rng: np.random.Generator, decide) -> np.ndarray:
    """``decide`` on ``decisions`` draws of ``(gate_size,)`` differences, in chunks; the outcomes concatenated."""
    rows = max(CHUNK // gate_size, 1)
    out = []
    for start in range(0, decisions, rows):
        out.append(decide(draw(rng.random((min(rows, decisions - start), gate_size)))))
    return np.concatenate(out)


LEVELS = (("a", LEVEL), ("2a, fallback", 2 * LEVEL), ("2a, elond", 2 * LEVEL))  # the levels a decision meets


def outcomes(d: np.ndarray, test: str, margin: float = 0.0) -> np.ndarray:
    """``(B, n)`` differences -> ``(B, 3)`` promoted at the :data:`LEVELS`: ``a`` (every rule's first decision),
    ``2a`` by the p-value (``fallback`` after a promotion) and ``2a`` by the betting e-value (``elond`` after one; the
    t-test and the rank test give no e-value, so their p-value stands in)."""
    from pgrank.core.betting import evidence
    from pgrank.core.promotion import gate_p_values

    gain = d.mean(axis=-1)
    better = gain > -margin
    if test == "betting":
        p, e = evidence(d, tune=LEVEL, margin=margin)  # gate_p_values' p, and the e-value, from one pass
        by_e = e * 2 * LEVEL >= 1
    else:
        p = gate_p_values(d, test, margin, tune=LEVEL)
        by_e = p < 2 * LEVEL
    return np.stack([better & (p < LEVEL), better & (p < 2 * LEVEL), better & by_e], axis=1)


def doubled_passes(decisions: int, level: float) -> float:
    """The chance that a rule whose true rate is ``2 x level`` passes the check ``promotions <= FACTOR x level x
    decisions`` anyway (binomial): the check's resolution."""
    from scipy import stats

    return float(stats.binom.cdf(math.floor(FACTOR * level * decisions), decisions, 2 * level))


# --------------------------------------------------------------------------------------- the tables


def null_table(differences: np.ndarray, trials: int, seed: int) -> list[dict]:
    """Per-decision promotion rates under every null, gate size and test, at ``a`` and ``2a``."""
    rows = []
    for shape, (dist, margin) in null_shapes(differences).items():
        for n in GATE_SIZES:
            for test in TESTS if not margin else ("betting", "student"):
                decisions = {"betting": trials, "student": max(trials // 4, 2000), "wilcoxon": max(trials // 10, 1000)}[test]
                rng = np.random.default_rng([seed, n, TESTS.index(test), len(rows)])
                promoted = _decisions(dist.draw, decisions, n, rng, lambda d: outcomes(d, test, margin))
                for (at, level), count in zip(LEVELS, promoted.sum(axis=0).tolist()):
                    if test != "betting" and at == "2a, elond":
                        continue
                    rate = count / decisions
                    rows.append({"null": shape, "mean": dist.mean, "margin": margin, "gate_size": n, "test": test,
                                 "at": at, "level": level, "decisions": decisions, "promotions": int(count), "rate": rate,
                                 "error": math.sqrt(max(rate, 1 / decisions) * (1 - rate) / decisions),
                                 "ratio": rate / level, "holds": rate <= FACTOR * level,
                                 "doubled_passes": doubled_passes(decisions, level)})
    return rows


def _shape(kind: str, differences: np.ndarray, delta: float):
    if kind == "normal":
        from scipy.special import ndtri

        return lambda u: np.clip(delta + NOISE * ndtri(np.clip(u, 1e-12, 1 - 1e-12)), -1.0, 1.0)
    return tilted(differences, delta).draw


def power_table(differences: np.ndarray, trials: int, seed: int) -> list[dict]:
    """The share of decisions that promote a challenger better by delta, per shape, gate size, test and level."""
    rows = []
    for kind in ("normal", "scifact"):
        for n in GATE_SIZES:
            for delta in DELTAS:
                draw = _shape(kind, differences, delta)
                for test in ("betting", "student"):
                    rng = np.random.default_rng([seed, n, int(delta * 1000), test == "student"])
                    promoted = _decisions(draw, trials, n, rng, lambda d: outcomes(d, test))
                    for (at, level), count in zip(LEVELS, promoted.sum(axis=0).tolist()):
                        if test != "betting" and at == "2a, elond":
                            continue
                        rows.append({"shape": kind, "gate_size": n, "delta": delta, "test": test, "at": at,
                                     "level": level, "decisions": trials, "rate": count / trials})
    return rows


def detectable(differences: np.ndarray, trials: int, seed: int) -> list[dict]:
    """The smallest gain detected with 80% power, per shape, gate size, test and level (bisection, 10 steps, on
    the same uniforms for every candidate gain)."""
    rows = []
    for kind in ("normal", "scifact"):
        for n in GATE_SIZES:
            uniforms = np.random.default_rng([seed, n, 7]).random((trials, n))
            for test in ("betting", "student"):
                for column, (at, level) in enumerate(LEVELS):
                    if test != "betting" and at == "2a, elond":
                        continue
                    lo, hi = 0.0, 0.2 if kind == "normal" else 0.12
                    for _ in range(10):
                        mid = (lo + hi) / 2
                        power = outcomes(_shape(kind, differences, mid)(uniforms), test)[:, column].mean()
                        lo, hi = (lo, mid) if power >= 0.8 else (mid, hi)
                    rows.append({"shape": kind, "gate_size": n, "test": test, "at": at, "level": level,
                                 "decisions": trials, "gain": round(hi, 4)})
    return rows


def rules_table(differences: np.ndarray, years: int, seed: int, gate_size: int = 1000) -> list[dict]:
    """A year of 52 decisions per rule, on the same betting e-values (see the module docstring)."""
    from pgrank.core.betting import evidence
    from pgrank.core.error_budget import E_VALUE_RULES, RULES, BudgetState, level, spend

    null, better = tilted(differences, 0.0), tilted(differences, 0.02)
    rows = []
    for share in SHARES:
        rng = np.random.default_rng([seed, int(share * 100)])
        good = rng.random((years, HORIZON)) < share  # (Y, W) which challengers are truly better
        e, p, gain = (np.empty((years, HORIZON)) for _ in range(3))
        for w in range(HORIZON):
            u = rng.random((years, gate_size))
            d = np.where(good[:, w, None], better.draw(u), null.draw(u))  # (Y, n)
            (p[:, w], e[:, w]), gain[:, w] = evidence(d, tune=LEVEL), d.mean(axis=-1)
        for rule in RULES:
            true = false = 0
            fdp, any_false = np.zeros(years), np.zeros(years, dtype=bool)
            for y in range(years):
                state, v = BudgetState(), 0
                for w in range(HORIZON):
                    a = level(rule, BUDGET, HORIZON, state)
                    significant = e[y, w] * a >= 1 if rule in E_VALUE_RULES else p[y, w] < a  # judge's rule
                    promoted = bool(gain[y, w] > 0 and significant)
                    state = spend(state, a, promoted)
                    v += promoted and not good[y, w]
                r = len(state.rejections)
                true, false = true + r - v, false + v
                fdp[y], any_false[y] = v / max(r, 1), v > 0
            rows.append({"share": share, "rule": rule, "years": years, "gate_size": gate_size,
                         "true_per_year": true / years, "false_per_year": false / years,
                         "fwer": float(any_false.mean()), "fdr": float(fdp.mean()),
                         "fdr_error": float(fdp.std(ddof=1) / math.sqrt(years))})
    return rows


# --------------------------------------------------------------------------------------- the record


def measure(trials: int, seed: int, spread: Path = SPREAD) -> dict:
    """The record's results: the spread, the null, power, detectable-gain and rules tables, and the seconds taken."""
    differences, baseline, source = read_spread(spread)
    started = time.perf_counter()
    results = {"spread": {"source": source["source"], "params": source.get("params"),
                          "file": str(spread.relative_to(ROOT)) if spread.is_relative_to(ROOT) else str(spread),
                          "queries": len(differences), "warm_start_mean": float(baseline.mean()),
                          "mean_gain": float(differences.mean()), "sd_gain": float(differences.std(ddof=1)),
                          "ties": float(np.mean(differences == 0))},
               "rule": {"budget": BUDGET, "horizon": HORIZON, "level": LEVEL, "margin": MARGIN, "noise_sd": NOISE,
                        "factor": FACTOR},
               "null": null_table(differences, trials, seed),
               "power": power_table(differences, max(trials // 20, 1000), seed),
               "detectable": detectable(differences, max(trials // 30, 600), seed),
               "rules": rules_table(differences, max(trials // 200, 100), seed)}
    results["seconds"] = round(time.perf_counter() - started, 1)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20000,
                        help="decisions per null cell of the betting test (default 20,000, what the goals on "
                             "docs/retraining.md need; the t-test: a quarter, the rank test: a tenth; power: a 20th; "
                             "detectable gains: a 30th; years: a 200th)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--spread", type=Path, default=None, metavar="DEMO",
                        help="first refresh studies/data/ from a finished demo workspace, e.g. runs/demo")
    add_out_option(parser, __file__)
    args = parser.parse_args()
    if args.trials < 1:
        parser.error("--trials: at least one decision per null cell")
    if args.spread is not None:
        write_spread(args.spread)
    record = new_record(TITLE)
    record.update(measure(args.trials, args.seed))
    save(record, args.out, render)


def detectable_table(record: dict) -> list[str]:
    """The smallest gain detected with 80% power per gate size, as ``docs/retraining.md`` shows it (a test checks
    the page against the record)."""
    found = {(r["shape"], r["gate_size"], r["test"], r["at"]): r["gain"] for r in record["detectable"]}
    sizes = sorted({r["gate_size"] for r in record["detectable"]})
    named = {"normal": f"Normal(delta, {record['rule']['noise_sd']:g})", "scifact": "SciFact's spread, tilted"}
    return table(["per-query differences", "gate queries", "betting at a", "betting at 2a (elond)",
                  "t-test at a (approximate)"],
                 [[named[shape], f"{n:,}", *(f"{found[shape, n, test, at]:.4f}" for test, at in
                                             (("betting", "a"), ("betting", "2a, elond"), ("student", "a")))]
                  for shape in ("normal", "scifact") for n in sizes], "lrrrr")


def render(record: dict) -> str:
    """The record as Markdown: the nulls, the power, the smallest detectable gains and the rules over a year."""
    s, rule = record["spread"], record["rule"]
    a = rule["level"]
    null = record["null"]
    power = {(r["shape"], r["gate_size"], r["delta"], r["test"], r["at"]): r["rate"] for r in record["power"]}
    found = {(r["shape"], r["gate_size"], r["test"], r["at"]): r["gain"] for r in record["detectable"]}
    ats = [at for at, _ in LEVELS]
    cell = lambda table_, key, spec=".3f": format(table_[key], spec) if key in table_ else "–"  # noqa: E731
    sizes = sorted({r["gate_size"] for r in record["detectable"]})
    decisions = max(r["decisions"] for r in null if r["test"] == "betting")
    return "\n".join([
        f"Level `a` = budget {rule['budget']:g} / horizon {rule['horizon']} = {a:.6f}, a decision's level before any "
        f"promotion under every rule (`2a`: after one, under `fallback` by the p-value, under `elond` by the betting "
        f"e-value); the betting test's bets are tuned for `a`. Real spread: {s['source']} ({s['queries']} queries, `{s['file']}`; mean gain {s['mean_gain']:+.4f}, sd "
        f"{s['sd_gain']:.4f}, {s['ties']:.0%} ties), tilted to the mean each cell needs. {decisions:,} decisions per "
        f"null cell of the betting test and the t-test ({record['seconds']} s in all).", "",
        f"**False promotions per decision** (true mean gain 0, or exactly -{rule['margin']:g} with the margin): the "
        f"rate, its ratio to the level (goal <= {rule['factor']:g}), and the chance that a rule promoting at twice "
        f"its level would pass the goal anyway with this many decisions:", "",
        *table(["null", "gate queries", "test", "level", "decisions", "promotions", "rate", "rate / level",
                f"<= {rule['factor']:g} x level", "a doubled rate passes"],
               [[r["null"], f"{r['gate_size']:,}", r["test"], r["at"], f"{r['decisions']:,}",
                 r["promotions"], f"{r['rate']:.5f}", f"{r['ratio']:.2f}", "yes" if r["holds"] else "**no**",
                 f"{r['doubled_passes']:.3f}"] for r in null], "lrllrrrrlr"), "",
        f"**Power**: the share of decisions that promote a challenger better by delta (normal: per-query differences "
        f"Normal(delta, {rule['noise_sd']:g}) clipped to [-1, 1]; scifact: the real spread tilted to mean delta):", "",
        *table(["shape", "gate queries", "test", *(f"delta {d:g} at {lv}" for lv in ats for d in DELTAS)],
               [[shape, f"{n:,}", test, *(cell(power, (shape, n, d, test, lv)) for lv in ats for d in DELTAS)]
                for shape in ("normal", "scifact") for n in sizes for test in ("betting", "student")],
               "lrl" + "r" * len(ats) * len(DELTAS)), "",
        "**Smallest gain detected with 80% power** (nDCG@10; the t-test's does not hold its level under skew):", "",
        *table(["shape", "test", *(f"{n:,} queries at {lv}" for lv in ats for n in sizes)],
               [[shape, test, *(cell(found, (shape, n, test, lv), ".4f") for lv in ats for n in sizes)]
                for shape in ("normal", "scifact") for test in ("betting", "student")], "ll" + "r" * len(ats) * len(sizes)),
        "",
        f"**The rules over a year** ({record['rules'][0]['years']:,} simulated years of {rule['horizon']} decisions, "
        f"{record['rules'][0]['gate_size']:,} gate queries, the betting test; a challenger is better by 0.02 with the "
        "given share, else no better; SciFact's shape): promotions per year, the chance of any false promotion "
        "(FWER) and the false discovery rate (FDR):", "",
        *table(["better share", "rule", "true promotions / year", "false promotions / year", "FWER", "FDR"],
               [[f"{r['share']:g}", r["rule"], f"{r['true_per_year']:.2f}", f"{r['false_per_year']:.4f}",
                 f"{r['fwer']:.4f}", f"{r['fdr']:.4f} ± {r['fdr_error']:.4f}"] for r in record["rules"]], "llrrrr")])


if __name__ == "__main__":
    main()
