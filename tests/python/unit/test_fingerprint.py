"""The request fingerprint (fingerprint.request_json): injective over what the handler can see,
and unchanged for the requests earlier versions fingerprinted the same way (a rolling deploy).

The expected texts of the first test are what the previous version sent for those requests,
byte for byte; the second test's requests differ pairwise in one thing the handler can see.
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

import pytest
from werkzeug.sansio.multipart import Field, File, MultipartDecoder

from idem_shim import errors, fingerprint
from idem_shim.fingerprint import request_json

JSON = "application/json"


def fp(
    data: bytes,
    view_args: dict[str, Any] | None = None,
    query: dict[str, list[str]] | None = None,
    *,
    method: str | None = None,
    content_type: str | None = JSON,
) -> str | None:
    return request_json(data, view_args, query or {}, method=method, content_type=content_type)


@pytest.mark.parametrize(
    ("request_", "previous"),
    [
        (fp(b'{"b": 1.10, "a": [1]}'), '{"b": 1.10, "a": [1]}'),
        (fp(b'{"a": 1}', content_type="application/json; charset=utf-8"), '{"a": 1}'),
        (fp(b'{"a": 1}', content_type='Application/JSON; Charset="UTF-8"'), '{"a": 1}'),
        (fp(b'{"a": 1}', method="POST"), '{"a": 1}'),
        (fp(b"", content_type=None), None),
        (
            fp(b'{"a": 1}', {"order_id": 7}, {"dry": ["1"]}),
            '{"body": {"a": 1}, "path": {"order_id": 7}, "query": {"dry": ["1"]}}',
        ),
        (fp(b"", {"order_id": 7}, content_type=None), '{"body": null, "path": {"order_id": 7}, "query": {}}'),
        (fp(b"[1, 2]", None, {"q": ["x", "y"]}), '{"body": [1, 2], "path": {}, "query": {"q": ["x", "y"]}}'),
    ],
)
def test_the_requests_fingerprinted_before_keep_their_fingerprint(request_: str | None, previous: str | None) -> None:
    assert request_ == previous


DISTINCT = {
    "json body": fp(b'{"note": 1}'),
    "the same bytes as text": fp(b'{"note": 1}', content_type="text/plain"),
    "as text in latin-1": fp(b'{"note": 1}', content_type="text/plain; charset=latin-1"),
    "as a form": fp(b'{"note": 1}', content_type="application/x-www-form-urlencoded"),
    "with no media type": fp(b'{"note": 1}', content_type=None),
    "the same as a PUT under one scope": fp(b'{"note": 1}', method="PUT"),
    "with a query": fp(b'{"note": 1}', None, {"note": ["1"]}),
    "a body shaped like the wrapper": fp(b'{"body": {"note": 1}, "path": {}, "query": {"note": ["1"]}}'),
    "a body shaped like the other wrapper": fp(
        b'{"body": {"note": 1}, "method": "PUT", "path": {}, "query": {}, "type": "application/json"}'
    ),
    "an empty body": fp(b"", content_type=None),
    "an empty body of a JSON type": fp(b""),
    "a JSON null": fp(b"null"),
    "a JSON string": fp(b'"null"'),
    "JSON jsonb refuses": fp(b'{"note": NaN}'),
    "a digest-looking string": fp(json.dumps("raw-body-sha256:" + "0" * 64).encode()),
    "a path parameter": fp(b'{"note": 1}', {"id": 1}),
    "a path parameter as text": fp(b'{"note": 1}', {"id": "1"}),
    "another JSON media type": fp(b'{"note": 1}', content_type="application/merge-patch+json"),
    "a vendor JSON type": fp(b'{"note": 1}', content_type="application/vnd.shop.v1+json"),
    "its next version": fp(b'{"note": 1}', content_type="application/vnd.shop.v2+json"),
    "JSON with a parameter": fp(b'{"note": 1}', content_type="application/json; profile=v2"),
    "JSON in another charset": fp(b'{"note": 1}', content_type="application/json; charset=utf-16"),
    "two parameters": fp(b'{"note": 1}', content_type="text/plain; a=1; b=2"),
    "one parameter holding both": fp(b'{"note": 1}', content_type='text/plain; a="1; b=2"'),
}


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("application/json; charset=utf-8", "application/json"),
        ('application/vnd.shop.v1+json; charset="UTF-8"', "Application/Vnd.Shop.V1+JSON"),
        ("text/plain; charset=UTF-8", 'text/plain;charset="utf-8"'),
        ("text/csv; header=present; charset=utf-8", "text/csv; Charset=utf-8; HEADER=present"),
    ],
)
def test_one_media_type_written_two_ways_is_one_request(a: str, b: str) -> None:
    """Case, quoting, white space and the order of parameters are the writer's, not the request's;
    a JSON body is UTF-8 whatever it says (RFC 8259 §8.1), so ``charset=utf-8`` adds nothing."""
    assert fp(b'{"note": 1}', content_type=a) == fp(b'{"note": 1}', content_type=b)


@pytest.mark.parametrize(("a", "b"), list(itertools.combinations(DISTINCT, 2)))
def test_two_requests_the_handler_can_tell_apart_never_share_a_fingerprint(a: str, b: str) -> None:
    # jsonb makes key order and white space irrelevant: compare the JSON values, as the hash does
    def canonical(text: str | None) -> Any:
        return None if text is None else json.dumps(json.loads(text), sort_keys=True)

    assert canonical(DISTINCT[a]) != canonical(DISTINCT[b]), (DISTINCT[a], DISTINCT[b])


# -- a multipart body: parsed only on a route that takes uploads, and never past MAX_FORM_PARTS ----

BOUNDARY = "XyZ123boundary"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"
_EMPTY_PART = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name=""\r\n\r\n\r\n'.encode()


def _empty_parts(count: int) -> bytes:
    return _EMPTY_PART * count + f"--{BOUNDARY}--\r\n".encode()


class _CountingDecoder(MultipartDecoder):
    """Werkzeug's decoder, counting the parts it parsed (across instances)."""

    parts = 0

    def next_event(self) -> Any:
        event = super().next_event()
        if isinstance(event, Field | File):
            _CountingDecoder.parts += 1
        return event


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> type[_CountingDecoder]:
    _CountingDecoder.parts = 0
    monkeypatch.setattr(fingerprint, "MultipartDecoder", _CountingDecoder)
    return _CountingDecoder


