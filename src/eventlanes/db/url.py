"""Parsing of store URLs and validation of user-supplied SQL identifiers."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote_plus, urlsplit, urlunsplit

from ..errors import InvalidInputError

_PREFIX_RE = re.compile(r"[a-z_][a-z0-9_]{0,39}")
DEFAULT_PREFIX = "el_"
SCHEMES = ("sqlite", "postgresql", "postgres")


def validate_prefix(prefix: str) -> str:
    """Table prefixes end up in SQL text, so only a safe identifier shape is accepted."""
    if not isinstance(prefix, str) or not _PREFIX_RE.fullmatch(prefix):
        raise InvalidInputError(
            f"invalid table prefix {prefix!r}: use 1-40 lowercase letters, digits or '_', "
            "not starting with a digit"
        )
    return prefix


@dataclass(frozen=True)
class DatabaseURL:
    """A parsed store URL: which backend, where, and eventlanes' own options."""

    url: str
    backend: str  # "sqlite" or "postgresql"
    target: str  # SQLite file path or libpq connection URL (without eventlanes' options)
    prefix: str = DEFAULT_PREFIX
    options: dict[str, str] = field(default_factory=dict)

    @property
    def redacted(self) -> str:
        """The URL with any password hidden (``user:***@``, ``?password=***``), for error
        messages, logs and the dashboard."""
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 - raises for a malformed host part, as .password may
        except ValueError:
            return "<a malformed URL, not shown>"  # it may hold a password we cannot find
        changed = False
        if parts.password:
            parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
            changed = True
        query = []
        for part in parts.query.split("&") if parts.query else ():
            name = part.split("=", 1)[0]
            if unquote_plus(name).lower() in _SECRET_OPTIONS:  # any case: never shown
                part, changed = f"{name}=***", True
            query.append(part)
        return urlunsplit(parts._replace(query="&".join(query))) if changed else self.url


# libpq options that are secrets: hidden wherever a URL is shown
_SECRET_OPTIONS = {"password", "sslpassword"}

# Options eventlanes understands in the query string; everything else goes to libpq.
_OWN_OPTIONS = {
    "prefix",
    "pool_min",
    "pool_max",
    "pool_timeout",
    "synchronous",
    "busy_timeout",
    "notify",
    "trace",
}


def parse_url(url: str) -> DatabaseURL:
    if not isinstance(url, str) or "://" not in url:
        shown = url if isinstance(url, str) else repr(url)
        if "@" in shown:  # user:password@host without a scheme: the part before @ is hidden
            shown = "***@" + shown.rsplit("@", 1)[1]
        raise InvalidInputError(
            f"invalid store URL {shown!r}: expected 'sqlite:///path/to/file.db' or "
            "'postgresql://user@host/dbname'"
        )
    scheme, rest = url.split("://", 1)
    scheme = scheme.lower()
    if scheme not in SCHEMES:
        raise InvalidInputError(
            f"unknown store URL scheme {scheme!r} in {DatabaseURL(url, scheme, '').redacted!r}: "
            "supported are 'sqlite' and 'postgresql'"
        )
    query = ""
    if "?" in rest:
        rest, query = rest.split("?", 1)
    own: dict[str, str] = {}
    passthrough: list[tuple[str, str]] = []
    for key, value in parse_qsl(query, keep_blank_values=True):
        (own.__setitem__(key, value) if key in _OWN_OPTIONS else passthrough.append((key, value)))
    prefix = validate_prefix(own.pop("prefix", DEFAULT_PREFIX))
    if own.get("trace", "on").lower() not in ("on", "off"):
        where = DatabaseURL(url, scheme, "").redacted
        raise InvalidInputError(f"invalid trace={own['trace']!r} in {where!r}: on or off")
    if scheme == "sqlite":
        if passthrough:
            names = ", ".join(k for k, _ in passthrough)
            where = DatabaseURL(url, scheme, "").redacted
            raise InvalidInputError(f"unknown SQLite store option(s) {names} in {where!r}")
        if not rest.startswith("/") or rest == "/":
            where = DatabaseURL(url, scheme, "").redacted
            raise InvalidInputError(
                f"invalid SQLite URL {where!r}: use 'sqlite:///relative.db' or 'sqlite:////abs/path.db'"
            )
        if rest[1:] == ":memory:":
            raise InvalidInputError(
                "sqlite:///:memory: is not supported: every thread and process needs the same "
                "database; use a file (e.g. sqlite:////tmp/events.db)"
            )
        return DatabaseURL(url, "sqlite", rest[1:], prefix, own)
    libpq_query = "&".join(f"{k}={v}" for k, v in passthrough)
    target = f"postgresql://{rest}" + (f"?{libpq_query}" if libpq_query else "")
    return DatabaseURL(url, "postgresql", target, prefix, own)
