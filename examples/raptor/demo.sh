#!/usr/bin/env bash
# `make demo`: Raptor under gunicorn, a retrying client, a worker killed mid-order, and a live
# order whose worker is killed after the broker simulator filled it.
#
# Without DATABASE_URL from the caller (EXTERNAL_DB empty), it starts the project's local
# cluster if it is not running (and stops it again at the end), and uses a fresh database
# `raptor_demo` on it. With DATABASE_URL, it uses that database as it is (migrating it).
# The stale window is shortened to $DEMO_STALE_SECONDS (3) and gunicorn's timeout with it.
# Everything it started is stopped on exit, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
PY=${PY:-$root/.venv/bin/python}
export PYTHONPATH=$root   # examples/ from the checkout; idem_shim is installed in the venv
IDEM=$(dirname "$PY")/idem
PORT=${DEMO_PORT:-$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
STALE=${DEMO_STALE_SECONDS:-3}
log=$(mktemp -t raptor-demo-gunicorn.XXXXXX)

gunicorn_pid=""
broker_pid=""
stop_db=0
simdir=$(mktemp -d -t raptor-demo-broker.XXXXXX)
cleanup() {
  if [ -n "$broker_pid" ] && kill -0 "$broker_pid" 2>/dev/null; then
    kill -TERM "$broker_pid" 2>/dev/null || true
    wait "$broker_pid" 2>/dev/null || true
  fi
  rm -rf "$simdir"
  if [ -n "$gunicorn_pid" ] && kill -0 "$gunicorn_pid" 2>/dev/null; then
    kill -TERM "$gunicorn_pid" 2>/dev/null || true
    wait "$gunicorn_pid" 2>/dev/null || true
  fi
  if [ "$stop_db" = 1 ]; then DATABASE_URL= bash scripts/db.sh down || true; fi
  rm -f "$log"
}
trap cleanup EXIT INT TERM

if [ -z "${EXTERNAL_DB:-}" ]; then
  if ! DATABASE_URL= bash scripts/db.sh status >/dev/null 2>&1; then
    DATABASE_URL= bash scripts/db.sh up
    stop_db=1
  fi
  base=$(DATABASE_URL= bash scripts/db.sh url)
  admin_url="${base%/*}/raptor_demo"
  "$PY" - "$base" <<'EOF'
import sys, psycopg
with psycopg.connect(sys.argv[1], autocommit=True) as conn:
    conn.execute("DROP DATABASE IF EXISTS raptor_demo WITH (FORCE)")
    conn.execute("CREATE DATABASE raptor_demo")
EOF
else
  admin_url=$DATABASE_URL
fi

echo "demo: migrating ${admin_url}"
"$IDEM" migrate -q --database-url "$admin_url"
app_url=$("$PY" -m examples.raptor init-db --database-url "$admin_url")
user_json=$("$PY" -m examples.raptor seed-user --database-url "$admin_url" --json \
  --email "demo-$(date +%s)@example.invalid" --cash-cents 10000000)
read -r user_id token < <("$PY" -c 'import json,sys; u=json.load(sys.stdin); print(u["user_id"], u["token"])' <<<"$user_json")

# The broker simulator: its own process and SQLite file (the live step, examples/simulators).
"$PY" -m examples.simulators.broker --port 0 --db "$simdir/broker.sqlite3" >"$simdir/broker.out" 2>"$simdir/broker.log" &
broker_pid=$!
for _ in $(seq 100); do grep -q ' listening on ' "$simdir/broker.out" 2>/dev/null && break; sleep 0.1; done
broker_url=$(awk '/ listening on /{print $NF}' "$simdir/broker.out")
[ -n "$broker_url" ] || { cat "$simdir/broker.log"; echo "demo: the broker simulator did not start" >&2; exit 1; }
echo "demo: broker simulator at ${broker_url}"

echo "demo: starting gunicorn (4 workers, stale window and timeout ${STALE}s) on 127.0.0.1:${PORT}"
DATABASE_URL=$app_url PORT=$PORT WEB_CONCURRENCY=4 IDEM_STALE_AFTER_SECONDS=$STALE \
  GUNICORN_TIMEOUT=$STALE RAPTOR_TEST_HOOKS=1 GUNICORN_LOGLEVEL=warning \
  RAPTOR_LIVE_TRADING=1 RAPTOR_BROKER_URL="$broker_url" \
  "$PY" -m gunicorn -c examples/raptor/gunicorn.conf.py 'examples.raptor:create_app()' \
  >"$log" 2>&1 &
gunicorn_pid=$!
# wait for /healthz (python, not curl: nothing beyond the venv is assumed)
if ! "$PY" -c '
import os, sys, time, urllib.request
port, pid = sys.argv[1], int(sys.argv[2])
for _ in range(150):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
            sys.exit(0)
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        sys.exit(1)
    time.sleep(0.1)
sys.exit(1)
' "$PORT" "$gunicorn_pid"; then
  cat "$log"; echo "demo: gunicorn did not come up" >&2; exit 1
fi
echo "demo: user ${user_id} (paper account, \$100,000.00 cash)"

status=0
DEMO_TOKEN=$token "$PY" -m examples.raptor.demo_client --base "http://127.0.0.1:${PORT}" --admin-url "$admin_url" \
  --user-id "$user_id" --stale-after "$STALE" --broker-url "$broker_url" || status=$?
if [ -n "${DEMO_SHOW_LOG:-}" ] || [ "$status" != 0 ]; then
  echo "--- gunicorn log"; tail -n 50 "$log"
fi
exit $status
