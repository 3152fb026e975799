"""Measuring where it serves: a job's suite through a running vLLM, from its own counters.

:class:`VllmExecutor` is an executor for the registry's job loop (``pairreg worker --engine
vllm --engine-url URL``), like :class:`runner.executor.RunnerExecutor` but without a model
on this machine: every prompt of the suite goes to vLLM's OpenAI server at once (chat
prompts through ``/v1/chat/completions``, vLLM rendering the template; raw ones through
``/v1/completions``), and each answer's ``metrics.speculative_decoding`` (vLLM started with
``--per-request-spec-decode-metrics summary``) becomes one prompt row of the same raw
counters the runner records. The statistics and their intervals then come from the same
code as the runner's (:func:`runner.stats.summarize`, the bootstrap over prompts), so an
engine measurement and an embedded one read alike.

How vLLM counts: a full k is drafted on every step, the last ones too, and what is verified
past ``max_tokens`` is counted; that is the runner's ``full_last_draft`` count, recorded as
``engine.counting``. The per-position figures come from each request's acceptance
histogram (``h[j]``: steps that accepted exactly ``j`` drafts): position ``i`` was accepted
on ``sum(h[i+1:])`` steps and verified on ``sum(h[i:])``.

The measurement records the engine, its version and what the server reports about the
configuration it ran under (served name, model root, ``max_model_len``, the k it ran,
``system_fingerprint``); a policy's ``[trust] engines`` decides whether such a measurement
(or only one) opens a gate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from registry.errors import InvalidInput
from runner.executor import RunnerError, suite_prompts
from runner.serving_config import serving_config
from runner.stats import summarize
from runner.suites import Prompt, suite_digest
from runner.version import RUNNER_VERSION

ENGINE_NAME = "vllm"
# vLLM's per-request summary counts every drafted token the target verified, the last
# steps' full drafts included: the runner's ``full_last_draft`` count.
COUNTING = "full_last_draft"
REQUEST_TIMEOUT_S = 1800.0
# Methods vLLM serves as a chain of k drafts (what a pair's k means there).
VLLM_METHODS = ("draft_model", "eagle", "eagle3", "prompt_lookup", "mtp")


class EngineError(InvalidInput):
    """The engine cannot measure this task as asked (no counters, another k, refused the
    request): the job fails at once, retrying would not change it."""


class EngineUnavailable(RuntimeError):
    """The engine did not answer (down, restarting, overloaded): the job loop retries the
    job while attempts remain."""


def histogram_row(spec: dict[str, Any], k: int) -> dict[str, Any]:
    """One request's speculative counters as the runner's raw per-prompt counters."""
    hist = spec.get("acceptance_histogram")
    if not isinstance(hist, list) or not all(isinstance(x, int) for x in hist):
        raise EngineError(
            "vLLM's answer has no acceptance histogram: start it with "
            "--per-request-spec-decode-metrics summary",
            field="engine_url",
        )
    hist = [*hist, *[0] * max(0, k + 1 - len(hist))][: k + 1]
    steps = int(spec["num_spec_steps"])
    return {
        "steps": steps,
        "drafted": int(spec["num_draft_tokens"]),
        "accepted": int(spec["num_accepted_draft_tokens"]),
        # a step that accepted fewer than k drafts stopped at a rejected one
        "rejections": sum(hist[:k]),
        "accepted_per_position": [sum(hist[i + 1 :]) for i in range(k)],
        "verified_per_position": [sum(hist[i:]) for i in range(k)],
        "acceptance_histogram": hist,
    }


class VllmClient:
    """What the executor asks a running vLLM OpenAI server."""

    def __init__(self, url: str, model: str | None = None, timeout: float = REQUEST_TIMEOUT_S):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._model = model
        self._card: dict[str, Any] | None = None

    def _get(self, path: str) -> dict[str, Any]:
        resp = self._call(path, lambda url: httpx.get(url, timeout=30))
        if resp.status_code != 200:
            raise EngineError(
                f"vLLM at {self.url}{path}: HTTP {resp.status_code}", field="engine_url"
            )
        body: dict[str, Any] = resp.json()
        return body

    def _call(self, path: str, send: Callable[[str], httpx.Response]) -> httpx.Response:
        """One request; an engine that cannot be reached or answers 5xx is unavailable (the
        job is tried again), any other answer is the caller's to judge."""
        try:
            resp = send(f"{self.url}{path}")
        except httpx.HTTPError as exc:
            raise EngineUnavailable(f"vLLM at {self.url}{path}: {exc}") from exc
        if resp.status_code >= 500:
            raise EngineUnavailable(f"vLLM at {self.url}{path}: HTTP {resp.status_code}")
        return resp

    def version(self) -> str | None:
        try:
            return str(self._get("/version").get("version"))
        except (EngineError, EngineUnavailable):
            return None

    def card(self) -> dict[str, Any]:
        """The served model's entry in ``/v1/models`` (the only one, or the one named)."""
        if self._card is None:
            models = list(self._get("/v1/models").get("data") or [])
            if self._model is not None:
                models = [m for m in models if m.get("id") == self._model]
            if len(models) != 1:
                raise EngineError(
                    f"vLLM at {self.url} serves {len(models)} matching models; name one "
                    "with --engine-model",
                    field="engine_model",
                )
            self._card = dict(models[0])
        return self._card

    def ask(self, prompt: Prompt, sampling: dict[str, Any]) -> tuple[dict[str, Any], float]:
        """One prompt, as a caller would send it; the answer and its latency in seconds."""
        body: dict[str, Any] = {"model": self.card()["id"], "return_token_ids": True, **sampling}
        if prompt.is_chat:
            path, body["messages"] = (
                "/v1/chat/completions",
                [dict(m) for m in prompt.messages or ()],
            )
        else:
            path, body["prompt"] = "/v1/completions", prompt.prompt
        t0 = time.monotonic()
        resp = self._call(path, lambda url: httpx.post(url, json=body, timeout=self.timeout))
        if resp.status_code != 200:
            raise EngineError(
                f"vLLM answered {resp.status_code} for prompt {prompt.id}: {resp.text[:300]}",
                field="engine_url",
            )
        return dict(resp.json()), time.monotonic() - t0


