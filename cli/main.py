"""The ``pairreg`` command: sub-apps per area, mounted here, with one error boundary."""

from __future__ import annotations

import importlib
import sys

import typer

from cli.render import error_line
from registry.errors import PairregError

app = typer.Typer(
    name="pairreg",
    help="Registry and governance for speculative-decoding pairs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

# (module, attribute, name, help); modules hold one Typer sub-app or a register(app) hook.
SUBAPPS: list[tuple[str, str, str | None, str]] = [
    ("cli.admin", "register", None, ""),
    ("cli.serve", "register", None, ""),
    ("cli.artifacts", "app", "artifact", "Register, show and verify artifacts."),
    ("cli.pairs", "app", "pair", "Register and inspect pairs."),
    ("cli.audit", "app", "audit", "Audit log: events, verification, checkpoints."),
    ("cli.tokens", "app", "token", "API tokens (admin)."),
    ("cli.webhooks", "app", "webhook", "Outgoing webhooks: subscriptions, deliveries (admin)."),
    ("cli.lifecycle", "curve_app", "curve", "Acceptance curves: export and import."),
    ("cli.lifecycle", "mlflow_app", "mlflow", "MLflow registry webhooks in."),
    ("cli.tiny", "app", "tiny", "Build the tiny reference pairs."),
    ("cli.real", "app", "real", "Build the real reference pair (SmolLM2-135M-Instruct)."),
    ("cli.governance", "register", None, ""),
    ("cli.requests", "register", None, ""),
    ("cli.demo", "register", None, ""),
    ("cli.economics", "register", None, ""),
]


def _mount() -> None:
    for module_name, attr, name, help_text in SUBAPPS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue  # an area not built yet
            raise
        obj = getattr(module, attr)
        if name is None:
            obj(app)
        else:
            app.add_typer(obj, name=name, help=help_text)


_mount()


def main() -> None:
    """Entry point: bad input becomes one readable line and exit code 2, never a traceback."""
    try:
        rc = app(standalone_mode=False)
    except PairregError as exc:
        error_line(str(exc))
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        error_line("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        error_line("interrupted")
        sys.exit(130)
    except Exception as exc:  # click's usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        from registry.outages import classify, data_paths
        from registry.settings import get_settings

        outage = classify(exc, where=data_paths(get_settings()))
        if outage is not None:  # a full disk, a lost database: the environment, not a bug
            error_line(f"{outage.title.lower()}: {outage.detail}")
            sys.exit(1)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
