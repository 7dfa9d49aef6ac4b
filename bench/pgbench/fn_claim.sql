-- Claim latency (scale and cleanup parts): one idem_claim on a fresh key, nothing else.
\set seq :seq + 1
\set uid random(1, :users)
SELECT key_id FROM idem_claim(p_key => md5(:run::text || ':' || :client_id::text || ':' || :seq::text)::uuid::text, p_user_id => :uid, p_endpoint => 'POST /api/trading/orders', p_request => '{"symbol": "AAPL", "side": "buy", "qty": 10, "order_type": "market"}'::jsonb);