def _sampling(settings: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "max_tokens": int(settings.get("max_new_tokens", 64)),
        "temperature": float(settings.get("temperature", 0.0)),
        "seed": int(settings.get("seed", 0)),
    }
    if settings.get("top_k") is not None:
        out["top_k"] = int(settings["top_k"])
    if settings.get("top_p") is not None:
        out["top_p"] = float(settings["top_p"])
    return out


def check_task(settings: dict[str, Any], lossy: bool) -> int:
    """The task's k, or why vLLM cannot measure it as the pair is registered."""
    method = settings.get("method")
    if method not in VLLM_METHODS:
        raise RunnerError(
            f"vLLM does not serve method {method!r} as a chain of drafts; it serves "
            + ", ".join(VLLM_METHODS),
            field="method",
        )
    if lossy or settings.get("acceptance", "strict") != "strict" or settings.get("tree"):
        raise RunnerError(
            "vLLM's launch flags express only strict acceptance of a chain (no lossy rule, "
            "no token tree): measure this pair with the embedded runner",
            field="method",
        )
    return int(settings.get("k", 4))


def measure_prompts(
    client: VllmClient,
    prompts: Sequence[Prompt],
    settings: dict[str, Any],
    *,
    lossy: bool = False,
    progress: Callable[[int, int], None] | None = None,
    concurrency: int | None = None,
) -> dict[str, Any]:
    """Every prompt through vLLM at once (or ``concurrency`` at a time, for a bench); the
    result in the stored measurement's shape."""
    k = check_task(settings, lossy)
    card = client.card()
    sampling = _sampling(settings)
    width = max(1, min(concurrency or len(prompts), len(prompts)))
    t0 = time.monotonic()
    with ThreadPoolExecutor(width) as pool:  # all in flight at once by default
        answers = list(pool.map(lambda p: client.ask(p, sampling), prompts))
    wall = time.monotonic() - t0
    rows: list[dict[str, Any]] = []
    fingerprints: set[str] = set()
    ks: set[int] = set()
    for i, (p, (answer, latency)) in enumerate(zip(prompts, answers, strict=True)):
        metrics = answer.get("metrics") or {}
        spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        if not isinstance(spec, dict):
            raise EngineError(
                f"vLLM's answer to {p.id} carries no speculative counters: is it speculating, "
                "and started with --per-request-spec-decode-metrics summary?",
                field="engine_url",
            )
        if isinstance(spec.get("num_spec_tokens"), int):
            ks.add(int(spec["num_spec_tokens"]))
        if answer.get("system_fingerprint"):
            fingerprints.add(str(answer["system_fingerprint"]))
        choice = answer["choices"][0]
        counters = histogram_row(spec, k)
        emitted = int((answer.get("usage") or {}).get("completion_tokens") or 0)
        rows.append({
            "id": p.id,
            "category": p.category,
            "output_ids": list(choice.get("token_ids") or []),
            "prompt_tokens": int((answer.get("usage") or {}).get("prompt_tokens") or 0),
            "finish_reason": choice.get("finish_reason"),
            # the prefill emits one token, then one target call per speculative step
            "target_calls": counters["steps"] + 1,
            "prefill_calls": 1,
            "emitted": emitted,
            "beta_sum": 0.0,
            "beta_count": 0,
            "draft_time_s": 0.0,
            "target_time_s": 0.0,
            "latency_s": round(latency, 4),
            **counters,
        })  # fmt: skip
        if progress:
            progress(i + 1, len(prompts))
    if ks and ks != {k}:
        raise EngineError(
            f"vLLM runs k = {', '.join(map(str, sorted(ks)))}, the pair is measured at k = {k}: "
            "this engine does not serve the pair as registered",
            field="k",
        )
    stats = summarize(rows, k)
    tokens = sum(r["emitted"] for r in rows)
    engine = {
        "name": ENGINE_NAME,
        "version": client.version(),
        "url": client.url,
        "served_model": card.get("id"),
        "root": card.get("root"),
        "max_model_len": card.get("max_model_len"),
        "num_spec_tokens": sorted(ks)[0] if ks else None,
        "system_fingerprint": sorted(fingerprints),
        "counting": COUNTING,
        "concurrency": width,
        "throughput": {
            "tokens": tokens,
            "seconds": round(wall, 4),
            "tokens_per_s": round(tokens / wall, 3) if wall > 0 else None,
        },
    }
    return {
        "settings": {**settings, "k_effective": k},
        "lossy": lossy,
        "categories": stats["categories"],
        "overall": stats["overall"],
        "prompts": rows,
        "hardware": {"device": ENGINE_NAME, "engine": ENGINE_NAME},
        "runner_version": RUNNER_VERSION,
        "suite_digest": suite_digest(list(prompts)),
        "engine": engine,
    }


