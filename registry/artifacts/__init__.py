"""Artifacts by content: manifests, Hub resolution, materialising verified bytes, the
facts read from model and tokenizer files, and the speculators checkpoint format.
"""
