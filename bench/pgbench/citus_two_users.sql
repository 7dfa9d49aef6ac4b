-- Citus part: the same request, but the handler also writes a row of user :b, whose shard is on
-- the other worker (bench_pair): the commit spans two nodes (two-phase commit on Citus).
\set seq :seq + 1
\set i random(1, :npairs)
SELECT a, b FROM bench_pair WHERE i = :i \gset
SELECT key_id FROM idem_claim(p_key => md5(:run::text || ':' || :client_id::text || ':' || :seq::text)::uuid::text, p_user_id => :a, p_endpoint => 'POST /api/trading/orders', p_request => '{"symbol": "AAPL", "qty": 10}'::jsonb) \gset
BEGIN;
INSERT INTO bench_orders (user_id, key_id, qty) VALUES (:a, :key_id, 1), (:b, :key_id::bigint * -1, 1);
SELECT idem_complete(p_key_id => :key_id, p_response_code => 201, p_response_body => '{"order_id": 123456, "status": "filled"}'::jsonb);
COMMIT;
