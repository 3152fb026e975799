"""Small chat models (random weights, real tokenizer with a ChatML template), built once
per session: a Llama target, a self-speculative Llama draft (its first layer), a
template-less copy of the target and a GPT-2 target."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.chat.models import make_chat_model


@dataclass(frozen=True)
class ChatModels:
    target: Path
    draft: Path
    no_template: Path
    gpt2: Path


@pytest.fixture(scope="session")
def chat_models(tmp_path_factory: pytest.TempPathFactory) -> ChatModels:
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("chat-models")
    target = make_chat_model(root / "target", layers=2, seed=1)
    return ChatModels(
        target=target,
        draft=make_chat_model(root / "draft", layers=1, seed=2, from_model=target),
        no_template=make_chat_model(root / "no-template", layers=2, seed=1, template=None),
        gpt2=make_chat_model(root / "gpt2", arch="gpt2", layers=2, seed=3),
    )
