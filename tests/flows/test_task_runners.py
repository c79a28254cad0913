"""Prefect task runners are chosen by name: threads, and the Dask / Ray scale-out engines (pgrank[dask], pgrank[ray])."""

from __future__ import annotations

import builtins

import pytest

from flows.pipeline import make_task_runner
from pgrank.errors import PgrankError


def test_threads_is_prefects_thread_pool_with_the_worker_bound():
    from prefect.task_runners import ThreadPoolTaskRunner

    runner = make_task_runner("threads", 2)
    assert isinstance(runner, ThreadPoolTaskRunner) and runner._max_workers == 2
    with pytest.raises(PgrankError, match="expected one of threads, dask, ray"):
        make_task_runner("processes")


def test_dask_runner_runs_on_a_local_cluster_of_the_given_size():
    from prefect_dask import DaskTaskRunner

    runner = make_task_runner("dask", 2)
    assert isinstance(runner, DaskTaskRunner)
    assert runner.cluster_kwargs == {"n_workers": 2, "threads_per_worker": 1}


def test_ray_runner_is_told_the_cpu_budget():
    from prefect_ray import RayTaskRunner

    runner = make_task_runner("ray", 3)
    assert isinstance(runner, RayTaskRunner) and runner.init_kwargs["num_cpus"] == 3


@pytest.mark.parametrize("name", ["dask", "ray"])
def test_a_missing_extra_says_what_to_install(name, monkeypatch):
    real_import = builtins.__import__

    def no_extra(module, *args, **kwargs):
        if module == f"prefect_{name}":
            raise ImportError(f"No module named {module!r}")
        return real_import(module, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_extra)
    with pytest.raises(PgrankError, match=rf"pip install 'pgrank\[{name}\]'"):
        make_task_runner(name)
