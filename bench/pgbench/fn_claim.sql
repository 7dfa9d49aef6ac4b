-- Claim latency (scale and cleanup parts): one idem_claim on a fresh key, sent as the shim sends
-- it (python/idem_shim/queries.py CLAIM): a claimed key commits with synchronous_commit off, so
-- the claim never waits for a WAL flush (the handler's synchronous COMMIT after it flushes both).
\set seq :seq + 1
\set uid random(1, :users)
SELECT key_id, set_config('synchronous_commit', CASE WHEN outcome = 'replay' THEN current_setting('synchronous_commit') ELSE 'off' END, true) FROM idem_claim(p_key => md5(:run::text || ':' || :client_id::text || ':' || :seq::text)::uuid::text, p_user_id => :uid, p_endpoint => 'POST /api/trading/orders', p_request => '{"symbol": "AAPL", "side": "buy", "qty": 10, "order_type": "market"}'::jsonb);
