"""Whether a name holds a credential: the database's one rule (``idem_credential_name``), here.

The shim never stores or replays a header the database would refuse (IDM04 would turn every
answer of the route into a 500), so it reads header names by the same rule, word for word:
percent-encodings decoded, the name split into words (camelCase, ``_``, ``-``, ``.``), then the
same regular expression (sql/functions/009_idem_credential_name.sql; a test holds the two equal
over a table of names).
"""

from __future__ import annotations

import re
from typing import Final

_PERCENT: Final = re.compile(r"%([0-9A-Fa-f]{2})")
_CAMEL: Final = re.compile(r"([a-z0-9])([A-Z])")
_SEPARATORS: Final = re.compile(r"[^a-z0-9]+")
_COUNT: Final = "(max|total|prompt|completion|input|output|cached|reasoning|num)"
_RULE: Final = re.compile(
    r"(^|_)(password|passwd|pwd|passphrase|secret|apikey|authorization|cookie|bearer|credential|csrf|xsrf)s?(_?v?[0-9]+)?_?$"
    rf"|^(?!.*(^|_){_COUNT}_tokens?(_?v?[0-9]+)?_?$).*(^|_)tokens?(_?v?[0-9]+)?_?$"
    r"|^_?(x_)?(password|passwd|passphrase)s?([0-9]|_|$)"
    r"|(^|_)(api|private|access|secret|signing)_keys?([0-9]|_|$)"
    r"|^_?(x_)?session_?(id|key|token)s?_?$|^_?x_(auth|session)_?$"
    r"|^_?(www|proxy)_authenticate_?$|^_?(proxy_)?authentication_info_?$"
)


def credential_name(name: str) -> bool:
    """True if ``name`` names a credential (``accessToken``, ``X-Api-Key``, ``api_keys``,
    ``WWW-Authenticate``), False for ``token_count``, ``total_tokens`` or ``checkout_session_id``."""
    decoded = _PERCENT.sub(lambda m: "_" if m[1] == "00" else chr(int(m[1], 16)), name)
    words = _SEPARATORS.sub("_", _CAMEL.sub(r"\1_\2", decoded).lower())
    return _RULE.search(words) is not None
