"""Connection settings for a Kafka-protocol broker (Apache Kafka, Redpanda, Event Hubs, MSK).

``el.Kafka("broker:9092", {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
"sasl.username": "...", "sasl.password": "..."})``: the bootstrap servers and any librdkafka
option, passed through to the client unchanged (SASL, TLS, timeouts). The command line adds
or overrides options (``run --kafka KEY=VALUE``, ``--kafka-file PATH``): :func:`use_overrides`
holds them in this process, and ``run --processes N`` hands them to each worker in its start
arguments (a pipe), never through the environment (every child process inherits that, and
``/proc/PID/environ`` shows it). ``EVENTLANES_KAFKA`` (JSON), when a user sets it, is read
too; the command line's options win over it.

Secrets never appear in logs or status: ``str()``, ``repr()`` and :meth:`redacted` show
``***`` for every option whose name says it holds one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import EventlanesError, InvalidInputError

#: options a user may not set: eventlanes owns where reading starts and what is committed
OWNED = ("group.id", "enable.auto.commit", "enable.auto.offset.store", "auto.offset.reset",
         "enable.partition.eof", "transactional.id")  # fmt: skip
#: option names holding secrets (substrings, lower case; names are compared in lower case).
#: ``extensions``: SASL/OAUTHBEARER extensions carry tenant and pool ids, often credentials.
SECRET_PARTS = ("password", "secret", "sasl.oauthbearer.config", "ssl.key.pem", "token",
                "ssl.keystore", "private", "extensions")  # fmt: skip
ENV = "EVENTLANES_KAFKA"
_overrides: dict[str, str] = {}  # the command line's options, for this process


def use_overrides(overrides: Mapping[str, str]) -> None:
    """Options every :class:`Kafka` of this process resolves with, over the app's (the
    command line's ``--kafka``/``--kafka-file``)."""
    _overrides.clear()
    _overrides.update(overrides)


def overrides() -> dict[str, str]:
    """The options :func:`use_overrides` set (for handing them to a worker process)."""
    return dict(_overrides)


class KafkaUnavailableError(EventlanesError):
    """The broker could not be reached (or did not answer) within the time allowed."""


def is_secret(option: str) -> bool:
    name = option.lower()
    return any(part in name for part in SECRET_PARTS)


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: ("***" if is_secret(k) else v) for k, v in config.items()}


def parse_properties(text: str, origin: str) -> dict[str, str]:
    """``key=value`` lines (``#`` comments, blank lines), as librdkafka's properties files."""
    config = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise InvalidInputError(f"{origin} line {n}: expected KEY=VALUE")
        config[key.strip()] = value.strip()
    return config


def cli_overrides(options: tuple[str, ...], files: tuple[str, ...]) -> dict[str, str]:
    """``--kafka-file PATH`` (read first) and ``--kafka KEY=VALUE`` options of the CLI."""
    config: dict[str, str] = {}
    for path in files:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise InvalidInputError(f"--kafka-file {path}: {exc.strerror}") from None
        config.update(parse_properties(text, f"--kafka-file {path}"))
    for option in options:
        config.update(parse_properties(option, "--kafka"))
    for key in config:
        _check_option(key)
    return config


def _check_option(key: str) -> None:
    if key in OWNED:
        raise InvalidInputError(
            f"Kafka option {key!r} is set by eventlanes (offsets live in the token store, "
            "reading starts where the token says): remove it"
        )


class Kafka:
    """Where the broker is and how to talk to it; nothing connects until a runner starts."""

    def __init__(
        self,
        bootstrap_servers: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        timeout: float = 10.0,
    ) -> None:
        conf = dict(config or {})
        if bootstrap_servers is not None:
            if not isinstance(bootstrap_servers, str) or not bootstrap_servers.strip():
                raise InvalidInputError(
                    "bootstrap servers must be 'host:port[,host:port...]', "
                    f"got {bootstrap_servers!r}"
                )
            conf["bootstrap.servers"] = bootstrap_servers
        for key in conf:
            if not isinstance(key, str):
                raise InvalidInputError(f"Kafka option names are strings, got {key!r}")
            _check_option(key)
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise InvalidInputError(f"Kafka timeout must be > 0 seconds, got {timeout!r}")
        self._config = conf
        self.timeout = float(timeout)

    def resolved(self) -> dict[str, Any]:
        """The options with ``EVENTLANES_KAFKA`` and the command line's overrides applied."""
        conf = dict(self._config)
        extra = os.environ.get(ENV)
        if extra:
            try:
                overrides = json.loads(extra)
            except ValueError:
                raise InvalidInputError(f"{ENV} is not a JSON object of Kafka options") from None
            conf.update(overrides)
        conf.update(_overrides)
        if not conf.get("bootstrap.servers"):
            raise InvalidInputError(
                "no Kafka bootstrap servers: give el.Kafka('host:9092') or run --kafka "
                "bootstrap.servers=host:9092"
            )
        return conf

    @property
    def bootstrap_servers(self) -> str:
        """The brokers to connect to (``host:port,...``)."""
        return str(self.resolved()["bootstrap.servers"])

    def redacted(self) -> dict[str, Any]:
        """The client options with secrets shown as ``***`` (for logs and status)."""
        return redact(self.resolved())

    def consumer_config(self) -> dict[str, Any]:
        """The options of the consumers eventlanes makes (no group, no offset commits: tokens keep
        the offsets)."""
        conf = self.resolved()
        conf.update({
            "group.id": "eventlanes",  # required by the client; no group is ever joined
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # never jump: an offset the broker no longer has is an error, not a reset
            "auto.offset.reset": "error",
            "enable.partition.eof": False,
        })  # fmt: skip
        conf.setdefault("isolation.level", "read_committed")
        # a broker that holds an empty fetch for the whole wait (Tansu does) delays every
        # record by up to this much: keep it short (the default, 500 ms, was the p50 latency)
        conf.setdefault("fetch.wait.max.ms", 10)
        conf.setdefault("log.connection.close", False)
        return conf

    def producer_config(self) -> dict[str, Any]:
        """The options of the producers eventlanes makes (idempotent, acks from all replicas)."""
        conf = self.resolved()
        # idempotence: retries neither reorder nor duplicate within a producer session
        conf.setdefault("enable.idempotence", True)
        conf.setdefault("acks", "all")
        conf.setdefault("log.connection.close", False)  # idle connections closing: not news
        return conf

    def __repr__(self) -> str:
        return f"Kafka({redact(self._config)!r})"

    __str__ = __repr__


def client_module() -> Any:
    """confluent_kafka, or a clear error naming the extra to install."""
    try:
        import confluent_kafka
    except ImportError as exc:
        raise InvalidInputError(
            f"Kafka needs confluent-kafka ({exc}): pip install 'eventlanes[kafka]'"
        ) from None
    return confluent_kafka
