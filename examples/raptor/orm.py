"""POST /api/trading/orm/orders: the paper order written the way a Flask-SQLAlchemy app writes it.

The same fill as trading.place_order (the account row locked, the order, the cash, the position,
the `paper_order_filled` audit row), market orders only, through `db.session` and models instead
of SQL. `Idem(app, sqlalchemy=db)` (create_app) puts `db.session` on the request's connection
inside the decorated route, so `db.session.commit()` commits with the key, as the SQL route's
writes do; the chaos soak drives both and checks their rows alike.
"""

from __future__ import annotations

from typing import Any

import psycopg
from flask import Flask, g, jsonify, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import BigInteger, Column, ForeignKey, Integer, MetaData, Table, Text, exc, insert
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from idem_shim import connection

from .auth import error
from .trading import MAX_QTY, _client_key, _positive_int, test_delay

RULE = "/api/trading/orm/orders"


class Base(DeclarativeBase):
    metadata = MetaData(schema="raptor")  # the models' tables are Raptor's


db = SQLAlchemy(model_class=Base)


class Account(db.Model):  # type: ignore[name-defined,misc]  # db.Model is made at run time
    __tablename__ = "accounts"
    user_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cash_cents: Mapped[int] = mapped_column(BigInteger)


class Instrument(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "instruments"
    symbol: Mapped[str] = mapped_column(primary_key=True)
    price_cents: Mapped[int] = mapped_column(BigInteger)


class Position(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "positions"
    user_id: Mapped[int] = mapped_column(Integer, ForeignKey("raptor.accounts.user_id"), primary_key=True)
    symbol: Mapped[str] = mapped_column(ForeignKey("raptor.instruments.symbol"), primary_key=True)
    qty: Mapped[int] = mapped_column(BigInteger)


class PaperOrder(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "paper_orders"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    user_id: Mapped[int] = mapped_column(Integer, ForeignKey("raptor.accounts.user_id"))
    symbol: Mapped[str] = mapped_column(ForeignKey("raptor.instruments.symbol"))
    side: Mapped[str]
    qty: Mapped[int] = mapped_column(BigInteger)
    order_type: Mapped[str]
    fill_price_cents: Mapped[int | None] = mapped_column(BigInteger)
    status: Mapped[str]
    client_key: Mapped[str | None]


#: The host's audit log as a table, not a model: the app's role may add rows but never read them,
#: and an ORM add (or a Core insert knowing the id column) would read the new row's id.
audit_log = Table(
    "audit_log",
    db.metadata,
    Column("user_id", Integer),
    Column("action", Text),
    Column("context", JSONB),
    schema="public",
)


def place_order_orm() -> Any:
    """Body: {"symbol": "AAPL", "side": "buy"|"sell", "qty": 10}; 201 filled; 400 malformed; 422
    unknown_symbol | insufficient_cash | insufficient_position (answers as the SQL route's)."""
    body = request.get_json(silent=True)
    if not isinstance(body, dict):
        return error(400, "invalid_request", detail="expected a JSON object")
    symbol, side, qty = body.get("symbol"), body.get("side"), _positive_int(body, "qty", MAX_QTY)
    if not isinstance(symbol, str) or not symbol or side not in ("buy", "sell") or qty is None:
        return error(400, "invalid_request", detail=f"symbol, side 'buy' or 'sell', qty in 1..{MAX_QTY}")
    if body.get("type", "market") != "market":
        return error(400, "invalid_request", detail="this route takes market orders only")
    symbol = symbol.upper()
    user_id = g.current_user_id

    test_delay(connection(), "before-writes")
    account = db.session.get(Account, user_id, with_for_update=True)  # serialises the user's fills
    if account is None:
        return error(404, "account_not_found")
    instrument = db.session.get(Instrument, symbol)
    if instrument is None:
        return error(422, "unknown_symbol", detail=f"no instrument {symbol!r}")
    position = db.session.get(Position, (user_id, symbol))
    held = position.qty if position else 0
    price = instrument.price_cents
    needed = qty * price
    if side == "buy" and needed > account.cash_cents:
        return error(422, "insufficient_cash", needed_cents=needed, available_cents=account.cash_cents)
    if side == "sell" and qty > held:
        return error(422, "insufficient_position", requested=qty, held=held)

    account.cash_cents += -needed if side == "buy" else needed
    if position is None:
        position = Position(user_id=user_id, symbol=symbol, qty=0)
        db.session.add(position)
    position.qty += qty if side == "buy" else -qty
    order = PaperOrder(
        user_id=user_id,
        symbol=symbol,
        side=side,
        qty=qty,
        order_type="market",
        fill_price_cents=price,
        status="filled",
        client_key=_client_key(),
    )
    db.session.add(order)
    db.session.flush()  # the order's id, for the audit row
    cash_delta = -needed if side == "buy" else needed
    context = {"order_id": order.id, "symbol": symbol, "side": side, "qty": qty}
    context |= {"fill_price_cents": price, "cash_delta_cents": cash_delta}
    db.session.execute(insert(audit_log).values(user_id=user_id, action="paper_order_filled", context=context))
    answer = {
        "order_id": order.id,
        "status": "filled",
        "symbol": symbol,
        "side": side,
        "qty": qty,
        "order_type": "market",
        "fill_price_cents": price,
        "notional_cents": needed,
        "cash_after_cents": account.cash_cents,
        "position_after": position.qty,
    }
    db.session.commit()  # a savepoint: the decorator's COMMIT carries it with the key
    test_delay(connection(), "after-writes")
    return jsonify(answer), 201


def init_app(app: Flask, database_url: str, unavailable: Any) -> None:
    """``db`` on the app (its own engine, for work outside decorated routes: Raptor has none),
    and SQLAlchemy's wrapper of a psycopg error that means the database is away answered as the
    SQL routes' is (``unavailable``: the 503 with Retry-After)."""
    # libpq reads the URL as the app's own connections do (a multi-host URL too)
    app.config.setdefault("SQLALCHEMY_DATABASE_URI", "postgresql+psycopg://")
    app.config.setdefault("SQLALCHEMY_ENGINE_OPTIONS", {"creator": lambda: psycopg.connect(database_url)})
    db.init_app(app)

    @app.errorhandler(exc.DBAPIError)
    def database_error(wrapped: exc.DBAPIError) -> Any:
        if isinstance(wrapped.orig, (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction)):
            return unavailable(wrapped.orig)
        raise wrapped
