"""`python -m examples.raptor …`: Raptor's CLI without building the app (see cli.py)."""

from .cli import raptor_cli

raptor_cli(prog_name="python -m examples.raptor")