class VllmExecutor:
    """Measures a job's suite through a running vLLM (see :class:`registry.jobloop.Executor`).

    Its ``runner_version`` is pairreg's, which computes the statistics; the engine and its
    version are recorded in the result's ``engine`` block."""

    runner_version = RUNNER_VERSION

    def __init__(self, url: str, model: str | None = None):
        self.client = VllmClient(url, model)

    def measure(
        self, task: Any, progress: Callable[[int, int], None] | None = None
    ) -> dict[str, Any]:
        prompts = suite_prompts(task.suite_name, task.categories, task.prompts_per_category)
        data = measure_prompts(
            self.client, prompts, dict(task.settings), lossy=task.lossy, progress=progress
        )
        data["prompts_per_category"] = task.prompts_per_category
        data["suite_name"] = task.suite_name
        data["serving_config"] = serving_config(
            dict(task.settings), task.target_dir, task.drafter_dir,
            engine=ENGINE_NAME, engine_version=data["engine"]["version"],
        )  # fmt: skip
        return {
            "result": data,
            "suite_digest": data["suite_digest"],
            "runner_version": self.runner_version,
            "mlflow_run_id": None,
            "device": ENGINE_NAME,
            "settings": task.settings,
        }

    def log_validation(self, validation: Any) -> str | None:
        """No MLflow run from here: a runner worker's sweep logs it (it holds MLflow)."""
        return None
