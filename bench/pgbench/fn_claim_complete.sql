-- SQL path, functions: claim a fresh key, then complete it (two round trips, as the shim does).
-- Keys are md5(run:client:seq) as canonical UUID text, never reused; :run, :seq, :users come
-- from bench/run.py (-D). The raw twin is raw_claim_complete.sql: keep the two in step.
-- The completion passes the claim's token, as the shim does; :claim_token is a bound
-- parameter under -M prepared (bench/common.py's default), so it needs no quoting.
\set seq :seq + 1
\set uid random(1, :users)
SELECT key_id, claim_token FROM idem_claim(p_key => md5(:run::text || ':' || :client_id::text || ':' || :seq::text)::uuid::text, p_user_id => :uid, p_endpoint => 'POST /api/trading/orders', p_request => '{"symbol": "AAPL", "side": "buy", "qty": 10, "order_type": "market"}'::jsonb) \gset
SELECT idem_complete(p_key_id => :key_id, p_response_code => 201, p_response_body => '{"order_id": 123456, "status": "filled", "fill_price_cents": 18923, "cash_cents": 9810770}'::jsonb, p_claim_token => :claim_token);
