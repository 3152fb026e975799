"""Runner version: part of every measurement so numbers from different engines are not
silently compared."""

RUNNER_VERSION = "0.1.0"
