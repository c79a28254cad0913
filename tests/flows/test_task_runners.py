"""Prefect task runners are chosen by name: threads, and the Dask / Ray scale-out engines (pgrank[dask], pgrank[ray]).

The Dask and Ray runners really run: a flow on the runner ``make_task_runner`` builds, against the test
suite's Prefect server, whose tasks report where they ran (a worker process of a local cluster of the
requested size, not the test's own process). Ray's run and the pipeline flow on Dask (the toy DVC project end
to end) are ``-m slow``.
"""

from __future__ import annotations

import builtins
import os

import pytest
from prefect_server import latest_flow_run, task_runs
from toy_pipeline import TOY_STAGES

from flows.pipeline import TASK_RUNNERS, make_task_runner
from pgrank.errors import PgrankError


def test_threads_is_prefects_thread_pool_with_the_worker_bound():
    from prefect.task_runners import ThreadPoolTaskRunner

    runner = make_task_runner("threads", 2)
    assert isinstance(runner, ThreadPoolTaskRunner) and runner._max_workers == 2
    with pytest.raises(PgrankError, match="expected one of threads, dask, ray"):
        make_task_runner("processes")


def where_dask_runs(i: int) -> dict:
    """A task's view of where it runs: its process, its Dask worker and the cluster's workers (none outside Dask)."""
    import time

    from distributed import get_client, get_worker

    time.sleep(0.5)  # long enough for the scheduler to use both workers
    try:
        worker, workers = get_worker().address, get_client().scheduler_info()["workers"]
    except ValueError:  # not in a Dask worker
        worker, workers = None, {}
    return {"pid": os.getpid(), "worker": worker, "cluster": sorted(w["nthreads"] for w in workers.values())}


def ran_on_a_local_dask_cluster(found: list[dict], size: int) -> None:
    """Every task ran in a worker process of one local cluster of ``size`` one-thread workers, and on more than one."""
    assert all(r["cluster"] == [1] * size for r in found), found
    assert os.getpid() not in {r["pid"] for r in found}  # in the cluster's worker processes, not this one
    assert len({r["worker"] for r in found}) > 1


def where_ray_runs(i: int) -> dict:
    import ray

    return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "cpus": ray.cluster_resources()["CPU"]}


def _run(runner_name: str, size: int, probe) -> list[dict]:
    import sys

    import cloudpickle
    from prefect import flow, task

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import a test module
    if runner_name == "ray":
        from ray import cloudpickle as ray_pickle

        ray_pickle.register_pickle_by_value(sys.modules[__name__])
    probe_task = task(probe, name=probe.__name__)

    @flow(name=f"where-{runner_name}-runs", task_runner=make_task_runner(runner_name, size))
    def where() -> list[dict]:
        return [f.result() for f in probe_task.map(range(6))]

    return where()


def test_dask_runner_runs_tasks_on_a_local_cluster_of_the_given_size(prefect_server):
    pytest.importorskip("prefect_dask", reason="pgrank[dask]")
    ran_on_a_local_dask_cluster(_run("dask", 3, where_dask_runs), 3)  # three: not what Dask picks on a 2-core machine


def test_the_cluster_check_fails_on_a_runner_that_runs_tasks_in_this_process(prefect_server, monkeypatch):
    """The check above is no constructor check: "dask" built as the thread pool (a mutation) fails it."""
    pytest.importorskip("distributed", reason="pgrank[dask]")
    monkeypatch.setitem(TASK_RUNNERS, "dask", TASK_RUNNERS["threads"])
    with pytest.raises(AssertionError):
        ran_on_a_local_dask_cluster(_run("dask", 3, where_dask_runs), 3)


def test_ray_runner_is_told_the_cpu_budget():
    from prefect_ray import RayTaskRunner

    runner = make_task_runner("ray", 3)
    assert isinstance(runner, RayTaskRunner) and runner.init_kwargs["num_cpus"] == 3


@pytest.mark.slow  # Ray starts its own cluster: about a minute on 2 busy cores
@pytest.mark.timeout(600)
def test_ray_runner_runs_tasks_in_a_local_ray_cluster_with_the_cpu_budget(prefect_server):
    found = _run("ray", 3, where_ray_runs)
    assert {r["cpus"] for r in found} == {3.0}
    assert os.getpid() not in {r["pid"] for r in found} and len({r["node"] for r in found}) == 1


@pytest.mark.slow  # the toy DVC pipeline, each stage a task on a Dask worker: 1-2 minutes on 2 busy cores
@pytest.mark.timeout(600)
def test_the_pipeline_runs_its_stages_on_dask(prefect_server, toy):
    from flows.pipeline import pgrank_pipeline

    pgrank_pipeline(params_file=str(toy / "params.yaml"), task_runner="dask", max_workers=2)
    runs = task_runs(latest_flow_run("pgrank-pipeline").id)
    assert sorted(t.name for t in runs) == sorted(TOY_STAGES) and all(t.state.is_completed() for t in runs)
    assert (toy / "tables.txt").is_file()


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
