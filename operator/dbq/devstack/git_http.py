"""A git server over smart HTTP on loopback, for Flux's GitRepository:
`python git_http.py ROOT PORT` serves each bare repository under ROOT at
http://127.0.0.1:PORT/NAME.git through git's own `git http-backend` (a CGI program). It serves
fetches; commits reach the repositories on disk (`git push` to their path).

A script of the standard library only, run by path: it imports nothing of dbq."""

from __future__ import annotations

import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote


class GitBackend(BaseHTTPRequestHandler):
    root = "."

    def do_GET(self) -> None:
        self._backend()

    def do_POST(self) -> None:
        self._backend()

    def _backend(self) -> None:
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_PROJECT_ROOT": self.root,
            "GIT_HTTP_EXPORT_ALL": "1",
            "REQUEST_METHOD": self.command,
            "PATH_INFO": unquote(path),
            "QUERY_STRING": query,
            "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
            "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
            "REMOTE_ADDR": self.client_address[0],
        }
        done = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True)
        head, payload = _split_cgi(done.stdout)
        status, headers = 200, []
        for line in head.splitlines():
            name, _, value = line.partition(":")
            if name.strip().lower() == "status":
                status = int(value.split()[0])
            elif name.strip():
                headers.append((name.strip(), value.strip()))
        if done.returncode != 0 and not head:
            status, payload = 500, done.stderr
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        sys.stdout.write(f"{self.address_string()} {format % args}\n")
        sys.stdout.flush()


def _split_cgi(output: bytes) -> tuple[str, bytes]:
    """A CGI program's headers and body (its header lines end with CRLF or LF)."""
    for separator in (b"\r\n\r\n", b"\n\n"):
        head, found, body = output.partition(separator)
        if found:
            return head.decode("latin-1"), body
    return "", output


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: git_http.py ROOT PORT")
    GitBackend.root = os.path.abspath(sys.argv[1])
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[2])), GitBackend).serve_forever()
