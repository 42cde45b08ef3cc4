"""Build and load the C GAE sweep (`_gae_kernel.c`) on first use; pure-torch code is the fallback.

The kernel is plain C (no torch headers, no OpenMP), so it builds in about a second with the
system C compiler and is called through ctypes on CPU tensors. The shared object is cached under
`$VAPO_LIT_CACHE/kernels` (default `~/.cache/vapo-lit/kernels`), keyed by a hash of the source and
the compiler command, and written atomically, so concurrent processes never load a partial file.

`VAPO_LIT_GAE_BACKEND` selects the backend: `auto` (default: native where it builds, else torch),
`native` (error if it cannot build) or `torch`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

_SRC = Path(__file__).with_name("_gae_kernel.c")
_FLAGS = ["-O3", "-fPIC", "-shared", "-std=c11"]
_lib: ctypes.CDLL | None = None
_failure: str | None = None


def cache_root() -> Path:
    return Path(os.environ.get("VAPO_LIT_CACHE", Path.home() / ".cache" / "vapo-lit"))


def backend_choice() -> str:
    choice = os.environ.get("VAPO_LIT_GAE_BACKEND", "auto").strip().lower()
    if choice not in ("auto", "native", "torch"):
        raise ValueError(f"VAPO_LIT_GAE_BACKEND={choice!r} is not valid; use one of: auto, native, torch")
    return choice


def _build(target: Path, compiler: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run(
            [compiler, *_FLAGS, str(_SRC), "-o", tmp], capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} failed: {proc.stderr.strip()[:2000]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load() -> ctypes.CDLL | None:
    """The loaded kernel library, or None (with one warning) when it cannot be built here."""
    global _lib, _failure
    if _lib is not None or _failure is not None:
        return _lib
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    try:
        if compiler is None:
            raise RuntimeError("no C compiler found (set CC or install gcc)")
        key = hashlib.sha256(
            _SRC.read_bytes() + " ".join([compiler, *_FLAGS, platform.machine()]).encode()
        ).hexdigest()[:16]
        target = cache_root() / "kernels" / f"gae-{key}-{sys.platform}.so"
        if not target.exists():
            _build(target, compiler)
        lib = ctypes.CDLL(str(target))
        for name in ("vapo_gae_f32", "vapo_gae_f64"):
            fn = getattr(lib, name)
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p] * 9 + [ctypes.c_int64, ctypes.c_int64, ctypes.c_double]
        _lib = lib
    except Exception as e:  # noqa: BLE001 - any failure means: use the torch fallback
        _failure = f"{type(e).__name__}: {e}"
        if backend_choice() == "native":
            raise RuntimeError(f"VAPO_LIT_GAE_BACKEND=native but the kernel is unavailable: {_failure}")
        warnings.warn(f"native GAE kernel unavailable, using the pure-torch scan ({_failure})")
    return _lib


def failure() -> str | None:
    """Why the native kernel is unavailable (None when it loaded or was never tried)."""
    return _failure
