"""Who may act: one operator token, from an environment variable or a file.

Without a token the dashboard is read-only (every action is refused with 403 and the page says
so). With one, an action must carry it (``Authorization: Bearer TOKEN``; the page asks for it
once per browser tab), else it is refused with 401 before anything is read or changed. The
comparison takes the same time whatever the guess (``hmac.compare_digest``), and the token is
never logged nor put in a page: only whether one is set.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidInputError

ENV = "EVENTLANES_DASHBOARD_TOKEN"
#: shortest token accepted: a guessable token on a port that steers processors is no lock
MIN_LENGTH = 16
HINT = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'


@dataclass(frozen=True)
class Auth:
    """The operator token (None: read-only) and where it came from (for the page and logs)."""

    _token: bytes | None = field(default=None, repr=False)
    source: str | None = None  # "$EVENTLANES_DASHBOARD_TOKEN" or "--token-file PATH"

    @property
    def read_only(self) -> bool:
        return self._token is None

    def allows(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header carries the token (constant time)."""
        if self._token is None or header is None:
            return False
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), self._token)


def _checked(token: str, where: str) -> bytes:
    token = token.strip()
    if not token:
        raise InvalidInputError(f"the dashboard token in {where} is empty")
    if len(token) < MIN_LENGTH:
        raise InvalidInputError(
            f"the dashboard token in {where} is {len(token)} characters: use at least "
            f"{MIN_LENGTH} (e.g. {HINT})"
        )
    if any(c.isspace() for c in token) or not token.isprintable():
        raise InvalidInputError(
            f"the dashboard token in {where} contains spaces or control characters"
        )
    return token.encode()


def load_auth(token_file: str | None = None, environ: dict[str, str] | None = None) -> Auth:
    """The token of ``--token-file`` or of ``$EVENTLANES_DASHBOARD_TOKEN`` (not both: which one
    counts would be a guess); neither: read-only."""
    env = os.environ if environ is None else environ
    from_env = env.get(ENV)
    if token_file is not None and from_env is not None:
        raise InvalidInputError(
            f"the dashboard token is given twice (--token-file and ${ENV}): use one"
        )
    if token_file is not None:
        path = Path(token_file).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInputError(
                f"cannot read the dashboard token file {token_file}: {exc}"
            ) from None
        return Auth(_checked(text, f"--token-file {token_file}"), f"--token-file {token_file}")
    if from_env is not None:
        return Auth(_checked(from_env, f"${ENV}"), f"${ENV}")
    return Auth()
