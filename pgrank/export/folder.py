"""The exported policy: one trained policy as a folder that plain sentence-transformers loads, with a model card.

``pgrank [--profile P] export --to DIR`` exports the run of the profile's workspace, as its ``params.yaml`` recorded
it (:mod:`pgrank.export.recorded`: the overrides it was made with are not repeated), and writes::

    DIR/modules.json, config_sentence_transformers.json     the sentence-transformers model (prompts, similarity)
    DIR/<module folders>/                                   weights (safetensors), tokenizer, module configs
    DIR/README.md                                           the model card (:mod:`pgrank.export.model_card`)
    DIR/pgrank.json                                         the checkpoint's record, plus what it was exported as

The policy is the folder ``pgrank evaluate`` scores as ``pgrank-<warm start>[+objective]``
(:func:`pgrank.retrieval.dense.retriever.policy_system`): the last epoch, or the one ``train.selection`` chose.
A ``tower: query`` policy is already a sentence-transformers ``Router``: its ``query`` route is the trained
encoder and its ``document`` route the frozen warm start, so ``encode_query`` / ``encode_document`` of a plain
``SentenceTransformer(DIR)`` encode as pgrank does (``encode`` takes the document route). The folder is loaded as
evaluation loads it (float32, safetensors only) and saved with evaluation's ``evaluate.max_seq_length`` and the
policy's similarity (``train.similarity``), so that reranking with it reproduces ``pgrank evaluate``'s figures
under the ``torch`` backend (the ONNX and bf16 backends compute other embeddings: ``metrics.json`` records the
backends behind its figures, and ``python studies/exported_policy.py`` measures the difference).

The folder is written beside ``DIR`` and renamed onto it (:func:`pgrank.atomic.atomic_path`): a kill leaves the
previous export or nothing. ``DIR`` may be an earlier export (its ``pgrank.json`` names what it was exported as),
an empty folder, or new; anything else is refused.

Example:
    >>> run = recorded_run(Path("params.yaml").resolve(), "demo", [])  # the demo's workspace: runs/demo/params.yaml
    >>> exported = export_policy(run.params, run.paths, Path("pgrank-minilm"))
    >>> SentenceTransformer(str(exported.folder)).encode_query(["what causes fever"])
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pgrank.atomic import atomic_path
from pgrank.config import Params
from pgrank.errors import PgrankError
from pgrank.evaluation.stage import model_record
from pgrank.evaluation.systems import kind_of
from pgrank.export.model_card import PolicyFacts, policy_facts, render
from pgrank.models.checkpoint_meta import CHECKPOINT_META, read_checkpoint_meta
from pgrank.paths import Paths, policy_name, run_key
from pgrank.retrieval.dense.retriever import policy_system

# The key of pgrank.json that marks a folder as an export (and names the policy): only such a folder is replaced.
EXPORTED_AS = "exported_as"
CARD = "README.md"


@dataclass(frozen=True)
class Exported:
    """What :func:`export_policy` wrote."""

    system: str  # the policy's name, as pgrank evaluate names it
    source: Path  # its checkpoint folder
    folder: Path  # the export
    facts: PolicyFacts  # what the model card says


def default_policy(params: Params, paths: Paths, warm_start: str | None = None, objective: str | None = None) -> str:
    """The policy ``pgrank export`` exports: ``train.warm_starts[0]`` and ``train.objectives[0]`` (at ``train.seed``)
    unless named.

    Raises:
        PgrankError: a warm start with neither an entry in ``train.warm_starts`` nor a trained policy, an objective
            (or seed) that is not configured.
    """
    warm, run = warm_start or params.train.warm_starts[0], objective or run_key(params.train.objectives[0])
    system = policy_name(warm, run)
    kind_of(params, system)  # an objective or seed not in train.objectives / train.extra_seeds is named there
    if warm not in params.train.warm_starts and not paths.model_dir(warm, run).is_dir():  # `train --warm-start` takes any
        raise PgrankError(f"--warm-start {warm}: not in train.warm_starts {params.train.warm_starts}, and no "
                          f"policy of it under {paths.root / 'models'}")
    return system


def is_export(folder: Path) -> bool:
    """Whether ``folder`` is an earlier export (what ``pgrank export`` may replace)."""
    return EXPORTED_AS in read_checkpoint_meta(folder)


def _check_target(to: Path, source: Path) -> None:
    if to.exists() and not to.is_dir():
        raise PgrankError(f"--to {to}: a file is there; name a folder")
    if to.resolve() == source.resolve() or source.resolve() in to.resolve().parents:
        raise PgrankError(f"--to {to}: inside the policy's own checkpoint {source}; name a folder outside it")
    if to.is_dir() and any(to.iterdir()) and not is_export(to):
        raise PgrankError(f"--to {to}: the folder exists and is not an earlier pgrank export (no {CHECKPOINT_META} "
                          f"naming an exported policy); name a new or empty folder")


def export_policy(params: Params, paths: Paths, to: str | Path, *, warm_start: str | None = None,
                  objective: str | None = None, repo_id: str | None = None, license: str | None = None) -> Exported:
    """Export a run's trained policy to ``to``: a sentence-transformers folder and its model card (see the module
    docstring).

    Args:
        params: the configuration the policy was trained and evaluated with.
        paths: its artifact paths.
        to: the folder to write (new, empty, or an earlier export, which is replaced).
        warm_start: an entry of ``train.warm_starts`` (default: the first).
        objective: an entry of ``train.objectives``, ``<entry>.s<seed>`` for one of ``train.extra_seeds``
            (default: the first entry at ``train.seed``).
        repo_id: the hub repository it is going to (the card's usage example loads it by that name; without one,
            by the folder's absolute path).
        license: the card's license (default: the warm start's, from its own model card).

    Returns:
        The policy's name, its checkpoint, the export folder and the model card's facts.

    Raises:
        PgrankError: an unknown warm start or objective, no trained policy for them, or a ``to`` that holds
            something else; nothing is written.
    """
    from pgrank.models.loading import load_encoder

    system = default_policy(params, paths, warm_start, objective)
    source = Path(policy_system(params, paths, system).query_model)  # the checkpoint evaluation scores
    meta = read_checkpoint_meta(source)
    if not meta:
        raise PgrankError(f"{source}: no {CHECKPOINT_META}; not a policy pgrank trained (run `pgrank train`)")
    to = Path(to).expanduser()
    _check_target(to, source)
    checkpoint = model_record(str(source), paths)  # as metrics.json names it
    facts = policy_facts(params, paths, system, meta, checkpoint, license)
    model = load_encoder(str(source), params.models, device="cpu", max_seq_length=params.evaluate.max_seq_length)
    model.similarity_fn_name = meta.get("similarity", params.train.similarity)
    with atomic_path(to, directory=True) as tmp:
        model.save(str(tmp), create_model_card=False, safe_serialization=True)
        record = {**meta, EXPORTED_AS: system, "checkpoint": checkpoint}
        (tmp / CHECKPOINT_META).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (tmp / CARD).write_text(render(facts, repo_id or str(to.resolve())), encoding="utf-8")
    return Exported(system, source, to, facts)

