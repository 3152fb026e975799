"""Training text for the real reference pair: nothing is downloaded but the model itself.

Three sources, all fixed so a build is reproducible:

* chat prompts (below), rendered with the target tokenizer's own chat template; the
  target's greedy answers to them are the draft's main distillation data (a draft learns
  most from the text its target actually produces when served);
* prose from the language reference that ships with Python (``pydoc_data.topics``);
* Python standard-library source: the ``code`` category the target-v2 fine-tune moves.

None of the chat prompts appears in the built-in suites, so measurements on the suites
are on held-out text.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

CHAT_PROMPTS: tuple[str, ...] = (
    "What is the boiling point of water at sea level?",
    "Explain what a black hole is in simple terms.",
    "Give me three ideas for a rainy weekend.",
    "How do I make a cup of green tea?",
    "Write a short poem about the moon.",
    "What are the primary colours?",
    "Summarize the story of Cinderella in two sentences.",
    "Why is the sky blue?",
    "List four fruits that are high in vitamin C.",
    "What does a software engineer do?",
    "Translate 'thank you very much' into French.",
    "How many days are there in a leap year?",
    "Write a Python function that returns the largest number in a list.",
    "What is the difference between weather and climate?",
    "Give me a tip for staying focused while studying.",
    "Explain what photosynthesis produces.",
    "Write a friendly email inviting a colleague to lunch.",
    "What is the tallest mountain in the world?",
    "Describe a cat to someone who has never seen one.",
    "How does a refrigerator keep food cold?",
    "Write a SQL query that selects all rows from a table named users.",
    "What is 12 plus 30?",
    "Name three famous painters and one work by each.",
    "What should I pack for a day at the beach?",
)


def chat_messages() -> list[list[dict[str, str]]]:
    """The chat prompts as single-turn OpenAI-style message lists."""
    return [[{"role": "user", "content": text}] for text in CHAT_PROMPTS]


def stdlib_code(max_chars: int = 400_000) -> str:
    """Python standard-library source: top-level modules in sorted order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[str] = []
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        chunks.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return "".join(chunks)[:max_chars]


def stdlib_prose(max_chars: int = 400_000) -> str:
    """Prose from the language reference bundled with pydoc."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))[:max_chars]


def windows(ids: list[int], count: int, length: int, stride: int) -> list[list[int]]:
    """``count`` windows of ``length`` tokens, ``stride`` tokens apart (deterministic)."""
    out = []
    for i in range(count):
        start = i * stride
        if start + length > len(ids):
            break
        out.append(ids[start : start + length])
    return out


def digest_sequences(seqs: list[list[int]]) -> str:
    """SHA-256 over the token ids: what the build manifest records as the data identity."""
    return hashlib.sha256(json.dumps(seqs, separators=(",", ":")).encode()).hexdigest()
