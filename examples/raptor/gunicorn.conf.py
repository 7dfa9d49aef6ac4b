"""gunicorn settings for Raptor: `gunicorn -c examples/raptor/gunicorn.conf.py
'examples.raptor:create_app()'`.

The worker timeout equals the idempotency layer's stale threshold (IDEM_STALE_AFTER_SECONDS,
30 s by default; contract §3): a request in flight longer than that has been killed by gunicorn,
so its key may be healed. Environment: PORT (8000), HOST (127.0.0.1), WEB_CONCURRENCY (4),
GUNICORN_TIMEOUT (defaults to the stale threshold).
"""

import os
import shutil
import tempfile

_stale = os.environ.get("IDEM_STALE_AFTER_SECONDS", "30")

bind = f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "4"))
worker_class = "sync"
timeout = int(float(os.environ.get("GUNICORN_TIMEOUT", _stale)))
graceful_timeout = max(timeout, 5)
keepalive = 2
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "info")
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None
# No preload: each worker builds the app (and its connection pools) after the fork.
preload_app = False

# The directory this master created, remembered in the environment: a HUP re-reads this file
# (resetting module globals) but keeps the master's environment.
_OWNED = "RAPTOR_OWNED_METRICS_DIR"


def on_starting(server):
    """Prometheus counters are per process; a shared directory lets /metrics sum the workers."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ[_OWNED] = tempfile.mkdtemp(prefix="raptor-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = os.environ[_OWNED]


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if os.environ.get(_OWNED):
        shutil.rmtree(os.environ[_OWNED], ignore_errors=True)
