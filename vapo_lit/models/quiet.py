"""transformers' progress bars off for the duration of our own loads and saves.

transformers draws a "Loading weights" bar in every `from_pretrained` and a "Writing model shards"
bar in every `save_pretrained`; the built-in model cache and the exports do several per run, and
those bars would land between our own lines on the user's terminal. `quiet_transformers` turns
them off around our calls only (a decorator or a `with` block) and restores the user's setting.
"""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def quiet_transformers():
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
