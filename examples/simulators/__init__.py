"""Stand-ins for the services Raptor calls past its database (contract §5): a broker (Alpaca's
order API, `broker.py`) and Stripe's checkout sessions (`stripe.py`). Each is its own process
with its own SQLite file, started by the app's tooling (`make demo`, tests/e2e, tests/chaos), so
a killed or frozen app worker cannot take the downstream state with it.
"""
