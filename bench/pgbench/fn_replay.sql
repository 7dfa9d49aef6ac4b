-- Replay path: claim a key that is already completed with the same body (outcome replay:
-- the stored response comes back and one audit_log row is written). Keys are preloaded by
-- bench/sql_path.py as md5('replay:' || i) for i in 1..:nreplay, user 1 + i % :users.
\set i random(1, :nreplay)
\set uid 1 + :i % :users
SELECT outcome, response_code, response_body FROM idem_claim(p_key => md5('replay:' || :i::text)::uuid::text, p_user_id => :uid, p_endpoint => 'POST /api/trading/orders', p_request => '{"symbol": "AAPL", "side": "buy", "qty": 10, "order_type": "market"}'::jsonb);
