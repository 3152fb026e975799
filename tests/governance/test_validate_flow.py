"""The validate flow (``registry.flows.validate_and_wait``) on its own, with a scripted
executor: embedded, a queued job is run in-process and its validation fetched (the MLflow run
logged once); a failed job raises InvalidInput naming ``pair``; remote, nothing runs here and
the executor is not even built until something needs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from api.backend import local_backend
from registry.errors import InvalidInput
from registry.flows import validate_and_wait
from registry.records.governance import ValidateResult, ValidationRecord
from registry.settings import Settings
from tests.governance.helpers import add_model, make_pair, put_test_policy, synthetic_result

SUITE = "e" * 64


class ScriptedExecutor:
    """Records every call the flow makes of it; measures plain numbers (or fails)."""

    runner_version = "flow-exec-1"

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.calls: list[tuple[Any, ...]] = []

    def suite_digest(
        self, suite_name: str, categories: list[str] | None, prompts_per_category: int
    ) -> str:
        self.calls.append(("suite_digest", suite_name))
        return SUITE

    def measure(self, task: Any, progress: Any = None) -> dict[str, Any]:
        self.calls.append(("measure", task.pair_digest, task.target_dir, task.drafter_dir))
        if self.fail:
            raise InvalidInput("the scripted runner refuses this pair", field="pair")
        return {
            "result": synthetic_result({"code": 0.8, "chat": 0.7}, tokens=60),
            "suite_digest": SUITE,
            "runner_version": self.runner_version,
            "settings": task.settings,
            "device": "cpu",
            "mlflow_run_id": None,
        }

    def log_validation(self, validation: Any) -> str | None:
        self.calls.append(("log_validation", validation.id))
        return f"run-{validation.id}"


class Remote:
    """The same registry seen as a remote backend would be (no worker in this process)."""

    mode = "remote"

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _pair(home: Settings, tmp_path: Path, tag: bytes) -> tuple[str, Path, Path]:
    url = home.db_url
    put_test_policy(url)
    t_dir, d_dir = tmp_path / f"t-{tag.hex()}", tmp_path / f"d-{tag.hex()}"
    t = add_model(url, t_dir, "acme/target", "target", b"t" + tag)
    d = add_model(url, d_dir, "acme/draft", "draft", b"d" + tag)
    return make_pair(url, t, d), t_dir, d_dir


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_queued_job_runs_here_then_its_validation_is_fetched(
    home: Settings, tmp_path: Path
) -> None:
    digest, t_dir, d_dir = _pair(home, tmp_path, b"1")
    backend = local_backend(home)
    executor = ScriptedExecutor()
    built: list[int] = []
    logs: list[str] = []

    def factory() -> ScriptedExecutor:
        built.append(1)
        return executor

    out = validate_and_wait(
        backend,
        factory,
        ref=digest,
        policy="test",
        state_dir=tmp_path / "verified",
        log=logs.append,
        poll_s=0.01,
    )
    assert isinstance(out, ValidationRecord)
    assert out.passed is True and out.pair_digest == digest and out.policy_name == "test"
    assert built == [1]  # one executor for identity, the run and the MLflow log
    # identity first (whose runner decides reuse), then the measurement, then the run logged
    assert [c[0] for c in executor.calls] == ["suite_digest", "measure", "log_validation"]
    assert executor.calls[0] == ("suite_digest", "tiny")
    _, measured, target, drafter = executor.calls[1]
    assert measured == digest
    assert Path(target).parent == t_dir and Path(drafter).parent == d_dir  # verified dirs
    assert executor.calls[2] == ("log_validation", out.id) and out.mlflow_run_id == f"run-{out.id}"
    assert logs[0].startswith("measuring (job ") and any(m.endswith(": done") for m in logs)
    job = backend.get_job(id=int(logs[0].split("job ")[1].split(")")[0]))
    assert job.state == "done" and job.result and job.result["validation_id"] == out.id
    assert (job.args["validate"] or {}).get("deployment") is None
    m = backend.get_measurement(id=out.measurement_id)
    assert m.runner_version == executor.runner_version and m.suite_digest == SUITE

    # Asked again: the stored measurement of this runner and suite is reused, nothing runs.
    again = validate_and_wait(backend, lambda: executor, ref=digest, policy="test")
    assert isinstance(again, ValidationRecord) and again.measurement_id == out.measurement_id
    assert [c[0] for c in executor.calls].count("measure") == 1
    assert executor.calls[-1] == ("log_validation", again.id)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_failed_job_names_the_pair(home: Settings, tmp_path: Path) -> None:
    digest, _, _ = _pair(home, tmp_path, b"2")
    backend = local_backend(home)
    executor = ScriptedExecutor(fail=True)
    with pytest.raises(InvalidInput, match="failed: the scripted runner refuses") as caught:
        validate_and_wait(backend, lambda: executor, ref=digest, policy="test", poll_s=0.01)
    assert caught.value.field == "pair"
    assert str(caught.value).startswith("measurement job ")
    assert [c[0] for c in executor.calls] == ["suite_digest", "measure"]  # no run logged
    failed = backend.list_jobs(state="failed").items
    assert len(failed) == 1 and failed[0].attempts == 1  # refused at once, not retried


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_remote_waits_for_a_worker_elsewhere(home: Settings, tmp_path: Path) -> None:
    digest, _, _ = _pair(home, tmp_path, b"3")
    remote = Remote(local_backend(home))
    built: list[int] = []

    def factory() -> ScriptedExecutor:
        built.append(1)
        return ScriptedExecutor()

    queued = validate_and_wait(remote, factory, ref=digest, policy="test", wait=False)  # type: ignore[arg-type]
    assert isinstance(queued, ValidateResult) and queued.state == "queued"
    assert queued.job is not None and queued.job.state == "queued"
    assert built == []  # nothing needed the runner: it is never loaded
    with pytest.raises(InvalidInput, match=f"job {queued.job.id} still queued") as caught:
        validate_and_wait(
            remote,  # type: ignore[arg-type]
            factory,
            ref=digest,
            policy="test",
            timeout=0.05,
            poll_s=0.01,
        )
    assert caught.value.field == "timeout" and built == []
