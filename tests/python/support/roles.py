"""Which role a test's URL connects as: the names say it (``admin_url``, ``app_role_url``...)."""

from __future__ import annotations

from urllib.parse import quote


def as_app_role(url: str) -> str:
    """The same database seen as the least-privileged ``idem_app`` role.

    ``SET ROLE`` at start-up (the ``options`` parameter), so no password is needed: ``url`` must
    be a superuser's (an ``admin_url``).
    """
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}options={quote('-c role=idem_app')}"
