"""Private files and folders: what llamactor keeps on disk (the KV disk tier, the batch jobs'
journal and files, the disk tier's secret) holds tenants' prompts and token ids, so it is
created readable by this user alone: files 0600, folders 0700, whatever the umask says.

Every place that creates such a file or folder goes through here, so they all behave the same:

- ``private_dir``: made 0700 when missing; a folder that is llamactor's alone (the data dir, the
  cache dir) is tightened to 0700 when it exists looser (made by an older version), if this user
  owns it; a folder that is not llamactor's alone (the folder a CLI batch's journal sits beside)
  is never changed, only made private when llamactor makes it.
- ``open_private``: a file opened for writing, created 0600 (an existing one is set to 0600).
- ``touch_private``: a file made to exist with mode 0600 before another library opens it (SQLite
  gives its ``-wal`` and ``-shm`` files the database file's mode).
- ``read_or_create_secret``: a per-installation secret, created 0600 once, whole or absent;
  one not owned by this user, readable by others or of the wrong size is replaced.

Pure file-system calls, any thread.
"""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import IO, Any

from llamactor.base.logging import get_logger

log = get_logger("llamactor.private_files")

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: str | Path, tighten: bool = True) -> Path:
    """``path`` as a folder, made 0700 if missing (its missing parents too); ``tighten``: an
    existing one of this user's is set to 0700 (a folder that holds only llamactor's data)."""
    folder = Path(path)
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    for made in missing:  # mkdir's mode passes through the umask, and parents get the default: set it
        os.chmod(made, DIR_MODE)
    if tighten and not missing:
        st = folder.stat()
        if st.st_mode & 0o077 and st.st_uid == os.geteuid():
            os.chmod(folder, DIR_MODE)
            log.info("private_dir_tightened", dir=str(folder), was=oct(stat.S_IMODE(st.st_mode)))
    return folder


def open_private(path: str | Path, mode: str = "wb") -> IO[Any]:
    """``path`` opened for writing (``mode``: ``"wb"``, ``"w"``, ``"a+"`` ...), created 0600; an
    existing file is set to 0600 first (one an older version made 0644)."""
    flags = os.O_CREAT | (os.O_RDWR if "+" in mode else os.O_WRONLY)
    flags |= os.O_APPEND if "a" in mode else os.O_TRUNC if "w" in mode else 0
    fd = os.open(path, flags | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # the umask may have taken bits off, an old file may have more
        return os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8")
    except BaseException:
        os.close(fd)
        raise


def touch_private(path: str | Path) -> None:
    """Make ``path`` exist, 0600 (its content untouched)."""
    open_private(path, "ab").close()


def tighten_file(path: str | Path) -> None:
    """An existing file of this user's set to 0600 (a missing one is left missing)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if st.st_mode & 0o077 and st.st_uid == os.geteuid():
        os.chmod(path, FILE_MODE)


def read_or_create_secret(path: str | Path, nbytes: int = 32) -> bytes:
    """The secret in ``path``: created (random, 0600, written whole under another name and then
    linked into place, so a second process never reads half of it) when missing; replaced when
    it cannot be trusted (not a regular file of this user's, readable by others, of another size)."""
    path = Path(path)
    for _ in range(3):  # another process may replace a bad secret at the same moment: read again
        try:
            return _read_secret(path, nbytes)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as e:
            log.warning("secret_replaced", file=str(path), reason=str(e))
            path.unlink(missing_ok=True)
        _create_secret(path, nbytes)
    try:
        return _read_secret(path, nbytes)
    except ValueError as e:  # a file system without Unix modes or owners: no private secret can be kept there
        raise PermissionError(f"cannot keep a private secret in {path}: {e}") from None


def _read_secret(path: Path, nbytes: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # a planted symlink is refused (ELOOP)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ValueError("not a regular file of this user's")
        if st.st_mode & 0o077:
            raise ValueError(f"readable by others (mode {oct(stat.S_IMODE(st.st_mode))})")
        data = os.read(fd, nbytes + 1)
    finally:
        os.close(fd)
    if len(data) != nbytes:
        raise ValueError(f"{len(data)} bytes, not {nbytes}")
    return data


def _create_secret(path: Path, nbytes: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(nbytes))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)  # atomic, and never over an existing secret: the first one made wins
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
