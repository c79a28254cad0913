"""The model card of an exported policy: ``README.md`` in the Hugging Face hub's format.

YAML front matter (:mod:`pgrank.export.card_metadata`: ``license``, ``library_name``, ``pipeline_tag``, ``tags``,
``base_model`` when the warm start is a hub model, ``datasets`` for BEIR's, ``model-index``), then what the policy is,
named for what trained it (PG-Rank alone, or PG-Rank plus the KL term, document anchor and selection rule its run
added: :func:`objective_name`), its warm start, its training data, its objective and the hyperparameters of its run,
nDCG@10 per evaluated dataset, split and stage beside the warm start's (from the ``metrics.json`` files ``pgrank
evaluate`` wrote for this very checkpoint), its limitations (what was and was not evaluated, the pools of sets that
are not BEIR's, the precision its figures were computed at), how to use it, the code, and the paper to cite (the
README's citation, :data:`CITATION`).

Everything is read from the configuration, the checkpoint's ``pgrank.json`` and the result files: :func:`policy_facts`
gathers it, :func:`render` writes it out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from pgrank.config import Params
from pgrank.core.significance import TEST_NAMES
from pgrank.data.artifact_meta import META
from pgrank.data.beir import load_qrels
from pgrank.download.catalogue import BEIR_SIZES
from pgrank.export.card_metadata import front_matter, repository_url, warm_start_license
from pgrank.export.facts import UNKNOWN_LICENSE, Figure, PolicyFacts
from pgrank.models.backends import FLOAT32_BACKENDS
from pgrank.paths import CARVED_FILES, CARVED_TRAIN, VALIDATION, Paths, parse_policy_name, split_run_key

# The paper, cited as the README cites it (a test keeps the two the same).
CITATION = """@article{gao2023policy,
  title   = {Policy-Gradient Training of Language Models for Ranking},
  author  = {Gao, Ge and Chang, Jonathan D. and Cardie, Claire and Brantley, Kiant{\\'e} and Joachims, Thorsten},
  journal = {arXiv preprint arXiv:2310.04407},
  year    = {2023}
}"""
_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
STAGE_NAMES = {"rerank": "second stage (rerank)", "full": "first stage (full corpus)"}
FEW_QUERIES = 50  # below this many queries, a set's figures get the caveat that only large differences are significant


def _hub_id(name: str) -> str | None:
    """``name``'s hub id without a pinned revision, or ``None`` for a local folder."""
    if Path(name).expanduser().is_dir():
        return None
    base, at, _ = name.rpartition("@")
    name = base if at and "/" in base else name
    return name if _HUB_ID.match(name) else None


def _store_meta(paths: Paths, dataset: str, split: str) -> dict:
    file = paths.candidate_store(dataset, split) / META
    return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}


def _query_count(paths: Paths, dataset: str, split: str) -> int | None:
    """The queries of a carved split that have a candidate set (what training read), else those of its qrels."""
    meta = _store_meta(paths, dataset, split)
    if "queries" in meta:
        return int(meta["queries"])
    qrels = paths.carved_qrels(dataset, CARVED_FILES[split])
    return len(load_qrels(qrels)) if qrels.is_file() else None


def _candidates(params: Params, paths: Paths, dataset: str) -> str:
    """How many candidates each training query had, and what mined them (the training store's record)."""
    meta = _store_meta(paths, dataset, CARVED_TRAIN)
    if not meta:
        return "not recorded"
    low, high = meta.get("min_size"), meta.get("max_size")
    size = f"{low}" if low == high else f"{low}-{high}"
    source = meta.get("source")
    model = f" ({params.mine.model})" if source == "dense" else ""
    return f"{size} per query" + (f", mined by {source}{model} (`mine.source`)" if source else "")


def _hyperparameters(params: Params, run: str) -> dict[str, str]:
    """The keys of the run's ``train`` section (variant overrides applied) that say how it was trained."""
    cfg = params.train.for_run(*split_run_key(run))
    loss, pg, anchor, sel = cfg.objectives[0], cfg.pg, cfg.document_anchor, cfg.selection
    out = {"train.epochs": cfg.epochs, "train.batch_size": cfg.batch_size, "train.learning_rate": cfg.learning_rate,
           "train.weight_decay": cfg.weight_decay, "train.warmup_steps": cfg.warmup_steps, "train.grad_clip": cfg.grad_clip,
           "train.max_query_length": cfg.max_query_length, "train.max_doc_length": cfg.max_doc_length,
           "train.tower": cfg.tower, "train.similarity": cfg.similarity, "train.seed": cfg.seed}
    if cfg.queries_per_epoch:
        out["train.queries_per_epoch"] = cfg.queries_per_epoch
    if loss == "pg":
        out.update({"train.pg.utility": pg.utility, "train.pg.estimator": pg.estimator, "train.pg.baseline": pg.baseline,
                    "train.pg.num_samples": pg.num_samples, "train.pg.temperature": pg.temperature,
                    "train.pg.entropy_coef": pg.entropy_coef})
        if pg.kl_coef > 0:
            out.update({"train.pg.kl": pg.kl, "train.pg.kl_coef": pg.kl_coef})
    if anchor.coef > 0:
        out.update({"train.document_anchor.coef": anchor.coef, "train.document_anchor.documents": anchor.documents})
    out["train.selection.rule"] = sel.rule
    if sel.rule != "last":
        out.update({"train.selection.interpolation": sel.interpolation, "train.selection.within_se": sel.within_se})
        if sel.rule == "guarded":
            out.update({"train.selection.guard": sel.guard, "train.validation_sets": cfg.validation_sets})
    return {key: ", ".join(map(str, value)) if isinstance(value, list) else str(value) for key, value in out.items()}


def _figures(params: Params, paths: Paths, system: str, checkpoint: str) -> list[Figure]:
    """The results ``pgrank evaluate`` wrote for this checkpoint (``checkpoint``: as ``metrics.json`` records it)."""
    warm = parse_policy_name(system).warm
    figures = []
    for dataset, splits in params.data.eval_sets_by_dataset().items():
        for split in splits:
            for stage in params.evaluate.stages:
                record = _metrics(paths.results(system, dataset, split, stage))
                if record is None or record.get("model") != checkpoint:
                    continue  # not evaluated, or results of another checkpoint
                baseline = _metrics(paths.results(warm, dataset, split, stage)) or {}
                p_values = (record.get("significance") or {}).get("p_values") or {}
                figures.append(Figure(dataset, split, stage, int(record["queries"]), record["metrics"]["ndcg@10"],
                                      (baseline.get("metrics") or {}).get("ndcg@10"), p_values.get("ndcg@10"),
                                      tuple(sorted((record.get("encoding") or {}).items()))))
    return figures


def _metrics(folder: Path) -> dict | None:
    file = folder / "metrics.json"
    return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else None


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def objective_name(params: Params, run: str) -> str:
    """What trained the run, truthfully: its loss, and each term or rule its configuration adds to it (a KL term to
    the warm start, a document anchor, an L2 penalty toward the warm start, a selection rule), so that PG-Rank plus
    additions is never called PG-Rank alone."""
    cfg = params.train.for_run(*split_run_key(run))
    loss, pg, anchor, sel = cfg.objectives[0], cfg.pg, cfg.document_anchor, cfg.selection
    added = []
    if loss == "pg" and pg.kl_coef > 0:
        kind = {"top1": "a top-1 KL term to the warm start's first-place distribution",
                "ranking": "a sampled ranking KL term to the warm start's policy"}.get(pg.kl, f"a {pg.kl} KL term")
        added.append(f"{kind} (`train.pg.kl_coef` {pg.kl_coef:g})")
    if anchor.coef > 0:
        added.append(f"a document anchor to the warm start's document tower (`train.document_anchor.coef` "
                     f"{anchor.coef:g}, on {anchor.documents} candidates of each batch)")
    if cfg.l2_to_warm_start > 0:
        added.append(f"an L2 penalty toward the warm start's weights (`train.l2_to_warm_start` {cfg.l2_to_warm_start:g})")
    if sel.rule != "last":
        over = "epochs and weight mixtures with the warm start" if any(a < 1 for a in sel.interpolation) else "epochs"
        added.append(f"a selection rule over {over} on validation splits (`train.selection.rule: {sel.rule}`)")
    base = ("PG-Rank (the policy gradient of Neural PG-Rank)" if loss == "pg" else
            f"the `{loss}` objective (not PG-Rank) on PG-Rank's candidate sets")
    return f"{base} plus {_join(added)}" if added else base


def _origin(params: Params, name: str, split: str | None = None) -> str:
    """What a dataset of ``data.sources`` (or its ``split``) is, in words; a BEIR name: BEIR's own."""
    source = params.data.sources.get(name)
    if source is None:
        return f"BEIR's {name}"
    if source.split is not None:
        half = {"dev": "the selection half", "test": "the report half"}.get(split or "", "a half")
        return (f"{half}, cut by query hash, of the {source.split.split} queries of "
                f"{_origin(params, source.split.of, source.split.split)}")
    if source.halves is not None:
        return f"half-document retrieval built from {_origin(params, source.halves.of)}"
    if source.mirror is not None:
        return f"the subset `{source.mirror}` (not on BEIR's server)"
    where = source.path or source.url
    return f"a dataset of your own ({where})" if where else f"the `data.sources` entry {name}"


def _documents(paths: Paths, dataset: str) -> int | None:
    corpus = paths.dataset(dataset) / "corpus.jsonl"
    if not corpus.is_file():
        return None
    with open(corpus, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def _not_evaluated(params: Params, figures: list[Figure]) -> list[str]:
    done = {(f.dataset, f.split, f.stage) for f in figures}
    return [f"{dataset}/{split} ({STAGE_NAMES.get(stage, stage)})"
            for dataset, splits in params.data.eval_sets_by_dataset().items() for split in splits
            for stage in params.evaluate.stages if (dataset, split, stage) not in done]


def policy_facts(params: Params, paths: Paths, system: str, meta: dict, checkpoint: str,
                 license: str | None = None) -> PolicyFacts:
    """Everything the card says about ``system``, whose checkpoint's ``pgrank.json`` is ``meta`` (``checkpoint``: its
    folder as ``metrics.json`` records it, relative to ``paths.root``); ``license``: the card's license (default: the
    warm start's, read from its model card)."""
    policy = parse_policy_name(system)
    run = policy.objective
    cfg = params.train.for_run(*split_run_key(run))
    warm_model = params.models.aliases.get(policy.warm, policy.warm)
    dataset = params.data.train.split("/")[0]
    sets = {name.split("/")[0] for name in [params.data.train, *params.data.eval_sets]}
    alpha = meta.get("alpha")
    chosen = f"epoch {meta.get('epoch', cfg.epochs)} of {cfg.epochs}"
    if alpha is not None:
        chosen += f", its weights {alpha:g} x that epoch's + {1 - alpha:g} x the warm start's"
    selection = (f"{chosen}, chosen by train.selection.rule {meta['selected_by']}" if meta.get("selected_by")
                 else f"{chosen}, the last")
    figures = _figures(params, paths, system, checkpoint)
    found = None if license else warm_start_license(warm_model, params.models)
    return PolicyFacts(
        system=system, warm_start=policy.warm, warm_start_model=warm_model, base_model=_hub_id(warm_model),
        loss=cfg.objectives[0], run=run, tower=meta.get("tower", cfg.tower), similarity=meta.get("similarity", cfg.similarity),
        max_seq_length=params.evaluate.max_seq_length, train_set=params.data.train,
        train_queries=_query_count(paths, dataset, CARVED_TRAIN), validation_queries=_query_count(paths, dataset, VALIDATION),
        candidates=_candidates(params, paths, dataset), epoch=int(meta.get("epoch", cfg.epochs)),
        epochs=cfg.epochs, selection=selection, hyperparameters=_hyperparameters(params, run),
        figures=figures,
        datasets=sorted(f"BeIR/{name}" for name in sets if name in BEIR_SIZES and name not in params.data.sources),
        significance_test=params.evaluate.significance.test, backend=params.models.backend,
        objective=objective_name(params, run), license=license or found or UNKNOWN_LICENSE,
        license_source=("given to `pgrank export --license`" if license else
                        "the warm start's, from its model card" if found else
                        "no license in the warm start's model card on this machine"),
        repository=repository_url(),
        pools={f"{f.dataset}/{f.split}": _origin(params, f.dataset, f.split) for f in figures
               if f.dataset in params.data.sources},
        documents={d: n for d in {f.dataset for f in figures} if (n := _documents(paths, d)) is not None},
        not_evaluated=_not_evaluated(params, figures))


def _number(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _figures_table(facts: PolicyFacts) -> list[str]:
    if not facts.figures:
        return ["No results of `pgrank evaluate` for this checkpoint were found when it was exported: evaluate it, "
                "then export it again."]
    test = TEST_NAMES.get(facts.significance_test, f"{facts.significance_test} test")
    lines = [f"nDCG@10 from `pgrank evaluate` ({_encoding(facts)}); p: {test} against the warm start.", "",
             f"| dataset/split | stage | queries | warm start ({facts.warm_start}) | this policy | p |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for f in facts.figures:
        gain = "" if f.warm_start is None else f" ({f.ndcg - f.warm_start:+.4f})"
        p = "" if f.p_value is None else f"{f.p_value:.2g}"
        lines.append(f"| {f.dataset}/{f.split} | {STAGE_NAMES.get(f.stage, f.stage)} | {f.queries} | "
                     f"{_number(f.warm_start)} | {_number(f.ndcg)}{gain} | {p} |")
    return lines


def _encoding(facts: PolicyFacts) -> str:
    """How the figures' embeddings were computed: the backends ``metrics.json`` recorded, and whether a plain
    float32 ``SentenceTransformer`` of this folder computes differently."""
    kinds = {f.encoding for f in facts.figures}
    if len(kinds) != 1 or not next(iter(kinds)):  # results written before metrics.json recorded the encoding
        return f"`models.backend: {facts.backend}`"
    enc = dict(next(iter(kinds)))
    text = (f"queries encoded with the `{enc.get('queries')}` backend, documents with `{enc.get('documents')}`, "
            f"document embeddings stored as {enc.get('document_vectors', 'float32')}")
    if not {enc.get("queries"), enc.get("documents")} <= FLOAT32_BACKENDS:
        text += ("; plain `SentenceTransformer` runs this folder's float32 weights, so its nDCG@10 can differ from "
                 "these")
    return text


def _limitations(facts: PolicyFacts) -> list[str]:
    """What the figures do and do not say: the sets and stages evaluated and not, the pools of sets that are not
    BEIR's own, small query counts, the precision they were computed at, and the objective."""
    lines = [f"* Evaluated: nDCG@10 on the {len(facts.figures)} sets and stages of the table above, and nothing else"
             + (f"; configured but without results for this checkpoint: {', '.join(facts.not_evaluated)}"
                if facts.not_evaluated else "")
             + ". No other dataset, domain or language, no latency or memory, was measured for this card."]
    seen = set()
    for f in facts.figures:
        if (f.dataset, f.split) in seen:
            continue
        seen.add((f.dataset, f.split))
        documents = facts.documents.get(f.dataset)
        pool = f"{documents:,}-document pool" if documents is not None else "pool"
        if f"{f.dataset}/{f.split}" in facts.pools:
            lines.append(f"* `{f.dataset}/{f.split}` is {f.queries} queries over a {pool} "
                         f"({facts.pools[f'{f.dataset}/{f.split}']}), "
                         "not a BEIR corpus: nDCG@10 over a small pool, first stage above all, is not comparable to "
                         "figures over a full corpus"
                         + (f", and with {f.queries} queries only large differences are significant (the p column)"
                            if f.queries < FEW_QUERIES else "") + ".")
        elif f.queries < FEW_QUERIES:
            lines.append(f"* `{f.dataset}/{f.split}` has {f.queries} queries: only large differences are significant "
                         "(the p column).")
    lines.append(f"* Precision: the figures were computed with {_encoding(facts)}. This folder holds float32 weights "
                 f"(safetensors); inputs longer than {facts.max_seq_length} tokens are cut.")
    if " plus " in facts.objective:
        lines.append("* Objective: this is not plain PG-Rank. The paper's objective has none of the additions named "
                     "under \"Objective and hyperparameters\", and these figures are not the paper's method's.")
    return lines


def render(facts: PolicyFacts, name: str = "path/to/this/folder") -> str:
    """The model card as Markdown with YAML front matter; ``name``: what the usage snippet loads (a hub id, or the
    folder's absolute path, so that it loads the same model from any directory)."""
    what = (f"A ranking policy trained with {facts.objective}: a sentence-transformers bi-encoder trained as a "
            "Plackett-Luce ranking policy over each query's candidate documents with policy-gradient (REINFORCE) and "
            "nDCG@10 as the reward" if facts.loss == "pg" else
            f"A sentence-transformers bi-encoder trained with {facts.objective}")
    warm = f"[{facts.base_model}](https://huggingface.co/{facts.base_model})" if facts.base_model else \
        f"`{facts.warm_start_model}`"
    towers = ("the query tower is trained; documents go through the warm start's frozen encoder (a sentence-"
              "transformers `Router`: `encode_query` takes the trained route, `encode_document` and `encode` the "
              "frozen one)" if facts.tower == "query" else "one encoder for queries and documents, trained")
    counts = ", ".join(f"{n} {label} queries" for n, label in ((facts.train_queries, "training"),
                                                               (facts.validation_queries, "validation")) if n is not None)
    code = (f"[pgrank]({facts.repository})" if facts.repository else "pgrank")
    lines = [
        "---", yaml.safe_dump(front_matter(facts, name if _HUB_ID.match(name) else facts.system), sort_keys=False,
                              allow_unicode=True).rstrip(), "---", "",
        f"# {facts.system}", "",
        f"{what}, by {code} (`pgrank train`, then `pgrank export`).", "",
        "## Model", "",
        f"* Warm start: {warm}" + ("" if facts.warm_start == facts.warm_start_model else
                                    f" (`{facts.warm_start}` in the configuration)") + ".",
        f"* Towers: {towers}.",
        f"* Similarity: `{facts.similarity}`; inputs truncated to {facts.max_seq_length} tokens (`evaluate.max_seq_length`).",
        f"* This policy: {facts.selection}.",
        f"* License: `{facts.license}` ({facts.license_source}); the datasets it was trained and evaluated on keep their "
        "own terms.", "",
        "## Training data", "",
        f"* `{facts.train_set}` (`data.train`)" + (f": {counts}." if counts else "."),
        f"* Candidate documents: {facts.candidates}.", "",
        "## Objective and hyperparameters", "",
        f"{facts.objective[0].upper()}{facts.objective[1:]} (loss `{facts.loss}`, run `{facts.run}`), with these "
        "settings of `params.yaml`:", "",
        "| key | value |", "| --- | --- |",
        *[f"| `{key}` | {value} |" for key, value in facts.hyperparameters.items()], "",
        "## Evaluation", "",
        *_figures_table(facts), "",
        "## Limitations", "",
        *_limitations(facts), "",
        "## Use it", "",
        "```python",
        "from sentence_transformers import SentenceTransformer",
        "",
        f"model = SentenceTransformer({json.dumps(name)})",
        'queries = model.encode_query(["what causes a fever"])',
        'documents = model.encode_document(["Fever is a rise in body temperature.", "Glaciers melt in summer."])',
        "print(model.similarity(queries, documents))  # one row per query: rank documents by it",
        "```", "",
        "## Code", "",
        (f"Trained and exported by [pgrank]({facts.repository})." if facts.repository else
         "Trained and exported by pgrank (this installation records no repository URL)."), "",
        "## Citation", "",
        "```bibtex", CITATION, "```", "",
    ]
    return "\n".join(lines)
