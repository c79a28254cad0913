"""``pgrank``: one subcommand per pipeline stage, each calling one library function.

This module only parses arguments and reports. Heavy libraries (torch, sentence-transformers,
mlflow) are imported inside the commands so that ``pgrank --help`` answers at once.

Global options come before the subcommand::

    pgrank --params params.yaml --profile demo --set train.epochs=2 params
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from pgrank.errors import ENVIRONMENT_EXIT_CODE, PgrankError, environment_message, keep_interrupts


class _App(typer.Typer):
    """Typer app that turns :class:`PgrankError` (and a full disk or a read-only folder) into a one-line
    message and a non-zero exit."""

    def __call__(self, *args, **kwargs):  # noqa: D102
        try:
            return super().__call__(*args, **kwargs)
        except PgrankError as exc:
            typer.echo(f"pgrank: error: {exc}", err=True)
            sys.exit(exc.exit_code)
        except OSError as exc:  # a full disk, a read-only folder: the machine's fault, said in one line
            message = environment_message(exc)
            if message is None:
                raise
            typer.echo(f"pgrank: error: {message}", err=True)
            sys.exit(ENVIRONMENT_EXIT_CODE)


app = _App(
    name="pgrank",
    help="Neural PG-Rank: policy-gradient training of dense retrievers (download → mine → train → evaluate → tables).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


class _Context:
    def __init__(self, params_file: Path, profile: str | None, overrides: list[str]):
        self.params_file = params_file  # absolute: resolved where the user ran pgrank
        self.profile = profile
        self.overrides = overrides

    def params(self):
        from pgrank.config import load_params

        return load_params(self.params_file, self.overrides, self.profile)

    def paths(self, params):
        from pgrank.paths import Paths

        return Paths.from_config(params.paths, base=self.params_file.resolve().parent)


def _absolute_mirror() -> None:
    """A relative ``$PGRANK_BEIR_MIRROR`` means what it meant where the user typed it, also in the stage
    processes that DVC starts inside a profile workspace (another directory): for the commands that start DVC."""
    from pgrank.download.mirror import absolute_mirror_env

    absolute_mirror_env()


def _stderr_handler():
    """A handler that writes to whatever ``sys.stderr`` is when a record is written: one that kept the stream of its
    first call would write to a closed file after a caller (a test's capture, a notebook) swapped ``sys.stderr``."""
    import logging

    class StderrHandler(logging.StreamHandler):
        @property
        def stream(self):
            return sys.stderr

        @stream.setter
        def stream(self, _value) -> None:
            pass

    return StderrHandler()


class _LogFormat:
    """``pgrank: <message>`` for pgrank's own records; ``LEVEL:logger:message`` (logging's default) for a library's."""

    def format(self, record) -> str:
        if record.name == "pgrank" or record.name.startswith("pgrank."):
            return f"pgrank: {record.getMessage()}"
        return f"{record.levelname}:{record.name}:{record.getMessage()}"


def _log_to_stderr() -> None:
    """pgrank's own INFO messages (a stage's wall time and peak memory, what it wrote) on stderr, once each.

    The one handler sits on the root logger: a library that logs through the root logger (``logging.warning``)
    would otherwise install logging's default handler there, and every pgrank message would print twice."""
    import logging

    root = logging.getLogger()
    if not any(isinstance(h.formatter, _LogFormat) for h in root.handlers):
        handler = _stderr_handler()
        handler.setFormatter(_LogFormat())
        root.addHandler(handler)
    logging.getLogger("pgrank").setLevel(logging.INFO)


@app.callback()
def _main(
    ctx: typer.Context,
    params: Annotated[Path, typer.Option("--params", "-p", help="The params file.")] = Path("params.yaml"),
    profile: Annotated[
        Optional[str],
        typer.Option("--profile", "-P", envvar="PGRANK_PROFILE",
                     help="Lay profiles/NAME.yaml over the params file, e.g. demo (default: none, the paper)."),
    ] = None,
    set_: Annotated[
        Optional[list[str]],
        typer.Option("--set", "-s", help="Override a key, e.g. --set train.epochs=2 (repeatable)."),
    ] = None,
) -> None:
    _log_to_stderr()
    keep_interrupts()
    from pgrank import torch_floor

    torch_floor.require()  # one clear error below pgrank's torch, not a TypeError deep in a stage
    ctx.obj = _Context(params.expanduser().resolve(), profile, list(set_ or []))


@app.command("params")
def params_cmd(
    ctx: typer.Context,
    section: Annotated[Optional[str], typer.Argument(help="Only this section, e.g. 'train'.")] = None,
) -> None:
    """Validate the params file and print the resolved configuration as YAML."""
    import yaml

    params = ctx.obj.params()
    data = params.model_dump(mode="json")
    if section is not None:
        if section not in data:
            raise PgrankError(f"{ctx.obj.params_file}: no section {section!r}; sections: {', '.join(data)}")
        data = {section: data[section]}
    typer.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


@app.command("download")
def download_cmd(
    ctx: typer.Context,
    datasets: Annotated[
        Optional[list[str]],
        typer.Argument(help="BEIR dataset names (default: every dataset in data.train and data.eval_sets)."),
    ] = None,
    mirror: Annotated[
        Optional[str],
        typer.Option(
            "--mirror", help="Folder or URL replacing BEIR's server (default: $PGRANK_BEIR_MIRROR, then data.mirror)."
        ),
    ] = None,
) -> None:
    """Download, verify and extract BEIR datasets, then write the validation carve-out of data.train."""
    from pgrank.download.stage import download

    params = ctx.obj.params()
    report = download(params, ctx.obj.paths(params), datasets or None, mirror, config_dir=ctx.obj.params_file.parent)
    for item in report.datasets:
        verified = f", verified by {item.checksum.origin}" if item.checksum else ""
        typer.echo(f"{item.name}: {item.status}{verified} -> {item.path}")
    if report.carve_out is not None:
        carve = report.carve_out
        typer.echo(
            f"{carve.dataset}/{carve.split}: {carve.train_queries} train-pg + {carve.validation_queries} validation"
            + (f" + {carve.gate_queries} gate-pg" if carve.gate_path else "") + f" queries -> {carve.train_path.parent}"
        )


@app.command("mine")
def mine_cmd(
    ctx: typer.Context,
    dataset: Annotated[Optional[str], typer.Option("--dataset", "-d", help="Only this dataset's data.eval_sets splits.")] = None,
    split: Annotated[
        Optional[list[str]], typer.Option("--split", help="With --dataset: exactly this split (repeatable; any BEIR split).")
    ] = None,
    training: Annotated[bool, typer.Option("--training", help="Only the training sets: data.train's carved train-pg and validation "
                                                      "splits, and train.validation_sets.")] = False,
) -> None:
    """Mine stage-1 candidate sets (default: data.train's train-pg/validation and every data.eval_sets entry)."""
    from pgrank.mining.candidate_sets import mine_splits, select_targets, validation_targets

    params = ctx.obj.params()
    targets = select_targets(params, dataset, split or (), training)
    results = mine_splits(params, ctx.obj.paths(params), targets)
    if training or not (dataset or split):  # train.validation_sets: training sets too
        results += mine_splits(params, ctx.obj.paths(params), validation_targets(params), training=True) \
            if params.train.validation_sets else []
    for r in results:
        recall = f", stage-1 recall {r.stage1_recall:.3f}" if r.stage1_recall is not None else ""
        sizes = f"{r.min_size}" if r.min_size == r.max_size else f"{r.min_size}-{r.max_size}"
        notes = "".join([
            f", {r.relevant_missing} relevant pairs not minable (missing from corpus or set)" if r.relevant_missing else "",
            f", {r.oversized} queries with more relevant documents than mine.candidates" if r.oversized else "",
        ])
        typer.echo(f"{r.dataset}/{r.split}: {r.queries} queries x {sizes} candidates ({r.source}){recall}{notes} -> {r.path}")


@app.command("train")
def train_cmd(
    ctx: typer.Context,
    warm_start: Annotated[
        Optional[str],
        typer.Option("--warm-start", "-w", help="Model to start from (alias, hub id or folder; default: each of train.warm_starts)."),
    ] = None,
    objective: Annotated[
        Optional[str],
        typer.Option("--objective", "-o", help="Loss or train.variants name: pg | infonce | listnet | listmle | "
                                               "listmle_topk | lambdaloss | <variant> (default: each of train.objectives)."),
    ] = None,
    seed: Annotated[
        Optional[int],
        typer.Option("--seed", help="train.seed or one of train.extra_seeds (default: every seed)."),
    ] = None,
    device: Annotated[Optional[str], typer.Option("--device", help="cpu, cuda, cuda:1 (default: CUDA when present).")] = None,
) -> None:
    """Train Neural PG-Rank policies (or the other objectives') from their warm starts (data-parallel under torchrun)."""
    from pgrank.core.history import alpha
    from pgrank.paths import run_key
    from pgrank.training.trainer import train

    params = ctx.obj.params()
    paths = ctx.obj.paths(params)
    cfg = params.train
    if objective is not None and objective not in cfg.objectives:
        raise PgrankError(f"--objective {objective}: not in train.objectives {cfg.objectives}")
    if seed is not None and seed != cfg.seed and seed not in cfg.extra_seeds:
        raise PgrankError(f"--seed {seed}: neither train.seed ({cfg.seed}) nor one of train.extra_seeds {cfg.extra_seeds}")
    runs = [(loss, s) for loss, s in cfg.runs() if objective in (None, loss) and seed in (None, s if s is not None else cfg.seed)]
    for name in [warm_start] if warm_start else cfg.warm_starts:
        for loss, run_seed in runs:
            result = train(params, paths, name, objective=loss, seed=run_seed, device=device)
            first, policy = result.history[0], result.policy
            mixture = f", alpha {alpha(policy):g}" if alpha(policy) != 1.0 else ""
            typer.echo(
                f"{name} ({run_key(loss, run_seed)}): validation nDCG@10 {first.get('val_ndcg@10', float('nan')):.4f} "
                f"(epoch 0) -> {policy.get('val_ndcg@10', float('nan')):.4f} (epoch {policy['epoch']}{mixture}); "
                f"model -> {result.final}"
            )


@app.command("evaluate")
def evaluate_cmd(
    ctx: typer.Context,
    system: Annotated[Optional[list[str]], typer.Option("--system", "-m", help="System(s): evaluate.systems entries or pgrank-<warm start>[+objective][@epoch] (default: all).")] = None,
    dataset: Annotated[Optional[list[str]], typer.Option("--dataset", "-d", help="Dataset(s) of data.eval_sets (default: all).")] = None,
) -> None:
    """Evaluate systems as second-stage rerankers and first-stage retrievers; write metrics, per-query values and runs."""
    from pgrank.evaluation.stage import evaluate_dataset
    from pgrank.evaluation.systems import policy_systems

    params = ctx.obj.params()
    paths = ctx.obj.paths(params)
    for name in system or [*params.evaluate.systems.all(), *policy_systems(params)]:
        for ds in dataset or list(params.data.eval_sets_by_dataset()):
            for r in evaluate_dataset(params, paths, name, ds):
                typer.echo(f"{r.system} {r.dataset}/{r.split} {r.stage}: nDCG@10 {r.metrics['ndcg@10']:.4f}, "
                           f"MRR@10 {r.metrics['mrr@10']:.4f}, R@100 {r.metrics['recall@100']:.4f} -> {r.folder}")


@app.command("tables")
def tables_cmd(ctx: typer.Context) -> None:
    """Regenerate the paper's tables (Markdown, LaTeX) and figures (PNG) from the metrics files, next to the paper's numbers."""
    from pgrank.reporting.tables import MAIN_TABLES, make_tables

    params = ctx.obj.params()
    written = make_tables(params, ctx.obj.paths(params))
    by_name = {path.name: path for path in written}
    for name in (*MAIN_TABLES, "objectives"):  # objectives: only with more than one train.objectives entry
        if f"{name}.md" in by_name:
            typer.echo(by_name[f"{name}.md"].read_text(encoding="utf-8"))
    for path in written:
        typer.echo(f"-> {path}")


@app.command("export")
def export_cmd(
    ctx: typer.Context,
    to: Annotated[Path, typer.Option("--to", help="Folder to write (new, empty, or an earlier export, which is replaced).")],
    warm_start: Annotated[Optional[str], typer.Option("--warm-start", "-w", help="The policy of this train.warm_starts entry (default: the first).")] = None,
    objective: Annotated[Optional[str], typer.Option("--objective", "-o", help="The policy of this train.objectives entry, <entry>.s<seed> for an extra seed (default: the first).")] = None,
    hub: Annotated[Optional[str], typer.Option("--hub", help="Then upload the folder to this Hugging Face repository (namespace/name; HF_TOKEN, HF_ENDPOINT).")] = None,
    private: Annotated[bool, typer.Option("--private", help="With --hub: create the repository private.")] = False,
    license: Annotated[Optional[str], typer.Option("--license", help="The model card's license, a hub license id such as apache-2.0 (default: the warm start's, from its model card).")] = None,
) -> None:
    """Export a trained policy as a plain sentence-transformers folder with a model card (and upload it with --hub).
    The run is read as its workspace recorded it (the profile's paths.root/params.yaml): --profile names it, and no
    --set it was made with needs repeating."""
    import re

    from pgrank.export.folder import export_policy
    from pgrank.export.recorded import recorded_run

    if private and hub is None:
        raise PgrankError("--private: only with --hub REPO_ID")
    if license is not None and not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", license):
        raise PgrankError(f"--license {license}: not a hub license id (lower case, e.g. apache-2.0, mit, cc-by-4.0)")
    if hub is not None:
        from pgrank.export.hub import check_upload

        check_upload(hub)
    run = recorded_run(ctx.obj.params_file, ctx.obj.profile, ctx.obj.overrides)
    exported = export_policy(run.params, run.paths, to, warm_start=warm_start, objective=objective, repo_id=hub,
                             license=license)
    facts = exported.facts
    typer.echo(f"{exported.system}: {facts.selection}; nDCG@10 of {len(facts.figures)} evaluated sets and stages in the "
               f"model card -> {exported.folder}")
    typer.echo(f"configuration: {run.source}; license: {facts.license}")
    if hub is not None:
        from pgrank.export.hub import upload

        typer.echo(f"uploaded -> {upload(exported.folder, hub, private=private)}")


@app.command("plan")
def plan_cmd(
    ctx: typer.Context,
    calibrate: Annotated[bool, typer.Option("--calibrate", help="Price the hours with each model's throughput measured on this machine, instead of the GPU rates bench/gpu.py recorded.")] = False,
    device: Annotated[Optional[str], typer.Option("--device", help="With --calibrate: cpu, cuda (default: CUDA when present).")] = None,
) -> None:
    """Print what the configured run costs before anything runs: documents encoded, passes with gradient,
    rankings sampled, candidate pairs, disk and hours, per stage and model. Hours come from the throughput that
    bench/gpu.py measured on a GPU (pgrank/pipeline/measured_rates.yaml), or with --calibrate from this machine."""
    from pgrank.pipeline.plan import calibrate as measure
    from pgrank.pipeline.plan import make_plan, render

    params = ctx.obj.params()
    plan = make_plan(params, ctx.obj.paths(params), ctx.obj.profile or "paper")
    typer.echo(render(measure(params, ctx.obj.paths(params), plan, device=device) if calibrate else plan))


@app.command("repro")
def repro_cmd(
    ctx: typer.Context,
    targets: Annotated[Optional[list[str]], typer.Argument(help="DVC stages to reproduce (default: all).")] = None,
    dry: Annotated[bool, typer.Option("--dry", help="Only print the commands DVC would run.")] = False,
) -> None:
    """`dvc repro` the pipeline for --profile/--set (composed into the profile's own DVC workspace)."""
    from pgrank.pipeline.workspace import repro

    _absolute_mirror()
    ws = repro(ctx.obj.params_file, ctx.obj.profile, ctx.obj.overrides, targets or [], dry=dry)
    typer.echo(f"pipeline workspace: {ws}")
    from pgrank.config import load_params
    from pgrank.paths import WORKSPACE_PARAMS, Paths

    params = load_params(ws / WORKSPACE_PARAMS) if (ws / WORKSPACE_PARAMS).is_file() else None
    if params is None:
        return
    comparison = Paths.from_config(params.paths, base=ws).tables / "objectives.md"  # the compare profile's answer
    if not dry and comparison.is_file() and (not targets or "tables" in targets):
        typer.echo(comparison.read_text(encoding="utf-8"))


@app.command("demo")
def demo_cmd(ctx: typer.Context) -> None:
    """Run the CPU demo end to end through DVC (profile `demo`, offline-capable), then print its tables."""
    from pgrank.config import load_params
    from pgrank.paths import WORKSPACE_PARAMS, Paths
    from pgrank.pipeline.workspace import repro

    profile = ctx.obj.profile or "demo"
    _absolute_mirror()
    ws = repro(ctx.obj.params_file, profile, ctx.obj.overrides)
    params = load_params(ws / WORKSPACE_PARAMS)
    paths = Paths.from_config(params.paths, base=ws)
    for name in ("rerank-in-domain", "full-in-domain", "epoch-ablation"):
        table = paths.tables / f"{name}.md"
        if table.is_file():
            typer.echo(table.read_text(encoding="utf-8"))
    typer.echo(f"All tables and figures: {paths.tables / 'tables.md'}")
    typer.echo(f"MLflow runs: {paths.mlflow_uri()}\n  open the UI: mlflow ui --backend-store-uri {paths.mlflow_uri()}")
    typer.echo("Prefect UI: prefect server start --host 127.0.0.1  (then http://127.0.0.1:4200); "
               f"scheduled retraining: pgrank --profile {profile} --set data.gate_size=300 schedule --cron '0 3 * * 0'")


@app.command("schedule")
def schedule_cmd(
    ctx: typer.Context,
    cron: Annotated[str, typer.Option("--cron", help="Cron string, e.g. '0 3 * * 0' (Sundays 03:00).")],
    pool: Annotated[Optional[str], typer.Option("--pool", help="Deploy to this process work pool (run it with "
                                                 "`prefect worker start --pool NAME`) instead of serving from here.")] = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Deployment name (default: retrain-<profile>).")] = None,
    timezone: Annotated[str, typer.Option("--timezone", help="IANA time zone of the cron string.")] = "UTC",
    start_from: Annotated[str, typer.Option("--start-from", help="warm_start (train.warm_starts) or champion "
                                            "(continual: from the current champion version).")] = "warm_start",
    max_workers: Annotated[Optional[int], typer.Option("--max-workers", help="At most this many stages at once "
                                                       "(default 4; stages that run a model also share the Prefect "
                                                       "limit pgrank-device, one slot per GPU).")] = None,
) -> None:
    """Scheduled retraining (pipeline, then the champion gate) against PREFECT_API_URL: served here, or deployed to --pool."""
    from flows.retraining import cron_schedule, deploy, serve

    cron_schedule(cron, timezone)  # a bad cron string fails before the server is contacted
    ctx.obj.params()  # so does a bad configuration
    _absolute_mirror()  # the scheduled runs start DVC
    args = (ctx.obj.params_file, ctx.obj.profile, ctx.obj.overrides, cron)
    if pool is None:
        serve(*args, name=name, timezone=timezone, start_from=start_from, max_workers=max_workers)
        return
    from prefect.settings import PREFECT_UI_URL

    deployment_id = deploy(*args, pool=pool, name=name, timezone=timezone, start_from=start_from, max_workers=max_workers)
    full_name = f"pgrank-retrain/{name or 'retrain-' + (ctx.obj.profile or 'paper')}"
    typer.echo(f"deployment {full_name} ({deployment_id}) in work pool {pool!r}, cron {cron!r} ({timezone})")
    typer.echo(f"  runs when a worker polls the pool: prefect worker start --pool {pool}")
    typer.echo(f"  run it now: prefect deployment run '{full_name}'")
    if PREFECT_UI_URL.value():
        typer.echo(f"  UI: {PREFECT_UI_URL.value()}/deployments/deployment/{deployment_id}")


if __name__ == "__main__":
    app()
