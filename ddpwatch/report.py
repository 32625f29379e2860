"""Writes an incident folder atomically (a temp folder renamed into place) and loads it back; no torch here."""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from . import render, snapshot as S

REPORT_TXT = "report.txt"
REPORT_JSON = "report.json"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "run"


def _write_file(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def _fill(folder: str, incident: dict) -> None:
    for state in incident.get("ranks") or ():
        _write_file(os.path.join(folder, f"rank-{state['rank']}.json"), S.dumps(state) + "\n")
    _write_file(os.path.join(folder, REPORT_JSON), render.render_json(incident))
    _write_file(os.path.join(folder, REPORT_TXT), render.render_text(incident))


def _place(base: str, run_id: str, incident: dict) -> str:
    os.makedirs(base, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".incoming-", dir=base)
    try:
        for attempt in range(1, 1000):
            name = _safe(run_id) + ("" if attempt == 1 else f"-{attempt}")
            final = os.path.join(base, name)
            if os.path.exists(final):
                continue
            incident["report_dir"] = os.path.abspath(final)
            _fill(staging, incident)
            os.chmod(staging, 0o777 & ~_umask())
            try:
                os.rename(staging, final)  # atomic: readers see no folder or a whole one
            except OSError:
                if os.path.exists(final):
                    continue  # another writer took the name between our check and rename
                raise
            return final
        raise OSError(f"no free incident folder name under {base}")
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_incident(base: str, run_id: str, incident: dict) -> tuple:
    """(folder, note): the folder written; note says where it went instead when `base` was not writable."""
    try:
        return _place(base, run_id, incident), ""
    except OSError as exc:
        fallback = os.path.join(tempfile.gettempdir(), "ddpwatch-reports")
        folder = _place(fallback, run_id, incident)
        return folder, f"could not write under {base} ({exc}); wrote {folder} instead"


def load_incident(folder: str) -> dict:
    path = os.path.join(folder, REPORT_JSON) if os.path.isdir(folder) else folder
    with open(path, encoding="utf-8") as handle:
        return S.load_json_text(handle.read(), path)
