"""Running a declared operation: the one path every edge takes.

The embedded backend (``registry/contract/local.py``) and the HTTP routes (``api/operations.py``,
in whichever lane or write process runs them) both call :func:`run`, so an operation behaves
the same wherever it is asked for: the same context values, the same actor rule, the same
transaction (and the same rerun of a transaction the database rolled back on its own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from registry.contract.spec import CallContext, Operation
from registry.db import transact


def run(
    op: Operation,
    values: Mapping[str, Any],
    context: CallContext,
    *,
    actor: str | None = None,
) -> Any:
    """``op``'s service on already-checked ``values``, in one transaction.

    The context supplies the values the operation declares as context (settings, whether the
    caller is remote); ``actor`` is filled in for operations that record who acted. A
    transaction rolled back by the database itself (a deadlock victim, a connection lost
    mid-transaction) runs again: nothing was written, so nothing is written twice. ``GET``
    operations read without a transaction of their own (``registry.db.session_scope``).
    """
    kwargs = {**values, **op.context_values(context)}
    if op.takes_actor and actor is not None:
        kwargs["actor"] = actor
    return transact(
        context.settings.db_url,
        lambda session: op.service(session, **kwargs),
        read_only=op.method == "GET",
        what=op.name,
    )
