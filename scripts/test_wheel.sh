#!/usr/bin/env bash
# `make test-wheel`: prove the wheel, not the tree. Builds idem-shim's wheel, installs it into a
# clean virtualenv outside the checkout (runtime dependencies at the versions requirements.txt
# pins, so only PyPI is needed), runs `idem migrate` on a fresh database, and serves a five-line
# Flask app that imports only the installed package: a claimed request, a replay, a 422.
# A wheel without its SQL fails at `idem migrate`. IDEM_WHEEL=path tests a given wheel instead.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PY:-$root/.venv/bin/python}
case $PY in /*) ;; *) PY=$root/$PY ;; esac   # the checks below run from outside the checkout
: "${DATABASE_URL:?DATABASE_URL is not set (make test-wheel sets it)}"
work=$(mktemp -d -t idem-wheel.XXXXXX)
db=idem_wheel_$$
cleanup() { "$PY" "$root/scripts/testdb.py" drop "$db" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

if [ -z "${IDEM_WHEEL:-}" ]; then
  "$PY" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$work/dist" .
  wheel=$(ls "$work"/dist/idem_shim-*.whl)
else
  wheel=$IDEM_WHEEL
fi
echo "test-wheel: $(basename "$wheel") into a clean virtualenv in $work"
python3 -m venv "$work/venv"
# requirements.txt as constraints (pip takes no extras there: psycopg[binary]==V pins both parts)
sed -E 's/^([A-Za-z0-9_.-]+)\[binary\]==(.*)$/\1==\2\n\1-binary==\2/' requirements.txt > "$work/constraints.txt"
"$work/venv/bin/pip" install -q --disable-pip-version-check -c "$work/constraints.txt" "$wheel"
"$work/venv/bin/idem" --version

url=$("$PY" scripts/testdb.py empty "$db")
cd "$work"   # nothing of the checkout is importable from here
env -u PYTHONPATH "$work/venv/bin/idem" migrate --database-url "$url"

cat > app.py <<'APP'
from flask import Flask
from idem_shim import Idem, idempotency_key
app = Flask(__name__); app.config.from_prefixed_env("APP"); Idem(app)
@app.post("/orders")
@idempotency_key(ttl_hours=24, service=True)  # no session here: a declared service route
def orders(): return {"order_id": 1}, 201
APP
cat > check.py <<'CHECK'
import sys, uuid
import idem_shim
from app import app
assert idem_shim.__file__.startswith(sys.prefix), f"idem_shim imported from {idem_shim.__file__}"
client, key = app.test_client(), str(uuid.uuid4())
first = client.post("/orders", json={"qty": 1}, headers={"Idempotency-Key": key})
again = client.post("/orders", json={"qty": 1}, headers={"Idempotency-Key": key})
other = client.post("/orders", json={"qty": 2}, headers={"Idempotency-Key": key})
assert (first.status_code, first.get_json()) == (201, {"order_id": 1}), (first.status_code, first.data)
assert again.status_code == 201 and again.headers.get("Idempotent-Replayed") == "true", (again.status_code, again.headers)
assert again.get_json() == {"order_id": 1, "idempotency_replayed": True}, again.data
assert other.status_code == 422 and other.get_json() == {"error": "idempotency_key_body_mismatch"}, other.data
print(f"test-wheel: claimed 201, replay 201 (Idempotent-Replayed), other body 422; idem_shim from {idem_shim.__file__}")
CHECK
app_url="${url}?options=-c%20role%3Didem_app"   # the app's least-privileged role
env -u PYTHONPATH APP_IDEM_DATABASE_URL="$app_url" "$work/venv/bin/python" check.py
