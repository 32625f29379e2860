"""This user's private folders under the shared temp dir, opened by file descriptor, never through a symlink; no torch.

Other local users share the temp dir. One of them can create `<tmp>/ddpwatch-<uid>` before us, make it a symlink,
or swap a folder for a symlink between two path-based calls. So every level below the temp dir is opened with
O_NOFOLLOW, checked to be a folder of this user that nobody else can write (made 0700 if it is merely readable),
and the caller works through the returned descriptor (dir_fd=...), never through the path again.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import tempfile

_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_ADVICE = "remove it, or point TMPDIR to a folder of your own"


class UnsafeFolder(OSError):
    """A folder ddpwatch refuses to use; the message says which and why, in one line."""


def root_path() -> str:
    """`<tmp>/ddpwatch-<uid>`: the parent of everything ddpwatch keeps in the temp dir."""
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"ddpwatch-{uid}")


def check_owner(fd: int, shown: str) -> os.stat_result:
    """The folder open at `fd` must be a folder of this user (another user's may hold anything, or be read by them)."""
    info = os.fstat(fd)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolder(f"{shown} is not a folder; {_ADVICE}")
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise UnsafeFolder(
            f"{shown} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); "
            f"ddpwatch will not use it: {_ADVICE}"
        )
    return info


def check_own(fd: int, shown: str) -> os.stat_result:
    """The folder open at `fd` must be this user's and writable by nobody else; a readable one is made 0700."""
    info = check_owner(fd, shown)
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeFolder(
            f"{shown} is writable by others (mode {stat.S_IMODE(info.st_mode):04o}); "
            f"ddpwatch will not use it: {_ADVICE}"
        )
    if info.st_mode & 0o077:
        os.fchmod(fd, 0o700)  # ours, only readable by others (older ddpwatch versions left 0755): private now
    return info


def open_child(parent_fd: int, name: str, shown: str, create: bool = True, private: bool = True) -> int:
    """Open (and first create) folder `name` inside `parent_fd` without following a symlink, and check it.

    private: created 0700, and must be this user's and writable by nobody else (check_own). Otherwise (a folder of
    reports, for the user's team to read): created with the umask's mode, and must merely be this user's."""
    if create:
        try:
            os.mkdir(name, 0o700 if private else 0o777, dir_fd=parent_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, _DIR_FLAGS | NOFOLLOW, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise UnsafeFolder(f"{shown} is {_what_is(parent_fd, name)}, not a folder; {_ADVICE}") from None
        raise
    try:
        (check_own if private else check_owner)(fd, shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _what_is(parent_fd: int, name: str) -> str:
    try:
        mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
    except OSError:
        return "unreadable"
    return "a symlink (ddpwatch never follows one there)" if stat.S_ISLNK(mode) else "a file"


def open_private(*parts: str, create: bool = True) -> int:
    """A descriptor of `<tmp>/ddpwatch-<uid>/<parts...>`, every level created 0700 if missing and checked."""
    base = tempfile.gettempdir()
    fd = os.open(base, _DIR_FLAGS)  # the temp dir itself is the system's (or TMPDIR, the user's own choice)
    shown = base
    try:
        for name in (os.path.basename(root_path()),) + parts:
            shown = os.path.join(shown, name)
            child = open_child(fd, name, shown, create)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def private_path(*parts: str) -> str:
    """`<tmp>/ddpwatch-<uid>/<parts...>`, created and checked (for a child process that needs a path)."""
    os.close(open_private(*parts))
    return os.path.join(root_path(), *parts)


def open_folder(path: str, create: bool = True) -> int:
    """A descriptor of a folder the user chose (DDPWATCH_DIR): made if missing, opened as it is (a symlink there is
    the user's own choice); what ddpwatch then creates inside it goes through the descriptor."""
    if create:
        os.makedirs(path, exist_ok=True)
    return os.open(path, _DIR_FLAGS)


def open_subfolder(path: str) -> int:
    """A descriptor of `path`, a folder ddpwatch names inside the user's chosen folder (`<DDPWATCH_DIR>/local-...`):
    the chosen folder is opened as open_folder does, but in a shared, world-writable one anyone can plant that name
    first, as a symlink to a folder of theirs or a victim's: it is opened without following a link, and must be
    this user's (UnsafeFolder if not)."""
    parent, name = os.path.split(os.path.abspath(path))
    parent_fd = open_folder(parent)
    try:
        return open_child(parent_fd, name, path, private=False)
    finally:
        os.close(parent_fd)


def make_private_dir(parent_fd: int, prefix: str) -> tuple:
    """(name, fd) of a new folder `prefix<random>` inside `parent_fd`, mode 0700, opened without following links.

    What tempfile.mkdtemp does, but relative to a descriptor, and the result is checked to be the folder we made
    (someone who can write the parent may have swapped it between the mkdir and the open)."""
    for _ in range(100):
        name = prefix + secrets.token_hex(6)
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            continue
        return name, open_child(parent_fd, name, name, create=False)
    raise FileExistsError(errno.EEXIST, f"no free name for a {prefix}* folder")


def same_entry(parent_fd: int, name: str, fd: int) -> bool:
    """Whether `name` in `parent_fd` is still the very file or folder open at `fd` (not swapped for another)."""
    try:
        here = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return False
    there = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def write_new_file(dir_fd: int, name: str, data: bytes, mode: int = 0o666) -> None:
    """Create `name` in `dir_fd` (never an existing file, never through a link), write it whole, fsync it.

    `mode` is given to the kernel, which applies the umask, as for any file the user's program creates."""
    fd = os.open(
        name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | getattr(os, "O_CLOEXEC", 0), mode, dir_fd=dir_fd
    )
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass
