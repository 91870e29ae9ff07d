"""Setting up the OpenTelemetry SDK from the standard environment variables, for the commands
that process events (``eventlanes run``, its worker processes, ``replay``, ``dead-letters``).

Nothing happens unless ``OTEL_TRACES_EXPORTER`` names an exporter (``otlp``, ``console``, or
any installed ``opentelemetry_traces_exporter`` entry point; ``none`` or unset: no tracing),
``OTEL_SDK_DISABLED`` is not ``true``, and the app module did not install a tracer provider of
its own (that one is kept). The SDK then reads the rest itself: ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (the service is ``eventlanes`` unless they name one),
``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_EXPORTER_OTLP_ENDPOINT`` and the other exporter
options, ``OTEL_BSP_*`` for the batch span processor. ``otlp`` sends OTLP over HTTP/protobuf
(the exporter of the ``tracing`` extra) unless ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` (or
``OTEL_EXPORTER_OTLP_PROTOCOL``) says ``grpc``, which needs
``opentelemetry-exporter-otlp-proto-grpc`` installed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import trace

from ..errors import InvalidInputError

_lock = threading.Lock()
_installed: Any = None  # the provider set up here (shut down by :func:`shutdown`)


def configure_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Install an SDK tracer provider as the environment says; True if one was installed now.
    A missing SDK or an unknown exporter is an :class:`InvalidInputError` naming it."""
    global _installed
    env = os.environ if environ is None else environ
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    if not names or names == ["none"] or env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    with _lock:
        if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            return False  # the app set up its own (or this ran before)
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise InvalidInputError(
                f"OTEL_TRACES_EXPORTER={','.join(names)} asks for tracing, but the OpenTelemetry "
                "SDK is not installed: pip install 'eventlanes[tracing]'"
            ) from None
        exporters = [_exporter(name, env) for name in names if name != "none"]
        named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get(
            "OTEL_RESOURCE_ATTRIBUTES", ""
        )
        resource = Resource.create({} if named else {"service.name": "eventlanes"})
        provider = TracerProvider(resource=resource)
        for exporter in exporters:
            provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _installed = provider
        return True


def _exporter(name: str, env: Mapping[str, str]) -> Any:
    if name == "otlp":
        protocol = (
            env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        )
        if protocol not in ("http/protobuf", "grpc"):
            raise InvalidInputError(
                f"OTLP protocol {protocol!r} is not supported: http/protobuf or grpc"
            )
        name = "otlp_proto_grpc" if protocol == "grpc" else "otlp_proto_http"
    found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
    if not found:
        known = sorted(e.name for e in entry_points(group="opentelemetry_traces_exporter"))
        hint = (
            " (pip install 'eventlanes[tracing]')"
            if name == "otlp_proto_http"
            else " (pip install opentelemetry-exporter-otlp-proto-grpc)"
            if name == "otlp_proto_grpc"
            else ""
        )
        raise InvalidInputError(
            f"OTEL_TRACES_EXPORTER: no span exporter {name!r} is installed{hint}; installed: "
            f"{', '.join(['otlp', *known]) if known else 'none'}"
        )
    return found[0].load()()


def shutdown(timeout_ms: int = 5000) -> None:
    """Flush and stop the provider :func:`configure_from_env` installed (spans still queued are
    exported); nothing if it installed none."""
    global _installed
    with _lock:
        provider, _installed = _installed, None
    if provider is not None:
        provider.force_flush(timeout_ms)
        provider.shutdown()
