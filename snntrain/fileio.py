"""Crash-safe file writing: write under a temporary name in the same folder, then rename.

Files and folders written this way get the permissions ``open()`` and ``mkdir`` would give them: the
user's umask applied to 0o666 (files) or 0o777 (folders), or, for a file that is replaced, the mode it
had. (``tempfile`` creates its files 0o600 and its folders 0o700, which a rename would otherwise keep,
leaving a shared run folder readable by its owner only.)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


def umask() -> int:
    """The process's umask, read without changing it where the system says it (Linux), else set and restored."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _give_mode(tmp: Path, path: Path, is_dir: bool) -> None:
    """``tmp`` (about to become ``path``) gets the mode ``path`` has, or else the umask's for a new one."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        mode = (0o777 if is_dir else 0o666) & ~umask()
    os.chmod(tmp, mode)


def _give_modes(tmp: Path, path: Path) -> None:
    """Every file under the folder ``tmp`` (about to become, or move into, ``path``) gets the mode its
    counterpart under ``path`` has, or the umask's (some writers create their files 0o600)."""
    for entry in tmp.rglob("*"):
        _give_mode(entry, path / entry.relative_to(tmp), is_dir=entry.is_dir())


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it becomes ``path``.

    A file replaces ``path`` in one rename. A folder (``is_dir``) becomes ``path`` in one rename when
    there is none yet; into an existing folder its files are renamed one by one, replacing the files of
    the same names and leaving every other file there as it was.

    If the body raises, the temporary file (or folder) is removed and ``path`` is left as it was, so a
    crash never leaves a half-written file under the final name.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_dir:
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(f"{path} exists and is not a folder")
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        _give_mode(tmp, path, is_dir=True)
    else:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        if not is_dir:
            _give_mode(tmp, path, is_dir=False)
            os.replace(tmp, path)
        elif not path.exists():
            _give_modes(tmp, path)
            tmp.rename(path)
        else:
            _give_modes(tmp, path)
            entries = sorted(tmp.iterdir())
            for entry in entries:
                if entry.is_dir() and (path / entry.name).exists():
                    raise IsADirectoryError(f"{path / entry.name} exists: a folder is not replaced")
            for entry in entries:
                os.replace(entry, path / entry.name)
            tmp.rmdir()
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
