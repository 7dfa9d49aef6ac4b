"""The scripted client of `make demo`: a retrying client against Raptor under gunicorn, printing a
short transcript of what the idempotency layer does. demo.sh starts the server and calls this.

    DEMO_TOKEN=TOKEN python -m examples.raptor.demo_client --base http://127.0.0.1:8000 \
        --admin-url URL --user-id N --stale-after 3

The user's bearer token comes in the environment, never in the arguments: a process's arguments
are anyone's to read (ps), and a generated token may begin with "-", which an argument parser
takes for an option (one token in 64 made `make demo` fail so).

The admin URL is only used to show the database's side (pg_stat_activity to find the worker
serving a slow order, the rows at the end); the client itself speaks HTTP only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import requests

ORDERS = "/api/trading/orders"
LIVE = "/api/trading/live/orders"


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.base = args.base.rstrip("/")
        self.admin_url = args.admin_url
        self.user_id = args.user_id
        self.stale_after = args.stale_after
        self.auth = {"Authorization": f"Bearer {args.token}"}
        self.broker_url = args.broker_url

    # -- printing ------------------------------------------------------------------------------

    @staticmethod
    def step(title: str) -> None:
        print(f"\n== {title}")

    @staticmethod
    def say(text: str) -> None:
        print(f"   {text}")

    @staticmethod
    def short(key: str) -> str:
        return key[:8] + "…"

    def show(self, r: requests.Response) -> dict[str, Any]:
        body = r.json() if r.content else {}
        self.say(f"<- {r.status_code} {self.summary(body)}{self.header_notes(r)}")
        return body

    @staticmethod
    def summary(body: dict[str, Any]) -> str:
        """An order's answer in one line; anything else as compact JSON."""
        if "order_id" in body and "fill_price_cents" in body:
            text = (
                f"order {body['order_id']} {body['status']}: {body['side']} {body['qty']} "
                f"{body['symbol']} @ {body['fill_price_cents'] / 100:.2f}, "
                f"cash {body['cash_after_cents'] / 100:,.2f}"
            )
            return text + (", idempotency_replayed: true" if body.get("idempotency_replayed") else "")
        return compact(body)

    @staticmethod
    def header_notes(r: requests.Response) -> str:
        notes = [f"{h}: {r.headers[h]}" for h in ("Idempotent-Replayed", "Retry-After") if h in r.headers]
        return f"  [{'; '.join(notes)}]" if notes else ""

    # -- HTTP ----------------------------------------------------------------------------------

    def post(
        self,
        key: str,
        body: dict,
        headers: dict[str, str] | None = None,
        timeout: float = 10.0,
        quiet: bool = False,
        path: str = ORDERS,
    ) -> requests.Response:
        if not quiet:
            self.say(f"-> POST {path}  Idempotency-Key: {self.short(key)}  {compact(body)}")
        return requests.post(
            self.base + path,
            json=body,
            timeout=timeout,
            headers={**self.auth, "Idempotency-Key": key, **(headers or {})},
        )

    def sql(self, query: str, params: Any = None) -> list[tuple]:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def orders_with_key(self, key: str) -> int:
        return self.sql("SELECT count(*) FROM raptor.paper_orders WHERE client_key = %s", (key,))[0][0]

    # -- the story -----------------------------------------------------------------------------

    def run(self) -> int:
        failures = 0
        failures += self.order_and_lost_response()
        failures += self.concurrent_duplicates()
        failures += self.worker_killed()
        if self.broker_url:
            failures += self.live_worker_killed()
        self.trail()
        print()
        print("demo: all checks passed" if not failures else f"demo: {failures} check(s) FAILED")
        return 1 if failures else 0

    def check(self, ok: bool, text: str) -> int:
        self.say(("ok: " if ok else "FAILED: ") + text)
        return 0 if ok else 1

    def order_and_lost_response(self) -> int:
        self.step("1. An order is placed; its response is lost; the client retries")
        key = str(uuid.uuid4())
        body = {"symbol": "AAPL", "side": "buy", "qty": 10}
        try:
            # the server takes 1 s on this one; the client gives up after 0.3 s
            self.post(key, body, {"X-Raptor-Test-Delay-Ms": "1000"}, timeout=0.3)
            self.say("<- (a response arrived after all)")
        except requests.Timeout:
            self.say("<- (no answer within 0.3 s: the client times out; the order may or may not have happened)")
        attempt, first = 1, None
        while True:
            attempt += 1
            self.say(f"retry #{attempt - 1}, same key, same body:")
            r = self.post(key, body)
            first = self.show(r)
            if r.status_code != 409:
                break
            time.sleep(float(r.headers.get("Retry-After", "1")))
        fails = self.check(
            r.status_code == 201 and r.headers.get("Idempotent-Replayed") == "true",
            f"the retry replayed the stored 201 (order {first.get('order_id')})",
        )
        self.say("and again, a plain retry:")
        again = self.show(self.post(key, body))
        fails += self.check(
            again.get("order_id") == first.get("order_id") and self.orders_with_key(key) == 1,
            "same order id; exactly one paper order in the database",
        )
        self.key1, self.body1 = key, body

        self.step("2. The account is switched to live; the same retry meets the gate, not the stored 201")
        self.sql("UPDATE raptor.accounts SET trading_mode = 'live' WHERE user_id = %s", (self.user_id,))
        r = self.post(key, body)
        self.show(r)
        self.sql("UPDATE raptor.accounts SET trading_mode = 'paper' WHERE user_id = %s", (self.user_id,))
        return fails + self.check(
            r.status_code == 403, "the gate runs before the idempotency layer (account switched back to paper)"
        )

    def concurrent_duplicates(self) -> int:
        self.step("3. Ten concurrent duplicates (same key, same body) -> one fill")
        key = str(uuid.uuid4())
        body = {"symbol": "MSFT", "side": "buy", "qty": 5}
        self.say(f"-> 10 x POST {ORDERS}  Idempotency-Key: {self.short(key)}  {compact(body)}, all at once")
        with ThreadPoolExecutor(10) as pool:
            responses = list(pool.map(lambda _: self.post(key, body, quiet=True), range(10)))
        tally = Counter(self.outcome(r) for r in responses)
        for outcome, n in sorted(tally.items()):
            self.say(f"<- {n:2d} x {outcome}")
        # A client told 409 retries after retry_after_ms, as every client should: then each of the
        # ten holds the same answer, and the audit trail shows the replays whatever the race gave.
        for i, r in enumerate(responses):
            while r.status_code == 409:
                time.sleep(r.json().get("retry_after_ms", 100) / 1000)
                r = responses[i] = self.post(key, body, quiet=True)
        ids = {r.json()["order_id"] for r in responses if r.status_code == 201}
        self.say("   each 409 retried after its retry_after_ms: the replay")
        fails = self.check(
            self.orders_with_key(key) == 1 and len(ids) == 1 and all(r.status_code == 201 for r in responses),
            f"one paper order in the database (order {min(ids) if ids else '?'}); all ten hold its 201",
        )

        self.step("4. The same key with another body -> 422")
        r = self.post(key, {**body, "qty": 6})
        self.show(r)
        return fails + self.check(r.status_code == 422 and self.orders_with_key(key) == 1, "refused; nothing executed")

    @staticmethod
    def outcome(r: requests.Response) -> str:
        if r.status_code == 201:
            return (
                "201 replayed (Idempotent-Replayed: true)" if r.headers.get("Idempotent-Replayed") else "201 executed"
            )
        return f"{r.status_code} {r.json().get('error')}"

    def worker_killed(self) -> int:
        self.step(
            f"5. The worker serving an order is killed mid-request (SIGKILL); the retry "
            f"after the stale window ({self.stale_after:g} s) fills exactly once"
        )
        key = str(uuid.uuid4())
        body = {"symbol": "NVDA", "side": "buy", "qty": 20}
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(self.post, key, body, {"X-Raptor-Test-Delay-Ms": "2000"})
            pid = self.slow_worker()
            self.say(f"   worker pid {pid} has written the order and not committed yet: kill -9")
            os.kill(pid, signal.SIGKILL)
            try:
                pending.result()
                self.say("<- (unexpected: an answer)")
            except requests.RequestException as exc:
                self.say(f"<- connection lost ({type(exc).__name__})")
        killed_at = time.monotonic()
        time.sleep(0.5)
        fails = self.check(
            self.orders_with_key(key) == 0, "the killed transaction left nothing: no order, no cash moved"
        )
        rows = self.sql("SELECT status FROM public.idempotency_keys WHERE idem_key = %s", (key,))
        self.say(f"   the key is still held: status {rows[0][0] if rows else '?'} (its holder is dead)")
        self.say("retry at once:")
        self.show(self.post(key, body))
        wait = max(0.0, self.stale_after + 0.3 - (time.monotonic() - killed_at))
        self.say(f"   ... {wait:.1f} s later, past the stale window, retry:")
        time.sleep(wait)
        final: dict[str, Any] = {}
        for _ in range(10):
            r = self.post(key, body)
            final = self.show(r)
            if r.status_code != 409:
                break
            self.say(
                "   (this request found the holder stale and freed the key; the client retries after retry_after_ms)"
            )
            time.sleep(int(final.get("retry_after_ms", 1000)) / 1000)
        fails += self.check(
            r.status_code == 201 and "idempotency_replayed" not in final,
            f"healed and executed once (order {final.get('order_id')})",
        )
        self.say("one more retry:")
        again = self.show(self.post(key, body))
        return fails + self.check(
            again.get("order_id") == final.get("order_id") and self.orders_with_key(key) == 1,
            "replayed; exactly one paper order for this key",
        )

    def broker_fills(self, client_order_id: str | None = None) -> list[dict[str, Any]]:
        fills: list[dict[str, Any]] = requests.get(self.broker_url + "/_sim/fills", timeout=5).json()["fills"]
        return [f for f in fills if client_order_id is None or f["client_order_id"] == client_order_id]

    def live_worker_killed(self) -> int:
        self.step(
            "6. Live: the broker fills the order, then the worker is killed before it completes; the "
            "retry adopts that one fill"
        )
        self.sql("UPDATE raptor.accounts SET trading_mode = 'live' WHERE user_id = %s", (self.user_id,))
        key = str(uuid.uuid4())
        body = {"symbol": "AAPL", "side": "buy", "qty": 7}
        delay = {"X-Raptor-Test-Delay-Ms": "2000", "X-Raptor-Test-Delay-At": "after-broker"}
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(self.post, key, body, delay, path=LIVE)
            pid = self.slow_worker()
            fills = self.broker_fills()
            coid = fills[-1]["client_order_id"] if fills else "?"
            self.say(
                f'   the broker filled client_order_id {coid} (= downstream_key("broker")); '
                f"worker pid {pid} has not completed the key: kill -9"
            )
            os.kill(pid, signal.SIGKILL)
            try:
                pending.result()
                self.say("<- (unexpected: an answer)")
            except requests.RequestException as exc:
                self.say(f"<- connection lost ({type(exc).__name__})")
        killed_at = time.monotonic()
        wait = max(0.0, self.stale_after + 0.3 - (time.monotonic() - killed_at))
        self.say(f"   ... {wait:.1f} s later, past the stale window, the client retries:")
        time.sleep(wait)
        final: dict[str, Any] = {}
        for _ in range(10):
            r = self.post(key, body, path=LIVE)
            final = self.show(r)
            if r.status_code != 409:
                break
            time.sleep(int(final.get("retry_after_ms", 1000)) / 1000)
        ledger = self.broker_fills(coid)
        fails = self.check(
            r.status_code == 201 and final.get("attempt") == 2 and final.get("adopted") is True,
            "the re-execution (attempt() == 2) looked the order up by its client_order_id and adopted it",
        )
        fails += self.check(
            len(ledger) == 1 and ledger[0]["order_id"] == final.get("broker_order_id"),
            f"the broker's ledger holds exactly one fill for it (order {final.get('broker_order_id')})",
        )
        self.say("one more retry:")
        again = self.show(self.post(key, body, path=LIVE))
        self.sql("UPDATE raptor.accounts SET trading_mode = 'paper' WHERE user_id = %s", (self.user_id,))
        return fails + self.check(
            again.get("broker_order_id") == final.get("broker_order_id") and len(self.broker_fills(coid)) == 1,
            "replayed: the same broker order, still one fill (account switched back to paper)",
        )

    def slow_worker(self, timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for (query,) in self.sql(
                "SELECT query FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND query LIKE %s",
                ("%raptor-test-delay pid=%",),
            ):
                m = re.search(r"raptor-test-delay pid=(\d+)", query)
                if m:
                    return int(m.group(1))
            time.sleep(0.05)
        raise SystemExit("demo: the slow order never showed up in pg_stat_activity")

    def trail(self) -> None:
        self.step("7. The audit trail: one business row per execution; replays logged apart")
        rows = self.sql(
            "SELECT id, action, context FROM public.audit_log WHERE user_id = %s ORDER BY id", (self.user_id,)
        )
        i = 0
        while i < len(rows):  # consecutive identical replay rows are shown as one line
            j = i
            while (
                j + 1 < len(rows)
                and rows[j + 1][1] == rows[i][1] == "idempotency_replay"
                and rows[j + 1][2] == rows[i][2]
            ):
                j += 1
            ids = f"{rows[i][0]}" if i == j else f"{rows[i][0]}-{rows[j][0]}"
            times = "" if i == j else f" x{j - i + 1}"
            context = compact(self.abbreviate(rows[i][2]))
            self.say(f"{ids:>6}  {rows[i][1] + times:<22} {context}")
            i = j + 1
        self.step("8. idempotency_keys rows of this user (and the stale-heal events)")
        self.say(f"{'key':<10} {'status':<10} {'code':>4}  {'endpoint':<25} body")
        for key, endpoint, status, code, body in self.sql(
            "SELECT idem_key, scope_endpoint, status, response_code, response_body "
            "FROM public.idempotency_keys WHERE scope_user_id = %s ORDER BY id",
            (self.user_id,),
        ):
            summary = compact(body) if body is not None else "-"
            if len(summary) > 50:
                summary = summary[:47] + "..."
            self.say(f"{self.short(key):<10} {status:<10} {code or '':>4}  {endpoint:<25} {summary}")
        for event, key_id, detail in self.sql(
            "SELECT event, key_id, detail FROM public.idempotency_events WHERE scope_user_id = %s ORDER BY id",
            (self.user_id,),
        ):
            self.say(f"event {event}: key_id {key_id} {compact(self.abbreviate(detail))}")

    @staticmethod
    def abbreviate(context: dict[str, Any]) -> dict[str, Any]:
        return {k: (v[:12] + "…" if k == "request_hash" and isinstance(v, str) else v) for k, v in context.items()}


def parse(argv: list[str] | None = None, environ: Mapping[str, str] = os.environ) -> argparse.Namespace:
    """The command line, and the token from DEMO_TOKEN (see the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--admin-url", required=True)
    parser.add_argument("--user-id", type=int, required=True)
    parser.add_argument("--stale-after", type=float, default=3.0)
    parser.add_argument("--broker-url", default="", help="the broker simulator: adds the live step")
    args = parser.parse_args(argv)
    args.token = environ.get("DEMO_TOKEN") or parser.error("DEMO_TOKEN (the user's bearer token) is not set")
    return args


def main() -> int:
    return Demo(parse()).run()


if __name__ == "__main__":
    sys.exit(main())
