"""A small reverse proxy for the tests: ``python -m tests.prefix_proxy PORT PREFIX UPSTREAM``.

Serves ``http://127.0.0.1:PORT{PREFIX}...`` from ``UPSTREAM`` with the prefix cut off, as an
operator's nginx or ingress would (``location /ops/eventlanes/ { proxy_pass http://up/; }``):
method, headers (Authorization too) and body go through; it adds X-Forwarded-Prefix, -For and
-Host. Anything outside the prefix is a 404, so a page that asks for an absolute URL breaks.
Prints ``ready`` once it listens.
"""

from __future__ import annotations

import http.client
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
       "transfer-encoding", "upgrade", "host"}  # fmt: skip


def make_handler(prefix: str, upstream: str) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(upstream)

    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            if not self.path.startswith(prefix):
                self.send_error(404, "outside the proxied prefix")
                return
            path = "/" + self.path[len(prefix) :]
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            headers.update({"X-Forwarded-Prefix": prefix.rstrip("/"),
                            "X-Forwarded-For": self.client_address[0],
                            "X-Forwarded-Host": self.headers.get("host", "")})  # fmt: skip
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
            try:
                conn.request(self.command, path, body=body, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
            except OSError as exc:
                self.send_error(502, f"upstream: {exc}")
                return
            finally:
                conn.close()
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_HEAD = _forward  # noqa: N815

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            sys.stderr.write(f"proxy: {self.command} {self.path}: {format % args}\n")

    return Proxy


def main() -> None:
    port, prefix, upstream = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(prefix, upstream))
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
