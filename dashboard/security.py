"""What the dashboard lets a browser reach: only the stores named at start, only their jobs,
only through an expected Host, with credentials when it listens beyond loopback.

- Stores are fixed when the server starts (``--store`` may repeat); the page offers only those,
  and every callback checks the value it receives against them (a crafted request carrying any
  other path gets nothing).
- Job names are checked against the chosen store's own job list on every read.
- Bound to loopback, the Host header must name a loopback host (a DNS-rebinding page gets 403).
- ``--auth user:password`` turns on HTTP basic auth; it is required to bind a non-loopback address.
- Request bodies over :data:`MAX_BODY_BYTES` get 413 before anything reads them.
- Errors show generic text in the page; the details go to the server log.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import logging
from collections.abc import Iterable
from pathlib import Path

from rankscope.collectors.errors import UsageError
from rankscope.collectors.record_class import record

log = logging.getLogger("rankscope.dashboard")
MAX_BODY_BYTES = 1 << 20
"""The largest request body the dashboard reads: its callbacks send a few ids and values (under 10 KB)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@record
class Access:
    """The stores the page may show (as given on the command line, resolved once)."""

    stores: tuple[str, ...]
    baselines: tuple[str, ...] = ()

    @classmethod
    def of(cls, stores: str | Iterable[str], baselines: str | Iterable[str] | None = ()) -> Access:
        def norm(x):
            xs = [x] if isinstance(x, str) else list(x or ())
            return tuple(dict.fromkeys(str(Path(s).resolve()) for s in xs if s))

        return cls(norm(stores), norm(baselines))

    def store(self, value: object) -> str | None:
        """``value`` when it is one of the stores chosen at start, else None."""
        return value if isinstance(value, str) and value in self.stores else None

    def baseline(self, value: object) -> str | None:
        ok = self.baselines + self.stores
        return value if isinstance(value, str) and value in ok else None


def checked_job(job: object, allowed: Iterable[str]) -> str | None:
    """``job`` when the store lists it, else None (never a path built from what the browser sent)."""
    return job if isinstance(job, str) and job in set(allowed) else None


def parse_auth(value: str | None) -> tuple[str, str] | None:
    if value is None:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise UsageError(f"--auth {value.split(':')[0]!r}:***: expected user:password, both non-empty")
    return user, password


def check_bind(host: str, auth: tuple[str, str] | None) -> None:
    if not is_loopback(host) and auth is None:
        raise UsageError(f"--host {host}: listening beyond loopback needs --auth user:password "
                         "(the dashboard shows a store's contents to whoever reaches it)")


def allowed_hosts(port: int) -> set[str]:
    names = ("127.0.0.1", "localhost", "[::1]")
    return {n for n in names} | {f"{n}:{port}" for n in names}


def install(server, host: str, port: int, auth: tuple[str, str] | None) -> None:
    """Host allow-list (when bound to loopback) and basic auth (when given) on every request."""
    from flask import Response, request

    hosts = allowed_hosts(port) if is_loopback(host) else None
    expected = None if auth is None else f"{auth[0]}:{auth[1]}".encode()
    # Werkzeug enforces this on every body it reads, chunked ones too (413); the guard below refuses a
    # declared length at once. A 250 MB POST had taken the server from 200 to 775 MB for good.
    server.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES

    @server.before_request
    def _guard():
        if hosts is not None and (request.host or "").lower() not in hosts:
            log.warning("refused request with Host %r (bound to %s)", request.host, host)
            return Response("unexpected Host header\n", status=403, mimetype="text/plain")
        if (request.content_length or 0) > MAX_BODY_BYTES:
            log.warning("refused a request body of %s bytes (limit %s)", request.content_length, MAX_BODY_BYTES)
            return Response(f"request body over {MAX_BODY_BYTES:,} bytes\n", status=413, mimetype="text/plain")
        if expected is not None:
            given = request.headers.get("Authorization", "")
            ok = False
            if given.startswith("Basic "):
                try:
                    ok = hmac.compare_digest(base64.b64decode(given[6:], validate=True), expected)
                except (binascii.Error, ValueError):
                    ok = False
            if not ok:
                return Response("authentication required\n", status=401, mimetype="text/plain",
                                headers={"WWW-Authenticate": 'Basic realm="rankscope"'})
        return None


def public_error(what: str, exc: BaseException) -> str:
    """Log the details; give the page a generic line."""
    log.error("%s: %s: %s", what, type(exc).__name__, exc, exc_info=exc)
    return f"{what} (details in the server log)"
