"""The operation contract: each operation declared once (``operations``), and what follows
from it (the typed ``Backend`` interface, the embedded ``LocalBackend``; the HTTP routes
and the remote client live in ``api``)."""
