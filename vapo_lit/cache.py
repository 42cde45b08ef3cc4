"""Atomic, verified on-disk caches for built artefacts (models, tokenizers).

Layout: ``<root>/<name>-<key>/`` holding the artefact files plus ``manifest.json`` =
``{"config": ..., "files": {relpath: sha256}, "code_version": ...}``. A directory is written
into a temporary sibling and moved into place with :func:`os.replace`, so a reader never sees a
half-written cache. On load every listed file is hashed again; any mismatch, missing file or bad
manifest means "not cached" (the caller rebuilds with a warning). Only JSON and safetensors are
written; nothing is ever pickled. A temporary directory whose builder died (its name carries host
and pid) is removed by the next build on that host.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

from vapo_lit import faults

MANIFEST = "manifest.json"


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else ``$VAPO_LIT_CACHE``, else ``~/.cache/vapo-lit``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("VAPO_LIT_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "vapo-lit"


def config_key(config: Any) -> str:
    """Stable short hash of a JSON-serialisable config."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(directory: Path, config: Any) -> None:
    """Hash every file under `directory` (except the manifest) into ``manifest.json``."""
    directory = Path(directory)
    files = {}
    for p in sorted(directory.rglob("*")):
        if p.is_file() and p.name != MANIFEST:
            files[p.relative_to(directory).as_posix()] = sha256_file(p)
    if not any(name.endswith(".safetensors") for name in files):
        raise RuntimeError(f"no safetensors weights were written to {directory}")
    manifest = {"config": config, "files": files}
    with open(directory / MANIFEST, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True, default=str)


def verify_dir(directory: Path) -> str | None:
    """None when `directory` is a complete cache entry, else the reason it is not."""
    directory = Path(directory)
    mpath = directory / MANIFEST
    if not directory.is_dir():
        return "missing"
    if not mpath.is_file():
        return f"no {MANIFEST} in {directory}"
    try:
        with open(mpath) as f:
            manifest = json.load(f)
        files = manifest["files"]
        if not isinstance(files, dict) or not files:
            return f"{mpath}: empty file list"
    except Exception as e:  # noqa: BLE001 - any unreadable manifest means "rebuild"
        return f"{mpath}: unreadable manifest ({type(e).__name__}: {e})"
    for rel, digest in files.items():
        p = directory / rel
        if not p.is_file():
            return f"{p}: missing"
        if sha256_file(p) != digest:
            return f"{p}: sha256 mismatch (corrupted or partial)"
    return None


def cached_build(
    name: str,
    config: Any,
    build: Callable[[Path], None],
    *,
    cache_dir: str | os.PathLike | None = None,
    load: Callable[[Path], Any] | None = None,
) -> Path:
    """Return the directory of a verified cache entry for (`name`, `config`), building it if needed.

    `build(tmpdir)` must write the artefact files into `tmpdir`. A present but invalid entry
    (bad hash, no manifest, ...) is reported with ``warnings.warn`` and rebuilt. When `load` is
    given it is tried on the verified directory; if it raises, the entry is treated as corrupt.
    """
    root = cache_root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{name}-{config_key(config)}"
    if final.exists():
        reason = verify_dir(final)
        if reason is None and load is not None:
            try:
                load(final)
            except Exception as e:  # noqa: BLE001
                reason = f"failed to load ({type(e).__name__}: {e})"
        if reason is None:
            return final
        warnings.warn(
            f"vapo-lit cache entry {final} is invalid ({reason}); rebuilding it", RuntimeWarning, stacklevel=3
        )
    _remove_dead_builds(root, final.name)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-{_host()}-{os.getpid()}-", dir=root))
    try:
        build(tmp)
        write_manifest(tmp, config)
        faults.reach("cache_write")
        if final.exists():
            # Move the bad entry aside first: os.replace cannot replace a non-empty directory.
            trash = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=root))
            os.replace(final, trash / "entry")
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process won the race and placed a valid entry: keep theirs.
            if verify_dir(final) is not None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _host() -> str:
    return socket.gethostname().replace("-", "_")


def _remove_dead_builds(root: Path, name: str) -> None:
    """Remove `.NAME.tmp-HOST-PID-*` directories of this host whose process is gone (killed mid-build)."""
    for d in root.glob(f".{name}.tmp-{_host()}-*"):
        try:
            pid = int(d.name[len(f".{name}.tmp-{_host()}-") :].split("-", 1)[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError, OSError):
            continue  # not ours to judge (another user's live process, an odd name)
