"""Secrets kept out of what a run prints and records: a database URL's password masked in URLs,
error texts and ``sys.argv`` (which W&B records), and in free text (the samples a run records,
`mask_secrets`) also the values of the environment variables that hold secrets. Below both the
loggers (vapo_lit/loggers.py) and the grid runner (vapo_lit/ablate/), so neither imports the other for it.
"""

from __future__ import annotations

import os
import re
import sys

SECRET_ENV = (
    "VAPO_LIT_STORAGE_PASSWORD",
    "WANDB_API_KEY",
    "PGPASSWORD",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
)
"""Environment variables whose values `mask_secrets` masks wherever they occur."""


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


def mask_secrets(text: str) -> str:
    """`text` with URL passwords masked (`mask_url`) and the value of every set SECRET_ENV variable
    (of 3 characters or more) replaced by ***: for text a run did not write itself (prompts, responses)."""
    text = mask_url(text)
    for name in SECRET_ENV:
        value = os.environ.get(name, "")
        if len(value) >= 3:
            text = text.replace(value, "***")
    return text
