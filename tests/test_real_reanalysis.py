"""A real incident reanalysed on "another machine": the user's sources gone, its report is the live one, to the byte."""

import os
import shutil

import pytest

from ranks import SCENARIOS, describe, reports, run_case

from ddpwatch import cli
from ddpwatch.static import rankcond

pytestmark = pytest.mark.timeout(150)


def _report(argv, capsys) -> str:
    assert cli.main(["report", *argv]) == 0
    return capsys.readouterr().out


def test_a_straggler_under_a_rank_condition_reanalysed_without_its_sources_is_worded_as_live(tmp_path, capsys):
    """Rank 0 sleeps past the timeout under `if rank == 0:` while rank 1 waits at a barrier. Rank 0 waits in no
    collective, so only its stack says which condition it stands under: the incident keeps what was read from the
    sources then, and `ddpwatch report --reanalyze` of a copy, the sources deleted, gives the live report."""
    job = tmp_path / "job"
    job.mkdir()
    script = job / "train.py"
    shutil.copyfile(os.path.join(SCENARIOS, "hangs.py"), script)
    results = run_case(
        [str(script), "busy:40"], 2, tmp_path / "reports", timeout=90, DDPWATCH_TIMEOUT=4, DDPWATCH_ACTION="abort"
    )
    found = reports(tmp_path / "reports")
    assert len(found) == 1, describe(results)
    folder = os.path.dirname(found[0])
    live_text = open(os.path.join(folder, "report.txt"), encoding="utf-8").read()
    assert "under the rank condition `if rank == 0:`" in " ".join(live_text.split()), live_text  # text is wrapped
    elsewhere = tmp_path / "another-machine" / "incident"
    shutil.copytree(folder, elsewhere)
    shutil.rmtree(job)
    shutil.rmtree(folder)
    rankcond.clear_cache()
    assert _report([str(elsewhere), "--reanalyze"], capsys) == _report([str(elsewhere)], capsys) == live_text
    saved_json = _report([str(elsewhere), "--format", "json"], capsys)
    assert _report([str(elsewhere), "--reanalyze", "--format", "json"], capsys) == saved_json
