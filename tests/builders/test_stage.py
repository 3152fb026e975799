"""The builders' cached, locked, recipe-keyed stages and where their cache lives.

The stages here build a small file instead of a model: what is under test is the caching
(a build of the same recipe is reused, another recipe's marker or a half-written build is
rebuilt), the lock and the settings, not the training.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from builders import real, real_heads, tiny
from builders.settings import CACHE_ENV, REAL_SOURCE_ENV, BuildSettings, build_settings
from builders.stage import Stage, Ticker, recipe_digest


def _stage(**recipe: object) -> Stage:
    return Stage("fake", {"version": "fake-1", **recipe}, "DONE.json", outputs=("out.txt",))


def _maker(calls: list[str], text: str = "built"):  # type: ignore[no-untyped-def]
    def make(root: Path) -> dict[str, object]:
        calls.append(text)
        (root / "out.txt").write_text(text)
        return {"note": text}

    return make


def test_second_run_reuses_the_build(tmp_path: Path) -> None:
    stage, calls = _stage(steps=3), []
    assert stage.run(tmp_path, _maker(calls)) is True
    assert stage.run(tmp_path, _maker(calls, "again")) is False
    assert calls == ["built"]
    meta = json.loads((tmp_path / "DONE.json").read_text())
    assert meta["recipe_digest"] == stage.digest == recipe_digest(stage.recipe)
    assert meta["recipe"] == {"version": "fake-1", "steps": 3}
    assert meta["note"] == "built" and meta["stage"] == "fake"
    assert meta["wall_seconds"] >= 0 and meta["cpu_seconds"] >= 0


def test_digest_mismatch_rebuilds(tmp_path: Path) -> None:
    """A marker naming another recipe's digest (an edited recipe, an older build in the
    same directory) is not reused: the stage builds again and records the new digest."""
    calls: list[str] = []
    old, new = _stage(steps=3), _stage(steps=4)
    assert old.digest != new.digest
    old.run(tmp_path, _maker(calls, "old"))
    assert not new.is_built(tmp_path)
    assert new.run(tmp_path, _maker(calls, "new")) is True
    assert calls == ["old", "new"]
    assert (tmp_path / "out.txt").read_text() == "new"
    assert json.loads((tmp_path / "DONE.json").read_text())["recipe_digest"] == new.digest
    assert not old.is_built(tmp_path)  # and the old recipe would rebuild in turn


def test_missing_output_or_broken_marker_rebuilds(tmp_path: Path) -> None:
    stage, calls = _stage(), []
    stage.run(tmp_path, _maker(calls))
    (tmp_path / "out.txt").unlink()
    assert not stage.is_built(tmp_path)
    stage.run(tmp_path, _maker(calls))
    (tmp_path / "DONE.json").write_text("{not json")
    assert not stage.is_built(tmp_path)
    stage.run(tmp_path, _maker(calls))
    assert len(calls) == 3 and stage.is_built(tmp_path)


def test_failed_build_leaves_no_marker(tmp_path: Path) -> None:
    stage, calls = _stage(), []
    stage.run(tmp_path, _maker(calls))

    def boom(root: Path) -> dict[str, object]:
        raise RuntimeError("training diverged")

    with pytest.raises(RuntimeError):
        stage.run(tmp_path, boom, force=True)
    assert not stage.is_built(tmp_path)  # the old marker went before the build started


def test_a_rebuild_invalidates_the_stages_built_on_it(tmp_path: Path) -> None:
    base = Stage("base", {"v": 1}, "BASE.json", outputs=("out.txt",), dependents=("TOP.json",))
    top = Stage("top", {"v": 1, "base": base.digest}, "TOP.json")
    calls: list[str] = []
    base.run(tmp_path, _maker(calls))
    top.run(tmp_path, lambda root: {})
    assert top.is_built(tmp_path)
    base.run(tmp_path, _maker(calls), force=True)
    assert base.is_built(tmp_path) and not top.is_built(tmp_path)


def test_concurrent_builders_build_once(tmp_path: Path) -> None:
    """Two builders of one recipe: the second waits on the lock, then reuses the build."""
    stage, calls = _stage(), []

    def slow(root: Path) -> dict[str, object]:
        calls.append("built")
        time.sleep(0.3)
        (root / "out.txt").write_text("x")
        return {}

    results: list[bool] = []
    threads = [
        threading.Thread(target=lambda: results.append(stage.run(tmp_path, slow))) for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["built"] and sorted(results) == [False, True]


def test_threads_are_pinned_and_restored(tmp_path: Path) -> None:
    import torch

    before = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
    seen: list[tuple[int, bool]] = []

    def make(root: Path) -> dict[str, object]:
        seen.append((torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()))
        (root / "out.txt").write_text("x")
        return {}

    _stage().run(tmp_path, make, threads=1)
    assert seen == [(1, True)]
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == before


def test_ticker_counts_across_stages() -> None:
    got: list[tuple[str, int, int]] = []
    tick = Ticker(lambda s, d, t: got.append((s, d, t)), 3)
    tick("a")
    tick("b")
    assert got == [("a", 1, 3), ("b", 2, 3)]


def test_settings_from_one_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    env = {CACHE_ENV: str(tmp_path / "c"), REAL_SOURCE_ENV: "/x/model.gguf"}
    assert BuildSettings.from_env(env) == BuildSettings(tmp_path / "c", "/x/model.gguf")
    default = BuildSettings.from_env({})
    assert default.cache_root == Path(platformdirs.user_cache_dir("pairreg"))
    assert default.real_source is None
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "moved"))
    assert build_settings().cache_root == tmp_path / "moved"


def test_builds_are_cached_per_recipe_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Default directories: ``<cache root>/<kind>/<first 16 hex of the recipe digest>``;
    another recipe gets another directory, so two recipes (two branches) keep both."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert tiny.default_tiny_dir() == tmp_path / "tiny" / tiny.MODELS.digest[:16]
    assert Path(tiny.tiny_paths().root) == tiny.default_tiny_dir()
    assert real.default_real_dir() == tmp_path / "real" / real.MODELS.digest[:16]
    assert Path(real_heads.real_heads_paths().eagle) == real.default_real_dir() / "eagle"
    # the heads stages name the models they were trained on
    assert tiny.HEADS.recipe["models"] == tiny.MODELS.digest
    assert real_heads.HEADS.recipe["models"] == real.MODELS.digest
    # the real recipe's digest is the one its builds have always recorded
    assert real.MODELS.digest == recipe_digest(real.RECIPE)
    changed = Stage("tiny-models", {**tiny.RECIPE, "target_steps": 1}, tiny.MARKER)
    assert changed.key != tiny.MODELS.key


def test_tiny_recipe_change_rebuilds_the_models_and_then_the_heads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``build_tiny_pairs`` in a directory whose models marker names another digest builds
    both stages again (the heads name the models' digest); a current build is reused.
    The training itself is replaced by a recorder: the stages' wiring is what is tested."""
    calls: list[str] = []

    def fake_models(paths: tiny.TinyPaths, tick) -> dict[str, object]:  # type: ignore[no-untyped-def]
        calls.append("models")
        for p in (paths.tokenizer, paths.target_v1, paths.target_v2, paths.draft, paths.medusa):
            Path(p).mkdir(parents=True, exist_ok=True)
        return {}

    def fake_heads(paths: tiny.TinyPaths, tick) -> dict[str, object]:  # type: ignore[no-untyped-def]
        calls.append("heads")
        for p in (paths.eagle, paths.eagle3):
            Path(p).mkdir(parents=True, exist_ok=True)
        Path(paths.medusa_tree).write_text("{}")
        return {}

    monkeypatch.setattr(tiny, "_build", fake_models)
    monkeypatch.setattr(tiny, "_build_heads", fake_heads)
    out = tmp_path / "tiny"
    tiny.build_tiny_pairs(out)
    assert calls == ["models", "heads"] and tiny.is_built(out)
    tiny.build_tiny_pairs(out)
    assert calls == ["models", "heads"]  # reused
    marker = out / tiny.MARKER
    meta = json.loads(marker.read_text())
    marker.write_text(json.dumps({**meta, "recipe_digest": "0" * 64}))
    assert not tiny.is_built(out)
    tiny.build_tiny_pairs(out)
    assert calls == ["models", "heads", "models", "heads"] and tiny.is_built(out)
    # heads alone out of date: only the heads are rebuilt
    heads_marker = out / tiny.HEADS_MARKER
    heads_marker.write_text(json.dumps({"recipe_digest": "1" * 64}))
    tiny.build_tiny_pairs(out)
    assert calls[4:] == ["heads"]


