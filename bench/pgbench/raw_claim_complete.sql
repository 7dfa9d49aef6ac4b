-- SQL path, raw: the INSERT ... ON CONFLICT DO NOTHING RETURNING and the UPDATE that idem_claim
-- and idem_complete run, issued directly on bench_raw_keys (a copy of idempotency_keys with the
-- same columns, indexes, constraints and foreign key). The request hash is computed the same
-- way, in SQL, so the two scripts do the same work except what the functions add.
\set seq :seq + 1
\set uid random(1, :users)
INSERT INTO bench_raw_keys AS k (idem_key, scope_user_id, scope_endpoint, request_hash, status, created_at, locked_at, expires_at) VALUES (md5(:run::text || ':' || :client_id::text || ':' || :seq::text)::uuid::text, :uid, 'POST /api/trading/orders', encode(sha256(convert_to('{"symbol": "AAPL", "side": "buy", "qty": 10, "order_type": "market"}'::jsonb::text, 'UTF8')), 'hex'), 'in_flight', now(), now(), now() + interval '24 hours') ON CONFLICT ON CONSTRAINT uq_bench_raw_key_user_endpoint DO NOTHING RETURNING k.id AS key_id \gset
UPDATE bench_raw_keys k SET status = 'completed', response_code = 201, response_body = '{"order_id": 123456, "status": "filled", "fill_price_cents": 18923, "cash_cents": 9810770}'::jsonb WHERE k.id = :key_id AND k.status = 'in_flight';
