"""``pgrank``: one subcommand per pipeline stage, each calling one library function.

This module only parses arguments and reports. Heavy libraries (torch, sentence-transformers,
mlflow) are imported inside the commands so that ``pgrank --help`` answers at once.

Global options come before the subcommand::

    pgrank --params params.yaml --set train.epochs=2 params
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from pgrank.errors import PgrankError


class _App(typer.Typer):
    """Typer app that turns :class:`PgrankError` into a one-line message and a non-zero exit."""

    def __call__(self, *args, **kwargs):  # noqa: D102
        try:
            return super().__call__(*args, **kwargs)
        except PgrankError as exc:
            typer.echo(f"pgrank: error: {exc}", err=True)
            sys.exit(exc.exit_code)


app = _App(
    name="pgrank",
    help="Neural PG-Rank: policy-gradient training of dense retrievers (download → mine → train → evaluate → tables).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


class _Context:
    def __init__(self, params_file: Path, overrides: list[str]):
        self.params_file = params_file
        self.overrides = overrides

    def params(self):
        from pgrank.config import load_params

        return load_params(self.params_file, self.overrides)

    def paths(self, params):
        from pgrank.paths import Paths

        return Paths.from_config(params.paths, base=self.params_file.resolve().parent)


@app.callback()
def _main(
    ctx: typer.Context,
    params: Annotated[Path, typer.Option("--params", "-p", help="The params file.")] = Path("params.yaml"),
    set_: Annotated[
        Optional[list[str]],
        typer.Option("--set", "-s", help="Override a key, e.g. --set train.epochs=2 (repeatable)."),
    ] = None,
) -> None:
    ctx.obj = _Context(params, list(set_ or []))


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


if __name__ == "__main__":
    app()