def test_real_stages_wiring_without_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real pair's two stages with the training replaced by a recorder: the heads need
    a complete model build, are reused while both digests hold, and count as stale when
    the model build is of another recipe or was built again."""
    calls: list[str] = []

    def fake_models(paths, source, tick):  # type: ignore[no-untyped-def]
        calls.append("models")
        for part in real.PARTS:
            (Path(paths.root) / part).mkdir(parents=True, exist_ok=True)
            (Path(paths.root) / part / "config.json").write_text("{}")
        return {"stage_wall_seconds": {}}

    def fake_heads(paths, tick):  # type: ignore[no-untyped-def]
        calls.append("heads")
        for d in (paths.eagle, paths.eagle3):
            Path(d).mkdir(parents=True, exist_ok=True)
            (Path(d) / "config.json").write_text("{}")
        return {"heads_recipe": real_heads.HEADS_RECIPE}

    monkeypatch.setattr(real, "_build", fake_models)
    monkeypatch.setattr(real_heads, "_build", fake_heads)
    out = tmp_path / "real"
    with pytest.raises(RuntimeError, match="run the model build first"):
        real_heads.build_real_heads(out)
    real.build_real_pair(out)
    real_heads.build_real_heads(out)
    real.build_real_pair(out)
    real_heads.build_real_heads(out)
    assert calls == ["models", "heads"]
    assert real.is_built(out) and real_heads.heads_built(out)
    meta = json.loads((out / real_heads.HEADS_MARKER).read_text())
    assert meta["recipe"] == {"heads": real_heads.HEADS_RECIPE, "models": real.MODELS.digest}
    marker = out / real.MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "recipe_digest": "f" * 64}))
    assert not real.is_built(out) and not real_heads.heads_built(out)
    real.build_real_pair(out)
    assert calls[-1] == "models" and not real_heads.heads_built(out)  # trained on the old
    real_heads.build_real_heads(out)
    assert calls[-2:] == ["models", "heads"] and real_heads.heads_built(out)


def test_tiny_builders_racing_build_each_stage_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``build_tiny_pairs`` calls at once on an empty directory: one builds the models
    and the heads, the other waits on each stage's lock and reuses both."""
    calls: list[str] = []

    def fake_models(paths: tiny.TinyPaths, tick) -> dict[str, object]:  # type: ignore[no-untyped-def]
        calls.append("models")
        time.sleep(0.3)
        for p in (paths.tokenizer, paths.target_v1, paths.target_v2, paths.draft, paths.medusa):
            Path(p).mkdir(parents=True, exist_ok=True)
        return {}

    def fake_heads(paths: tiny.TinyPaths, tick) -> dict[str, object]:  # type: ignore[no-untyped-def]
        calls.append("heads")
        time.sleep(0.3)
        for p in (paths.eagle, paths.eagle3):
            Path(p).mkdir(parents=True, exist_ok=True)
        Path(paths.medusa_tree).write_text("{}")
        return {}

    monkeypatch.setattr(tiny, "_build", fake_models)
    monkeypatch.setattr(tiny, "_build_heads", fake_heads)
    out = tmp_path / "tiny"
    threads = [threading.Thread(target=tiny.build_tiny_pairs, args=(out,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["models", "heads"] and tiny.is_built(out)
