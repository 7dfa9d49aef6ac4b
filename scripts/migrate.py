"""Kept for old habits: `python scripts/migrate.py ARGS` is `idem migrate ARGS` (idem_shim.migrate)."""
import sys

from idem_shim.cli import main

sys.exit(main(["migrate", *sys.argv[1:]]))
