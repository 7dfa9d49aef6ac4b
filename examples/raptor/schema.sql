-- Raptor's business tables: the reference host app behind the idempotency layer.
-- Re-runnable (IF NOT EXISTS everywhere); applied by `raptor init-db` after the project's
-- own migrations, which create the host tables public.users and public.audit_log that this
-- file only references, never alters. Raptor's own per-user columns live in raptor.accounts.
CREATE SCHEMA IF NOT EXISTS raptor;

-- Deterministic prices: a paper order always fills at the instrument's listed price, so a
-- duplicate execution would be visible as a second identical fill, never hidden by a new price.
CREATE TABLE IF NOT EXISTS raptor.instruments (
    symbol       text   PRIMARY KEY,
    price_cents  bigint NOT NULL CHECK (price_cents > 0)
);
INSERT INTO raptor.instruments (symbol, price_cents) VALUES
    ('AAPL', 19012), ('MSFT', 41530), ('NVDA', 12877), ('SPY', 56021), ('TSLA', 24955)
ON CONFLICT (symbol) DO NOTHING;

-- One row per user: the cash balance and the paper/live gate. Every order locks this row
-- first, so all money and position changes of one user are serialised by it.
CREATE TABLE IF NOT EXISTS raptor.accounts (
    user_id       integer PRIMARY KEY REFERENCES public.users (id) ON DELETE CASCADE,
    trading_mode  text    NOT NULL DEFAULT 'paper' CHECK (trading_mode IN ('paper', 'live')),
    cash_cents    bigint  NOT NULL CHECK (cash_cents >= 0),
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Bearer tokens: only the SHA-256 of a token is stored.
CREATE TABLE IF NOT EXISTS raptor.sessions (
    token_sha256  text    PRIMARY KEY,
    user_id       integer NOT NULL REFERENCES raptor.accounts (user_id) ON DELETE CASCADE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS raptor.positions (
    user_id  integer NOT NULL REFERENCES raptor.accounts (user_id) ON DELETE CASCADE,
    symbol   text    NOT NULL REFERENCES raptor.instruments (symbol),
    qty      bigint  NOT NULL CHECK (qty >= 0),
    PRIMARY KEY (user_id, symbol)
);

CREATE TABLE IF NOT EXISTS raptor.paper_orders (
    id                 bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id            integer NOT NULL REFERENCES raptor.accounts (user_id) ON DELETE CASCADE,
    symbol             text    NOT NULL REFERENCES raptor.instruments (symbol),
    side               text    NOT NULL CHECK (side IN ('buy', 'sell')),
    qty                bigint  NOT NULL CHECK (qty > 0),
    order_type         text    NOT NULL CHECK (order_type IN ('market', 'limit')),
    limit_price_cents  bigint  CHECK (limit_price_cents > 0),
    fill_price_cents   bigint,
    status             text    NOT NULL CHECK (status IN ('filled', 'open', 'cancelled')),
    -- the Idempotency-Key the client sent, if any: for tracing only, never for dedup
    client_key         text,
    created_at         timestamptz NOT NULL DEFAULT now(),
    cancelled_at       timestamptz
);
CREATE INDEX IF NOT EXISTS paper_orders_user_idx ON raptor.paper_orders (user_id);
CREATE INDEX IF NOT EXISTS paper_orders_client_key_idx ON raptor.paper_orders (client_key)
    WHERE client_key IS NOT NULL;

-- LCC legs (the long leg of a covered-call position). A roll closes one and opens the next.
CREATE TABLE IF NOT EXISTS raptor.lcc_legs (
    id            bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id       integer NOT NULL REFERENCES raptor.accounts (user_id) ON DELETE CASCADE,
    underlying    text    NOT NULL REFERENCES raptor.instruments (symbol),
    expiry        date    NOT NULL,
    strike_cents  bigint  NOT NULL CHECK (strike_cents > 0),
    contracts     integer NOT NULL CHECK (contracts > 0),
    status        text    NOT NULL CHECK (status IN ('open', 'closed')),
    rolled_from   bigint  REFERENCES raptor.lcc_legs (id),
    client_key    text,
    opened_at     timestamptz NOT NULL DEFAULT now(),
    closed_at     timestamptz
);
CREATE INDEX IF NOT EXISTS lcc_legs_user_idx ON raptor.lcc_legs (user_id);
-- a leg is rolled at most once: the second roll of the same leg is refused by the database
CREATE UNIQUE INDEX IF NOT EXISTS lcc_legs_rolled_from_key ON raptor.lcc_legs (rolled_from)
    WHERE rolled_from IS NOT NULL;

CREATE TABLE IF NOT EXISTS raptor.checkout_sessions (
    id            text    PRIMARY KEY,
    user_id       integer NOT NULL REFERENCES raptor.accounts (user_id) ON DELETE CASCADE,
    plan          text    NOT NULL,
    amount_cents  bigint  NOT NULL CHECK (amount_cents > 0),
    status        text    NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'expired')),
    client_key    text,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS checkout_sessions_user_idx ON raptor.checkout_sessions (user_id);

-- Live orders: the broker's order as the app adopted it. client_order_id is the request's
-- downstream_key("broker"), which the broker dedupes on: one broker order, one row, whatever
-- number of executions (attempt) it took (contract §4a).
CREATE TABLE IF NOT EXISTS raptor.live_orders (
    id                bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id           integer NOT NULL REFERENCES raptor.accounts (user_id) ON DELETE CASCADE,
    client_order_id   text    NOT NULL UNIQUE,
    broker_order_id   text    NOT NULL,
    symbol            text    NOT NULL,
    side              text    NOT NULL CHECK (side IN ('buy', 'sell')),
    qty               bigint  NOT NULL CHECK (qty > 0),
    status            text    NOT NULL,
    filled_qty        bigint  NOT NULL,
    filled_avg_price  text,
    attempt           integer NOT NULL,
    adopted           boolean NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS live_orders_user_idx ON raptor.live_orders (user_id);

-- The app's login role (created by `raptor init-db`) gets exactly what its routes need: its
-- business tables, INSERT on the host's audit_log, and, through idem_app, EXECUTE on the
-- idem_* functions. It cannot read or write public.idempotency_keys.
GRANT USAGE ON SCHEMA raptor TO raptor_web;
GRANT SELECT ON raptor.instruments, raptor.sessions TO raptor_web;
GRANT SELECT, UPDATE (cash_cents) ON raptor.accounts TO raptor_web;
GRANT SELECT, INSERT, UPDATE ON raptor.positions, raptor.paper_orders, raptor.lcc_legs,
    raptor.checkout_sessions TO raptor_web;
GRANT SELECT, INSERT ON raptor.live_orders TO raptor_web;
GRANT INSERT ON public.audit_log TO raptor_web;
