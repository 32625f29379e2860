"""Writes files and folders whole or not at all (a temp name, then one rename): the only place that renames; no torch.

Every write goes through a folder's descriptor and creates its temp entry with O_EXCL | O_NOFOLLOW
(private.write_new_file), so a link planted under a temp name is never written through; readers see the old
content or the new, never half of it.
"""

from __future__ import annotations

import os
import secrets

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


def write_file(dir_fd: int, name: str, data: bytes, mode: int = 0o666, temp: str | None = None) -> None:
    """Put `data` at `name` in the folder open at `dir_fd`, replacing what was there in one step.

    `mode` goes through the umask, as for any file the user's program creates. `temp`: the caller's own temp name
    (one per process and thread), removed first in case a crashed writer left it; else a random one. A failed write
    (full disk, a signal) raises and leaves no temp file behind."""
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


def write_path(path: str, data: bytes) -> None:
    """write_file for a path the user named (`-o FILE`): its folder is opened as it is, the file replaced whole."""
    folder, name = os.path.split(os.path.abspath(path))
    fd = private.open_folder(folder, create=False)
    try:
        write_file(fd, name, data)
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
                raise private.UnsafeFolder(f"{os.path.join(base, staging)} was replaced while the report was "
                                           "written; someone else can write that folder")
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


def replace_files(folder_fd: int, files: dict) -> None:
    """Replace files of the folder open at `folder_fd`: all written into a private staging folder first, then each
    moved over its old self in one step."""
    staging, staging_fd = private.make_private_dir(folder_fd, ".refresh-")
    try:
        write_new_files(staging_fd, files)
        for entry in os.listdir(staging_fd):
            os.replace(entry, entry, src_dir_fd=staging_fd, dst_dir_fd=folder_fd)
    finally:
        _remove_staging(folder_fd, staging, staging_fd)
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
