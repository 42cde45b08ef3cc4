"""Secrets kept out of what a run prints and records: a database URL's password masked in URLs,
error texts and ``sys.argv`` (which W&B records). Below both the loggers (vapo_lit/logs.py) and
the grid runner (vapo_lit/ablate/), so neither imports the other for it.
"""
from __future__ import annotations

import re
import sys


def mask_url(url: str) -> str:
    """The URL with any password (user:PASSWORD@ and ?password=...) replaced by ***."""
    url = re.sub(r"(://[^/@:\s]*:)[^/@\s]*@", r"\1***@", str(url))
    return re.sub(r"(?i)([?&](?:password|passwd|pwd)=)[^&\s]*", r"\1***", url)


def mask_text(text, url: str | None) -> str:
    """`text` with the storage URL's password masked wherever it occurs (raw or URL-escaped)."""
    text = str(text)
    if url:
        text = text.replace(url, mask_url(url))
        m = re.search(r"://[^/@:]*:([^/@]+)@", url)
        secrets = {m.group(1)} if m and m.group(1) else set()
        try:
            import sqlalchemy

            raw = sqlalchemy.engine.make_url(url).password
            if raw:
                secrets.add(str(raw))
        except Exception:  # noqa: BLE001 - not a parsable URL: the regex above is all we have
            pass
        for s in sorted(secrets, key=len, reverse=True):
            if len(s) >= 3:  # a one- or two-character "password" would mask half the text
                text = text.replace(s, "***")
    return mask_url(text)


def scrub_argv(argv=None) -> None:
    """Mask URL passwords in `argv` (default ``sys.argv``) in place: W&B records ``sys.argv``."""
    argv = sys.argv if argv is None else argv
    argv[:] = [mask_url(a) for a in argv]
