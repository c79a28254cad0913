"""The model card's YAML front matter in the Hugging Face hub's format, and the facts it needs from outside the run.

* ``license``: the warm start's, read from its own model card (a fine-tuned policy is its warm start's weights,
  changed), unless ``pgrank export --license`` names one; ``other`` when neither says.
* ``model-index``: one result per evaluated dataset, split and stage, nDCG@10 as ``pgrank evaluate`` wrote it for
  this checkpoint (``metrics.json``), in the hub's format (``huggingface_hub.repocard_data.model_index_to_eval_results``
  reads it back).
* the code's repository: pgrank's ``Repository`` project URL when the installed package names one, else the git
  remote of the checkout it runs from.

Example:
    >>> meta = front_matter(facts)
    >>> meta["model-index"][0]["results"][0]["metrics"][0]
    {'type': 'ndcg_at_10', 'value': 0.7295, 'name': 'nDCG@10'}
"""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path

from pgrank.config import ModelsConfig
from pgrank.export.facts import PolicyFacts
# How the hub names the task of each evaluation stage.
TASKS = {"rerank": ("reranking", "Reranking (second stage)"),
         "full": ("information-retrieval", "Retrieval (first stage, full corpus)")}


def warm_start_license(name: str, models: ModelsConfig) -> str | None:
    """The ``license`` of the warm start's own model card: its offline copy or local folder, else the hub's cached
    card (nothing is downloaded); ``None`` when no card on disk says."""
    from huggingface_hub import ModelCard, try_to_load_from_cache

    from pgrank.errors import PgrankError
    from pgrank.models.names import resolve_model

    try:
        ref = resolve_model(name, models)
    except PgrankError:
        return None
    card: str | Path | None = ref.local_dir / "README.md" if ref.local_dir is not None else None
    if card is None:
        cached = try_to_load_from_cache(ref.hub_id, "README.md", revision=ref.revision)
        card = cached if isinstance(cached, str) else None
    if card is None or not Path(card).is_file():
        return None
    try:
        return ModelCard.load(card).data.license or None
    except (ValueError, OSError):  # a card without front matter, or unreadable
        return None


def repository_url(root: Path | None = None) -> str | None:
    """Where pgrank's code is published: the ``Repository`` URL of the installed package's metadata, else the
    ``origin`` remote of the git checkout at ``root`` (default: the one this module runs from), as an https URL."""
    urls: list[str] = []
    if root is None:
        try:
            urls = metadata.metadata("pgrank").get_all("Project-URL") or []
        except metadata.PackageNotFoundError:  # run from a checkout that is not installed
            urls = []
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() in ("repository", "source", "source code"):
            return url.strip()
    root = root or Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "config", "--get", "remote.origin.url"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    remote = out.stdout.strip()
    if out.returncode != 0 or not remote:
        return None
    if remote.startswith("git@") and ":" in remote:  # git@github.com:owner/name.git
        host, _, path = remote[len("git@"):].partition(":")
        remote = f"https://{host}/{path}"
    remote = remote.removesuffix(".git")
    return remote if remote.startswith(("https://", "http://")) else None


def model_index(facts: PolicyFacts, name: str) -> list[dict]:
    """The hub's ``model-index``: nDCG@10 of ``facts.figures``, one result per dataset, split and stage."""
    results = []
    for f in facts.figures:
        task, task_name = TASKS.get(f.stage, (f.stage, f.stage))
        hub_dataset = f"BeIR/{f.dataset}" if f"BeIR/{f.dataset}" in facts.datasets else f.dataset
        results.append({
            "task": {"type": task, "name": task_name},
            "dataset": {"type": hub_dataset, "name": f"{f.dataset} ({f.split}, {f.queries} queries)", "split": f.split},
            "metrics": [{"type": "ndcg_at_10", "value": round(f.ndcg, 4), "name": "nDCG@10"}],
        })
    return [{"name": name, "results": results}] if results else []


def front_matter(facts: PolicyFacts, name: str) -> dict:
    """The card's YAML metadata (the hub reads it); ``name``: the model's name in ``model-index``."""
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "dense", "pgrank", "learning-to-rank"]
    if facts.loss == "pg":
        tags += ["neural-pg-rank", "policy-gradient"]
    meta: dict = {"license": facts.license, "library_name": "sentence-transformers", "pipeline_tag": "sentence-similarity",
                  "tags": tags}
    if facts.base_model:
        meta["base_model"] = facts.base_model
    if facts.datasets:
        meta["datasets"] = facts.datasets
    index = model_index(facts, name)
    if index:
        meta["model-index"] = index
    return meta
