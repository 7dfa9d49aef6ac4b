"""gunicorn settings for Raptor: `gunicorn -c examples/raptor/gunicorn.conf.py
'examples.raptor:create_app()'`.

The worker timeout equals the idempotency layer's stale threshold (IDEM_STALE_AFTER_SECONDS,
30 s by default; ADR-0138): a request in flight longer than that has been killed by gunicorn,
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

_owned_metrics_dir = None


def on_starting(server):
    """Prometheus counters are per process; a shared directory lets /metrics sum the workers."""
    global _owned_metrics_dir
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        _owned_metrics_dir = tempfile.mkdtemp(prefix="raptor-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = _owned_metrics_dir


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server):
    if _owned_metrics_dir:
        shutil.rmtree(_owned_metrics_dir, ignore_errors=True)