def test_a_route_without_uploads_parses_no_part(counted: type[_CountingDecoder]) -> None:
    """Issue 39's F6: 17,543 empty parts (1 MB) cost 338 ms of a worker's CPU on a JSON route."""
    data = _empty_parts(17_543)
    wrapped = json.loads(fp(data, content_type=MULTIPART) or "null")
    assert counted.parts == 0
    assert wrapped["body_sha256"] and wrapped["type"] == MULTIPART, wrapped


def test_an_upload_route_parses_at_most_max_form_parts_then_refuses(counted: type[_CountingDecoder]) -> None:
    with pytest.raises(errors.RequestTooLargeError):
        request_json(_empty_parts(17_543), None, {}, method=None, content_type=MULTIPART, uploads=True, max_parts=1000)
    assert counted.parts <= 1001
    counted.parts = 0
    assert request_json(_empty_parts(1000), None, {}, method=None, content_type=MULTIPART, uploads=True, max_parts=1000)
    assert counted.parts == 1000, "MAX_FORM_PARTS parts are accepted, as Werkzeug's parser does"


def _cpu_seconds(data: bytes, content_type: str) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        fp(data, content_type=content_type)
        best = min(best, time.process_time() - started)
    return best


def test_a_multipart_body_costs_no_more_than_a_json_body_of_its_size() -> None:
    """Process CPU time, the best of three each, with a generous factor: not wall time."""
    parts = _empty_parts(17_543)
    document = json.dumps({"a": ["x" * 50] * (len(parts) // 56)}).encode()
    assert abs(len(document) - len(parts)) < len(parts) // 10
    multipart, json_body = _cpu_seconds(parts, MULTIPART), _cpu_seconds(document, JSON)
    assert multipart < 5 * json_body, f"multipart {multipart * 1000:.1f} ms, JSON {json_body * 1000:.1f} ms"
