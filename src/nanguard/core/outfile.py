"""Files nanguard writes for the user (the run log, the HTML report): checked before a run,
written atomically, with the permissions ``open()`` would give them.

Nothing here creates folders: a path into a folder that does not exist is a mistake to report
(``--json runs/x.json`` with no ``runs/``), not to paper over.
"""

from __future__ import annotations

import os
import tempfile

__all__ = ["check_writable", "write_atomic"]


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (``os.umask`` can
    only read it by setting it, for a moment, for every thread)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_writable(path: str) -> str | None:
    """Why ``path`` cannot be written, or ``None`` when it can: its folder exists, is a folder,
    and takes a new file (tried, so read-only file systems and permissions are caught too)."""
    if os.path.isdir(path):
        return f"{path} is a directory; give a file name (e.g. {os.path.join(path, 'run.json')})"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(folder):
        return f"the folder {folder} does not exist: create it first (mkdir -p {folder})"
    if not os.path.isdir(folder):
        return f"{folder} is a file, not a folder"
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"{path} exists and is read-only"
    if os.path.exists(path) and not os.path.isfile(path):
        return None  # a device or a pipe (/dev/stdout): written in place, nothing to probe
    try:
        fd, probe = tempfile.mkstemp(prefix=".nanguard-probe-", dir=folder)
    except OSError as exc:
        return f"cannot write in {folder}: {exc.strerror or exc}"
    os.close(fd)
    os.unlink(probe)
    return None


def write_atomic(path: str, text: str, suffix: str = "") -> None:
    """Write ``text`` to ``path`` through a temporary file renamed into place (readers never
    see half a file), mode ``0666 & ~umask`` as for any file the user writes (``mkstemp``
    alone would leave it 0600). A path that is not a regular file (``/dev/stdout``, a pipe) is
    written in place: renaming onto it would replace the device. Raises ``OSError`` (a missing
    folder, a full disk)."""
    if os.path.exists(path) and not os.path.isfile(path):
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
        return
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".nanguard-", suffix=suffix, dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
