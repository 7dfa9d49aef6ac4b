"""A queue consumer made exactly-once by ``idem_shim.idempotent()`` (contract §4c).

Queues deliver at least once: a consumer that crashed before its ack, a visibility timeout that
ran out, a producer that retried its publish, and the same message comes again, possibly to
another consumer at the same moment. Here a queue (an in-process one, standing in for SQS,
RabbitMQ or Kafka) delivers every message ``--copies`` times, shuffled, to ``--workers``
threads at once; each message moves money on a ledger table. The message id is the
idempotency key, so each one is applied once: the duplicate that comes while the first is
running gets ``InFlightError`` and is put back (a nack), the one that comes after gets the first
run's stored result, and the ledger ends with one row per message.

    python -m examples.queue_consumer --database-url postgresql://…/idem [--messages 200 --copies 3 --workers 8]

It prints one JSON line: messages, deliveries, executions, ledger rows and the balance (the test
asserts executions == ledger rows == messages). The database needs the idem SQL API
(`idem migrate`); the example creates its own table.
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from idem_shim import InFlightError, connection, idempotent

SCHEMA = """
CREATE TABLE IF NOT EXISTS public.queue_demo_ledger (
    message_id  uuid PRIMARY KEY,
    account     text NOT NULL,
    cents       bigint NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def consume(url: str, messages: int, copies: int, workers: int, seed: int = 18) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("TRUNCATE public.queue_demo_ledger")
    rng = random.Random(seed)  # noqa: S311 - a reproducible batch, not a secret
    batch = [
        {"message_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "account": f"acct-{i % 5}", "cents": i + 1}
        for i in range(messages)
    ]
    inbox: queue.Queue[dict[str, Any]] = queue.Queue()
    deliveries = [dict(m) for m in batch for _ in range(copies)]
    rng.shuffle(deliveries)
    for message in deliveries:
        inbox.put(message)

    executions = 0
    counted = threading.Lock()
    with ConnectionPool(url, min_size=workers, max_size=workers, kwargs={"autocommit": True}) as pool:
        pool.wait()

        # A service call: no user scope (user=None). The message's other fields are the
        # fingerprint: the same id with another amount would raise KeyMismatchError.
        @idempotent(scope="ledger.apply", db=pool, key="message_id", ttl_hours=24 * 7)
        def apply(message_id: str, account: str, cents: int) -> dict[str, Any]:
            nonlocal executions
            connection().execute(
                "INSERT INTO public.queue_demo_ledger (message_id, account, cents) VALUES (%s, %s, %s)",
                (message_id, account, cents),
            )
            time.sleep(0.002)  # the work takes a moment, so duplicates meet it in flight
            with counted:
                executions += 1
            return {"applied": message_id, "account": account}

        def worker() -> None:
            while True:
                try:
                    message = inbox.get(timeout=0.5)
                except queue.Empty:
                    return
                try:
                    apply(**message)
                except InFlightError as exc:  # nack: another consumer is on it; it comes back later
                    time.sleep(min(exc.retry_after_ms, 50) / 1000)
                    inbox.put(message)

        threads = [threading.Thread(target=worker) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    with psycopg.connect(url) as conn:
        rows, total = conn.execute("SELECT count(*), coalesce(sum(cents), 0) FROM public.queue_demo_ledger").fetchone()
    return {
        "messages": messages,
        "deliveries": len(deliveries),
        "executions": executions,
        "ledger_rows": rows,
        "ledger_cents": int(total),
        "expected_cents": sum(m["cents"] for m in batch),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--copies", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    print(json.dumps(consume(args.database_url, args.messages, args.copies, args.workers)))


if __name__ == "__main__":
    main()
