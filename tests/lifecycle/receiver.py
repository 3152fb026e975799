"""A webhook receiver that verifies every delivery with the ``standardwebhooks`` library
(the specification's own verifier, not pairreg's signing code) and appends what it accepted
to a file. Run as a process so a test can kill it mid-stream:

    python -m tests.lifecycle.receiver PORT SECRET LOGFILE
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def make_handler(secret: str, log_path: str) -> type[BaseHTTPRequestHandler]:
    verifier = Webhook(secret)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            try:
                payload = verifier.verify(body, dict(self.headers.items()))
            except WebhookVerificationError as exc:
                self.send_response(400)
                self.end_headers()
                self.wfile.write(str(exc).encode())
                return
            line = {
                "id": self.headers["webhook-id"],
                "type": payload["type"],
                "audit_seq": payload["data"]["audit_seq"],
                "deployments": payload["data"]["deployments"],
            }
            with open(log_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def main() -> None:
    port, secret, log_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(secret, log_path))
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
