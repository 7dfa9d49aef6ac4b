"""An HTTP client against Raptor under gunicorn over a raw socket (issue 39, Build item 9):
what a client can put in the request line, the header block and the body."""

from __future__ import annotations

import gzip
import json
import socket
import time

from tests.python.e2e.e2e_harness import Database, Server, StartServer, User, new_key

ORDERS = "/api/trading/orders"
ORDER = json.dumps({"symbol": "AAPL", "side": "buy", "qty": 1}).encode()


def raw(server: Server, request: bytes, timeout: float = 15.0) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as is; the status, headers (lower-cased names) and body of the answer."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


def post(
    server: Server, user: User, header_block: str, body: bytes = ORDER, path: str = ORDERS
) -> tuple[int, dict[str, str], bytes]:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {user.token}\r\n"
        f"Content-Type: application/json\r\n{header_block}"
    )
    if "content-length" not in header_block.lower() and "transfer-encoding" not in header_block.lower():
        head += f"Content-Length: {len(body)}\r\n"
    return raw(server, head.encode("latin-1") + b"\r\n" + body)


def orders(db: Database, user: User) -> int:
    return int(db.scalar("SELECT count(*) FROM raptor.paper_orders WHERE user_id = %s", (user.user_id,)))


def chunked(body: bytes, size: int = 65536) -> bytes:
    return (
        b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size))
        + b"0\r\n\r\n"
    )


def _keyed(server: Server, user: User, block: str, body: bytes = ORDER) -> tuple[int, str | None]:
    status, headers, _ = post(server, user, block, body)
    return status, headers.get("idempotent-replayed")


def test_what_a_client_puts_in_the_header_block_is_one_key_or_none(db: Database, start_server: StartServer) -> None:
    server = start_server(db.app_url, workers=3)
    user = db.seed_user()
    before = orders(db, user)
    # gunicorn drops a field with an underscore (header_map "drop"): no key, and no joined value
    # with a real Idempotency-Key either way
    k = new_key()
    assert _keyed(server, user, f"Idempotency_Key: {new_key()}\r\nIdempotency-Key: {k}\r\n") == (201, None)
    assert _keyed(server, user, f"Idempotency-Key: {k}\r\nIdempotency_Key: {new_key()}\r\n") == (201, "true")
    assert db.key_rows(new_key()) == []
    # OWS around the value, the name's case, quotes: the same key
    k = new_key()
    assert _keyed(server, user, f"Idempotency-Key: \t {k} \t\r\n") == (201, None)
    assert _keyed(server, user, f"IDEMPOTENCY-KEY: {k.upper()}\r\n") == (201, "true")
    assert _keyed(server, user, f'idempotency-key: "{k}"\r\n') == (201, "true")
    # two field lines, whatever their case, or an empty one beside a key: 400, nothing run
    for block in (
        f"IDEMPOTENCY-KEY: {k}\r\nidempotency-key: {k}\r\n",
        f"Idempotency-Key: \r\nIdempotency-Key: {k}\r\n",
    ):
        assert _keyed(server, user, block) == (400, None)
    # obs-fold: gunicorn refuses the request
    assert _keyed(server, user, f"Idempotency-Key:\r\n {new_key()}\r\n")[0] == 400
    # a Latin-1 NEL, NBSP or separator next to the key is no OWS: 400, not the key without it
    for junk in ("\x85", "\xa0", "\x1f"):
        assert _keyed(server, user, f"Idempotency-Key: {k}{junk}\r\n") == (400, None), repr(junk)
    # the key in the query string is no key
    q = new_key()
    assert [post(server, user, "", path=f"{ORDERS}?Idempotency-Key={q}")[0] for _ in range(2)] == [201, 201]
    assert db.key_rows(q) == []
    assert orders(db, user) - before == 1 + 1 + 2


def test_a_body_is_read_whole_and_bounded_before_any_claim(db: Database, start_server: StartServer) -> None:
    server = start_server(db.app_url, workers=3)
    user, other = db.seed_user(), db.seed_user()
    # chunked, no Content-Length, over IDEM_MAX_BODY_BYTES: 413, nothing claimed
    k = new_key()
    big = json.dumps({"symbol": "AAPL", "side": "buy", "qty": 1, "pad": "x" * (3 * 1024 * 1024)}).encode()
    assert post(server, user, f"Transfer-Encoding: chunked\r\nIdempotency-Key: {k}\r\n", chunked(big))[0] == 413
    assert db.key_rows(k) == []
    # chunked in 5-byte chunks and the same body with a length: one fingerprint; a key in a trailer is no key
    k, k2 = new_key(), new_key()
    trailer = chunked(ORDER, 5)[:-2] + f"Idempotency-Key: {k2}\r\n\r\n".encode()
    assert _keyed(server, user, f"Transfer-Encoding: chunked\r\nIdempotency-Key: {k}\r\n", trailer) == (201, None)
    assert _keyed(server, user, f"Idempotency-Key: {k}\r\n") == (201, "true")
    assert db.key_rows(k2) == []
    # a gzip body is hashed as sent (the handler sees those bytes): a re-encoding is another request
    k = new_key()
    zipped = "Content-Encoding: gzip\r\nIdempotency-Key: " + k + "\r\n"
    assert _keyed(server, user, zipped, gzip.compress(ORDER, mtime=1))[0] == 400  # Raptor reads no gzip
    assert _keyed(server, user, zipped, gzip.compress(ORDER, mtime=2))[0] == 422
    # one user's key sent with another's token: a fresh claim in the other's scope
    k = new_key()
    assert _keyed(server, user, f"Idempotency-Key: {k}\r\n") == (201, None)
    assert _keyed(server, other, f"Idempotency-Key: {k}\r\n") == (201, None)
    scopes = db.query("SELECT scope_user_id FROM public.idempotency_keys WHERE idem_key = %s ORDER BY 1", (k,))
    assert scopes == sorted([(user.user_id,), (other.user_id,)])
    # a slow body: no claim until its last byte arrives
    k = new_key()
    head = (
        f"POST {ORDERS} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {user.token}\r\n"
        f"Content-Type: application/json\r\nIdempotency-Key: {k}\r\nContent-Length: {len(ORDER)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(head.encode() + ORDER[:10])
        time.sleep(1.5)
        assert db.key_rows(k) == []
        s.sendall(ORDER[10:])
        assert s.recv(64).startswith(b"HTTP/1.1 201")
    assert db.key_rows(k) == [("completed", 201)]
