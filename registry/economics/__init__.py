"""Pair economics: does a pair pay off at a batch size, and what does a token cost.

* :mod:`registry.economics.facts`: parameters, weight bytes and KV-cache bytes per token,
  read from an artifact's ``config.json`` and safetensors headers (never the weights).
* :mod:`registry.economics.hardware`: hardware profiles as data (shipped, measured, the
  user's own).
* :mod:`registry.economics.model`: the roofline speed-up model, memory limits, break-even
  batch and cost per million tokens.

The model and where it is weak are documented in ``docs/economics.md``.
"""
