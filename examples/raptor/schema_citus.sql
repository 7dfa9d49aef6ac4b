-- Raptor on Citus (contract §8, docs/scaling.md): run on the coordinator after `idem migrate` (which
-- distributes public.users, public.audit_log and the store by user) and `raptor init-db` (which
-- creates the tables below as plain ones). Each business table is then distributed by its user,
-- colocated with public.users and the store, so an order's writes (its account, position, order
-- and audit rows) and idem_complete land on one shard of one worker and commit there without
-- two-phase commit. Run once, one statement at a time (psql -1 -f: Citus forwards a DDL
-- statement's text to the workers, so several in one query string reach them together);
-- tests/python/e2e/test_citus.py applies it.
--
-- Citus needs every primary key, unique index and foreign key between distributed tables to hold
-- the distribution column, so the keys that were id alone become (user_id, id): an id is still
-- unique (its identity), and every row of a user is found by (user_id, id).

-- One transaction (psql -1, or one execute): its DDL must reach each worker over one connection.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

-- Prices and sessions are read by every request and written rarely: reference tables (a copy on
-- every node). A reference table cannot reference a distributed one, so a session no longer
-- cascades from its account: deleting a user deletes the user's sessions first.
-- The foreign keys to instruments are dropped while it becomes a reference table (Citus would
-- otherwise convert every table that references it, accounts included, into a local one) and
-- added back at the end, from the distributed tables.
ALTER TABLE raptor.positions DROP CONSTRAINT positions_symbol_fkey;
ALTER TABLE raptor.paper_orders DROP CONSTRAINT paper_orders_symbol_fkey;
ALTER TABLE raptor.lcc_legs DROP CONSTRAINT lcc_legs_underlying_fkey;
SELECT create_reference_table('raptor.instruments');
ALTER TABLE raptor.sessions DROP CONSTRAINT sessions_user_id_fkey;
SELECT create_reference_table('raptor.sessions');

SELECT create_distributed_table('raptor.accounts', 'user_id', colocate_with => 'public.users');
SELECT create_distributed_table('raptor.positions', 'user_id', colocate_with => 'public.users');

ALTER TABLE raptor.paper_orders DROP CONSTRAINT paper_orders_pkey, ADD PRIMARY KEY (user_id, id);
SELECT create_distributed_table('raptor.paper_orders', 'user_id', colocate_with => 'public.users');

-- a leg is still rolled at most once, and only into a leg of its own user
ALTER TABLE raptor.lcc_legs DROP CONSTRAINT lcc_legs_rolled_from_fkey;
DROP INDEX raptor.lcc_legs_rolled_from_key;
ALTER TABLE raptor.lcc_legs DROP CONSTRAINT lcc_legs_pkey, ADD PRIMARY KEY (user_id, id);
CREATE UNIQUE INDEX lcc_legs_rolled_from_key ON raptor.lcc_legs (user_id, rolled_from)
    WHERE rolled_from IS NOT NULL;
ALTER TABLE raptor.lcc_legs ADD CONSTRAINT lcc_legs_rolled_from_fkey
    FOREIGN KEY (user_id, rolled_from) REFERENCES raptor.lcc_legs (user_id, id);
SELECT create_distributed_table('raptor.lcc_legs', 'user_id', colocate_with => 'public.users');

ALTER TABLE raptor.checkout_sessions DROP CONSTRAINT checkout_sessions_pkey, ADD PRIMARY KEY (user_id, id);
SELECT create_distributed_table('raptor.checkout_sessions', 'user_id', colocate_with => 'public.users');

-- client_order_id is the request's downstream_key("broker"), which holds the user's scope: unique
-- per user is unique
ALTER TABLE raptor.live_orders DROP CONSTRAINT live_orders_pkey, ADD PRIMARY KEY (user_id, id),
    DROP CONSTRAINT live_orders_client_order_id_key, ADD UNIQUE (user_id, client_order_id);
SELECT create_distributed_table('raptor.live_orders', 'user_id', colocate_with => 'public.users');

ALTER TABLE raptor.positions ADD CONSTRAINT positions_symbol_fkey
    FOREIGN KEY (symbol) REFERENCES raptor.instruments (symbol);
ALTER TABLE raptor.paper_orders ADD CONSTRAINT paper_orders_symbol_fkey
    FOREIGN KEY (symbol) REFERENCES raptor.instruments (symbol);
ALTER TABLE raptor.lcc_legs ADD CONSTRAINT lcc_legs_underlying_fkey
    FOREIGN KEY (underlying) REFERENCES raptor.instruments (symbol);
