#!/usr/bin/env bash
# `make test-wheel`: prove the wheel, not the tree. Builds idem-shim's wheel, installs it into a
# clean virtualenv outside the checkout (runtime dependencies at the versions requirements.txt
# pins, so only PyPI is needed), runs `idem migrate` on a fresh database and the `idem sql` script
# through psql on another (the install plan from the package's own files), `idem status` on both,
# and serves a five-line Flask app that imports only the installed package: a claimed request, a
# replay, a 422.
# A wheel without its SQL fails at `idem migrate`. IDEM_WHEEL=path tests a given wheel instead.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
PY=${PY:-$root/.venv/bin/python}
case $PY in /*) ;; *) PY=$root/$PY ;; esac   # the checks below run from outside the checkout
: "${DATABASE_URL:?DATABASE_URL is not set (make test-wheel sets it)}"
work=$(mktemp -d -t idem-wheel.XXXXXX)
db=idem_wheel_$$
by_script=idem_wheel_sql_$$
cleanup() {
  for name in "$db" "$by_script"; do "$PY" "$root/scripts/testdb.py" drop "$name" >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
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
script_url=$("$PY" "$root/scripts/testdb.py" empty "$by_script")
env -u PYTHONPATH "$work/venv/bin/idem" sql > install.sql
psql -X -q -v ON_ERROR_STOP=1 -f install.sql "$script_url" 2> psql.err || { cat psql.err; exit 1; }
for each in "$url" "$script_url"; do
  env -u PYTHONPATH "$work/venv/bin/idem" status --database-url "$each" > status.txt
  grep -q ", 0 pending" status.txt || { cat status.txt; exit 1; }
done
echo "test-wheel: idem sql through psql installs a second store; idem status: 0 pending on both"

cat > app.py <<'APP'
from flask import Flask
from idem_shim import Idem, idempotency_key
app = Flask(__name__); app.config.from_prefixed_env("APP"); Idem(app)
@app.post("/orders")
@idempotency_key(ttl_hours=24, service=True)  # no sessions here: a declared service route
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
# No tracing extra here: the shim must have imported nothing of OpenTelemetry (tracing.py).
from idem_shim import tracing
assert not tracing.enabled() and not [m for m in sys.modules if m.startswith("opentelemetry")]
print(f"test-wheel: claimed 201, replay 201 (Idempotent-Replayed), other body 422, no OpenTelemetry imported; idem_shim from {idem_shim.__file__}")
CHECK
app_url="${url}?options=-c%20role%3Didem_app"   # the app's least-privileged role
env -u PYTHONPATH APP_IDEM_DATABASE_URL="$app_url" "$work/venv/bin/python" check.py
# The published contract from the installed package: the route, its header and its policy.
env -u PYTHONPATH APP_IDEM_DATABASE_URL="$app_url" "$work/venv/bin/idem" openapi --app app:app > openapi.json
"$work/venv/bin/python" - <<'OPENAPI'
import json
doc = json.load(open("openapi.json"))
op = doc["paths"]["/orders"]["post"]
assert doc["openapi"] == "3.1.0" and op["x-idempotency"]["ttl_seconds"] == 86400, doc
assert [p["name"] for p in op["parameters"]] == ["Idempotency-Key"], op["parameters"]
print("test-wheel: idem openapi lists /orders with its Idempotency-Key and a 24 h ttl")
OPENAPI
