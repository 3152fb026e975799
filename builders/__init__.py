"""pairreg reference builders: the tiny and real reference pairs and their heads.

They download, convert, distil, fine-tune and train the models the suite and the demo
measure; the runner only measures. This package may import the runner (model classes,
prompt encoding, the EAGLE and Medusa heads it loads) and the registry's manifest code;
the runner never imports it (an import-linter contract in ``pyproject.toml``).

Every build is a cached, locked, recipe-keyed stage (:mod:`builders.stage`); where the
caches live is decided in one place (:mod:`builders.settings`).
"""
