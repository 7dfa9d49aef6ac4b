"""With opentelemetry-api but no SDK's tracer provider, the shim opens no span at all (each
would be a no-op costing CPU); once a provider is set, the same wrappers trace.

Run in a fresh interpreter: the API lets a process set its provider once, and the tracing test
module sets one for the whole session.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from idem_shim import tracing

    class Boom:
        def start_as_current_span(self, *args, **kwargs):
            raise RuntimeError("a span was opened")

    traced = tracing.request(lambda: "handled")
    assert tracing.enabled() and not tracing._live()
    tracing._tracer = Boom()
    assert traced() == "handled"
    assert tracing.claim(lambda c: ("conn", c), "claim") == ("conn", "claim")
    trace.set_tracer_provider(TracerProvider())
    try:
        traced()
    except RuntimeError as exc:
        print("traced:", exc)
    """
)


def test_no_span_without_a_provider_and_spans_once_one_is_set() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "traced: a span was opened"
