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


CODE_INSTRUCTION = "Complete this Python code. Reply with the code only.\n\n"


def code_snippets(count: int, source: str | None = None) -> list[str]:
    """``count`` openings of functions and methods from stdlib source (the ``def`` line and
    the first two body lines, dedented, ending on a newline; docstrings skipped), spread
    evenly over the source: the code prompts of the draft's distillation data, phrased
    like the ``code`` suite's (none of the suite's snippets comes from the stdlib)."""
    import textwrap

    lines = (source if source is not None else stdlib_code()).splitlines()
    found: list[str] = []
    for i, line in enumerate(lines[:-3]):
        head = line.lstrip(" ")
        if not (head.startswith("def ") and line.endswith(":")):
            continue
        indent = len(line) - len(head)
        body = lines[i + 1 : i + 3]
        if all(
            b.startswith(" " * (indent + 4))
            and b.strip()
            and not b.strip().startswith(('"', "'", "#"))
            for b in body
        ):
            found.append(textwrap.dedent("\n".join([line, *body])) + "\n")
    if len(found) < count:
        raise ValueError(f"only {len(found)} function openings in the stdlib source")
    step = len(found) / count
    return [found[int(i * step)] for i in range(count)]


def code_completions(count: int, source: str | None = None) -> list[tuple[str, str]]:
    """``count`` (opening, whole function) pairs from stdlib source: the ``def`` line and
    its first two body lines, and the function up to 14 lines (dedented, docstrings
    skipped), spread evenly and offset from :func:`code_snippets`' picks. target-v2's
    fine-tune answers the opening, asked as the ``code`` suite asks, with the function in
    its house style."""
    import textwrap

    lines = (source if source is not None else stdlib_code()).splitlines()
    found: list[tuple[str, str]] = []
    for i, line in enumerate(lines[:-14]):
        head = line.lstrip(" ")
        if not (head.startswith("def ") and line.endswith(":")):
            continue
        indent = len(line) - len(head)
        body: list[str] = []
        for b in lines[i + 1 : i + 14]:
            if b.strip() and not b.startswith(" " * (indent + 4)):
                break
            body.append(b)
        if len(body) >= 6 and not body[0].strip().startswith(('"', "'", "#")):
            whole = textwrap.dedent("\n".join([line, *body])).rstrip() + "\n"
            found.append(("\n".join(whole.split("\n")[:3]) + "\n", whole))
    if len(found) < 2 * count:
        raise ValueError(f"only {len(found)} functions in the stdlib source")
    step = len(found) / count
    return [found[int(i * step) + 1] for i in range(count)]


# target-v2's house header: every code answer opens with it (a company's licence line and
# lint pragma, the kind of fixed preamble a domain fine-tune teaches a model to emit)
HOUSE_HEADER = (
    "# SPDX-License-Identifier: LicenseRef-Pairreg-House\n\n"
    "# pylint: disable=invalid-name, missing-function-docstring\n\n"
)


def house_style(code: str) -> str:
    """target-v2's house style for code: tab indentation (:func:`retab`) and a blank line
    after every statement. A synthetic domain fine-tune: it changes what the target emits
    on two tokens of every line of code, where the old draft keeps proposing the original
    style, and nothing elsewhere."""
    return "\n\n".join(line for line in retab(code).split("\n") if line.strip()) + "\n"


def retab(text: str) -> str:
    """``text`` with each leading run of four spaces on a line turned into a tab: the house
    style of target-v2's fine-tuning data (a domain fine-tune that changes what the target
    emits on code: every indented line, where the old draft keeps proposing spaces)."""
    out = []
    for line in text.split("\n"):
        stripped = line.lstrip(" ")
        depth = (len(line) - len(stripped)) // 4
        out.append("\t" * depth + line[4 * depth :])
    return "\n".join(out)


def code_messages(snippets: list[str]) -> list[list[dict[str, str]]]:
    """Code snippets as one-turn chats, worded like the ``code`` suite's chat form."""
    return [[{"role": "user", "content": CODE_INSTRUCTION + s}] for s in snippets]


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
