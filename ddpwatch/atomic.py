"""Writes files and folders whole or not at all (a temp name, then one rename): the only place that renames; no torch.

Every write goes through a folder's descriptor and creates its temp entry with O_EXCL | O_NOFOLLOW
(private.write_new_file), so a link planted under a temp name is never written through; readers see the old
content or the new, never half of it.

A rename replaces only a regular file (or takes a new name). Anything else at the name is written through, as any
Unix tool writes it: a device (`-o /dev/null`, `-o /dev/stdout`), a FIFO, or a symlink of this user or of root (the
link stays, its target gets the bytes). A symlink of another user (planted in a shared folder) is never followed.
"""

from __future__ import annotations

import os
import secrets
import stat

from . import private


def umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask(0) would race other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_file(
    dir_fd: int, name: str, data: bytes, mode: int = 0o666, temp: str | None = None, wait: bool = False
) -> None:
    """Put `data` at `name` in the folder open at `dir_fd`, replacing what was there in one step, or writing through
    what is there when it is no regular file (see the module's docstring; `wait`: a FIFO may make the open wait for
    its reader, as for any tool on the command line; otherwise nothing waits: no reader is an error).

    `mode` goes through the umask, as for any file the user's program creates. `temp`: the caller's own temp name
    (one per process and thread), removed first in case a crashed writer left it; else a random one. A failed write
    (full disk, a signal) raises and leaves no temp file behind."""
    if _written_through(dir_fd, name):
        _write_through(dir_fd, name, data, mode, wait)
        return
    if temp is None:
        temp = f".{name}.{secrets.token_hex(6)}.tmp"
    else:
        private.remove_quietly(dir_fd, temp)
    try:
        private.write_new_file(dir_fd, temp, data, mode)
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        private.remove_quietly(dir_fd, temp)
        raise


def _written_through(dir_fd: int, name: str) -> bool:
    """Whether `name` holds something a rename must not replace: a device, a FIFO, a socket, or a symlink of this
    user or root. Missing, a regular file, a folder (the rename fails, as it should), or someone else's link: no."""
    try:
        here = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(here.st_mode):
        return here.st_uid in (0, os.geteuid())
    return not (stat.S_ISREG(here.st_mode) or stat.S_ISDIR(here.st_mode))


def _write_through(dir_fd: int, name: str, data: bytes, mode: int, wait: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0) | (0 if wait else os.O_NONBLOCK)
    fd = os.open(name, flags, mode, dir_fd=dir_fd)
    try:
        if not wait:
            os.set_blocking(fd, True)  # O_NONBLOCK was for the open (a FIFO without a reader); the writes may wait
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def write_path(path: str, data: bytes) -> None:
    """write_file for a path the user named (`-o FILE`): its folder is opened as it is; a regular file is replaced
    whole, a device, FIFO or symlink written through (a FIFO waits for its reader, as with any tool)."""
    folder, name = os.path.split(os.path.abspath(path))
    fd = private.open_folder(folder, create=False)
    try:
        write_file(fd, name, data, wait=True)
    finally:
        os.close(fd)


def write_new_files(folder_fd: int, files: dict) -> None:
    """Create each name -> bytes of `files` in the folder open at `folder_fd` (new files only, no link followed)."""
    for name, data in files.items():
        private.write_new_file(folder_fd, name, data)


def place_folder(base_fd: int, base: str, names, fill) -> str:
    """Fill a private staging folder inside `base`, give it the umask's mode, rename it to the first free name.

    `names`: the candidate names, in order; `fill(staging_fd, final_path)` writes the files. Whoever can write
    `base` may swap the staging folder for a symlink at any moment: the files are written and the mode set through
    the descriptor of the folder we made, and the rename happens only while the name still is that folder."""
    staging, staging_fd = private.make_private_dir(base_fd, ".incoming-")
    try:
        for name in names:
            if _exists(base_fd, name):
                continue
            final = os.path.join(base, name)
            fill(staging_fd, final)
            os.fchmod(staging_fd, 0o777 & ~umask())
            if not private.same_entry(base_fd, staging, staging_fd):
                raise private.UnsafeFolder(
                    f"{os.path.join(base, staging)} was replaced while the report was "
                    "written; someone else can write that folder"
                )
            try:
                os.rename(staging, name, src_dir_fd=base_fd, dst_dir_fd=base_fd)  # readers see none or all of it
            except OSError:
                if _exists(base_fd, name):
                    _empty(staging_fd)
                    continue  # another writer took the name between our check and rename
                raise
            return final
        raise OSError(f"no free incident folder name under {base}")
    except BaseException:
        _remove_staging(base_fd, staging, staging_fd)
        raise
    finally:
        os.close(staging_fd)


def _exists(folder_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _empty(folder_fd: int) -> None:
    for name in os.listdir(folder_fd):
        private.remove_quietly(folder_fd, name)


def _remove_staging(base_fd: int, staging: str, staging_fd: int) -> None:
    """Remove what we wrote; the staging name is removed only while it still is our folder (not a swapped link)."""
    _empty(staging_fd)
    if private.same_entry(base_fd, staging, staging_fd):
        try:
            os.rmdir(staging, dir_fd=base_fd)
        except OSError:
            pass
