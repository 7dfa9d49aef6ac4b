-- Mismatch path: the same preloaded keys as fn_replay.sql, another body (outcome mismatch:
-- nothing is written).
\set i random(1, :nreplay)
\set uid 1 + :i % :users
SELECT outcome FROM idem_claim(p_key => md5('replay:' || :i::text)::uuid::text, p_user_id => :uid, p_endpoint => 'POST /api/trading/orders', p_request => '{"symbol": "AAPL", "side": "buy", "qty": 11, "order_type": "market"}'::jsonb);
