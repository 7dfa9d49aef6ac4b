-- Citus part, delegation: citus_one_user.sql with the completion delegated to the claim's
-- worker (idem_complete_in_scope, sql/citus/021: what the shim calls on a distributed store).
-- Run a second time with idem_claim delegated too (by p_user_id; measured only, not adopted:
-- docs/scaling.md says why), for users :off above bench_pair's, whose keys no claim on the
-- coordinator made (a delegated claim takes its key_id from the worker's own sequence, which
-- repeats the coordinator's: their keys would collide).
\set seq :seq + 1
\set i random(1, :npairs)
SELECT a + :off AS a, b FROM bench_pair WHERE i = :i \gset
SELECT key_id FROM idem_claim(p_key => md5(:run::text || ':' || :client_id::text || ':' || :seq::text)::uuid::text, p_user_id => :a, p_endpoint => 'POST /api/trading/orders', p_request => '{"symbol": "AAPL", "qty": 10}'::jsonb) \gset
BEGIN;
INSERT INTO bench_orders (user_id, key_id, qty) VALUES (:a, :key_id, 1), (:a, :key_id::bigint * -1, 1);
SELECT idem_complete_in_scope(p_scope => :a, p_key_id => :key_id, p_response_code => 201, p_response_body => '{"order_id": 123456, "status": "filled"}'::jsonb);
COMMIT;
