"""``pairreg serve``: initialise the embedded registry if needed and run the API."""

from __future__ import annotations

import gc
import os
import threading
from functools import partial

import typer

from cli.render import console
from registry import db
from registry.services.system import initialise
from registry.settings import get_settings
from registry.trust import audit


def serve(
    host: str = typer.Option("127.0.0.1", help="Interface to bind."),
    port: int = typer.Option(8000, help="Port to listen on."),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    graceful_timeout: int = typer.Option(
        30,
        help="On SIGTERM/SIGINT: seconds in-flight requests get to finish before the "
        "server stops anyway.",
    ),
) -> None:
    """Run the REST API (and dashboard) with uvicorn.

    Bounded: request bodies are capped per route family and must arrive within
    PAIRREG_BODY_TIMEOUT s, headers within PAIRREG_HEADER_TIMEOUT s (see docs/api.md).
    SIGTERM stops accepting connections and lets in-flight requests finish."""
    import uvicorn

    from api.app import create_app
    from api.limits import bounded_protocol

    settings = get_settings()
    report = initialise(settings)
    # soft_wrap: paths and URLs stay on one line, copyable, however narrow the terminal.
    say = partial(console.print, soft_wrap=True, highlight=False)
    say(f"pairreg API on http://{host}:{port}  (docs: http://{host}:{port}/docs)")
    say(f"database: {report.database_url}")
    say(f"admin token: {report.credentials_path}")
    if os.environ.get("PAIRREG_EMBEDDED_WORKER", "1") != "0":
        # Measurement jobs run in this process unless a separate `pairreg worker` is used.
        from cli.worker import start_background_worker

        start_background_worker(settings)
        console.print("background worker: on (PAIRREG_EMBEDDED_WORKER=0 turns it off)")
    # The audit sequencer: events are written without a log-wide lock and integrated into
    # the Merkle tree here, every PAIRREG_SEQUENCER_INTERVAL seconds (and by every reader).
    interval = float(os.environ.get("PAIRREG_SEQUENCER_INTERVAL", audit.SEQUENCER_INTERVAL))
    threading.Thread(
        target=audit.run_sequencer,
        args=(settings.db_url, threading.Event(), interval),
        name="pairreg-audit-sequencer",
        daemon=True,
    ).start()
    if settings.webhook_dispatch:
        from cli.webhooks import make_dispatcher

        make_dispatcher(settings, "serve").start()
        console.print("webhook dispatcher: on (PAIRREG_WEBHOOK_DISPATCH=false turns it off)")
    # The lanes' threads (api/lanes.py) find their connections open, not opened under load.
    db.warm_pool(settings.db_url, settings.read_concurrency + settings.write_concurrency)
    app = create_app(settings)
    pool = app.state.lanes.write.pool
    if pool is not None:  # PAIRREG_WRITE_PROCESSES: started now, not under the first writes
        pool.warm()
        say(f"write worker processes: {pool.processes} (niceness +{pool.nice})")
    # What is loaded by now (modules, the app, the routes: most of the heap) lives as long
    # as the process. Frozen, the cyclic collector's full collections no longer walk it:
    # under the load bench they came every 2-3 s and held the GIL 56-350 ms each, every
    # request stalled meanwhile; frozen, about 25 ms (docs/reliability.md#load).
    gc.collect()
    gc.freeze()
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=bounded_protocol(settings.header_timeout),
        timeout_keep_alive=5,
        timeout_graceful_shutdown=graceful_timeout,
    )


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
