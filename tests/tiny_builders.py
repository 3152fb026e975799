"""Where tests get the tiny reference pairs' builder from: one import to repoint when the
builders move to a package of their own."""

from __future__ import annotations

from runner import TinyPaths, build_tiny_pairs

__all__ = ["TinyPaths", "build_tiny_pairs"]
