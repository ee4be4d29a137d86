"""An HTTPS webhook receiver for tests/tests/webhooks.rs, on loopback.

Usage: webhook_receiver.py CERT KEY LOG. Listens on 127.0.0.1 (a free
port, printed as the first stdout line) and appends one JSON line per
request to LOG: {"path", "headers", "body"}. Paths decide the answer:
  /ok                   200
  /flaky                503 twice, then 200
  /gone                 410 (a rejection: not retried)
  /redirect/<b64 url>   307 to the decoded URL
"""

import base64
import json
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CERT, KEY, LOG = sys.argv[1:4]
lock = threading.Lock()
seen = {}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with lock:
            with open(LOG, "a") as f:
                f.write(json.dumps({"path": self.path, "headers": dict(self.headers), "body": body.decode()}) + "\n")
            seen[self.path] = seen.get(self.path, 0) + 1
            n = seen[self.path]
        if self.path.startswith("/redirect/"):
            enc = self.path[len("/redirect/"):]
            target = base64.urlsafe_b64decode(enc + "=" * (-len(enc) % 4)).decode()
            self.send_response(307)
            self.send_header("Location", target)
        elif self.path == "/flaky" and n <= 2:
            self.send_response(503)
        elif self.path == "/gone":
            self.send_response(410)
        else:
            self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(CERT, KEY)
server.socket = ctx.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
