"""report.html: one self-contained page; the timeline tells the seed's story (structure checked without a browser)."""

import html
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import barrier, done, incident, main_stack, rank_state, seed_states, states  # noqa: E402

from ddpwatch import analysis  # noqa: E402
from ddpwatch.html_report import render_html  # noqa: E402


def seed_incident(world_size=2):
    st = seed_states(world_size)
    for state in st.values():
        state["recent"] = [done(9, "all_reduce", age=30.0), done(10, "barrier", age=29.0)]
    return incident(st, analysis.analyze(st, world_size, 2.0, 300.0))


def lanes(page, view="sequence-view"):
    svg = re.search(r'<svg id="%s".*?</svg>' % view, page, re.S).group(0)
    return re.findall(r'<g class="lane" data-ranks="([^"]+)"', svg)


def boxes(page, cls):
    return re.findall(r'<g class="op [^"]*\b%s\b[^"]*"[^>]*data-rank="(\d+)"' % cls, page)


def embedded(page):
    data = re.search(r'<script type="application/json" id="incident-data">(.*?)</script>', page, re.S).group(1)
    return json.loads(data)


def test_seed_page_has_one_lane_per_rank_and_the_divergence_highlighted():
    page = render_html(seed_incident(3))
    assert lanes(page) == ["rank 0", "rank 1", "rank 2"]
    assert page.count('id="divergence"') == 1
    assert "first diverging position: group 0 seq 11" in page
    assert boxes(page, "culprit") == ["0", "0"]  # sequence view and time view
    assert sorted(boxes(page, "waiting")) == ["1", "1", "2", "2"]
    assert re.search(r'class="op in_flight mismatch culprit ddp"[^>]*><title>rank 0 - group 0 seq 11: broadcast of '
                     r"module buffers inside DistributedDataParallel.forward called at val.py:42", page)


def test_the_verdict_comes_first_then_the_timeline_then_the_stacks():
    page = render_html(seed_incident())
    order = [page.index(marker) for marker in ('id="verdict"', 'id="timeline"', 'id="positions"', 'id="stacks"')]
    assert order == sorted(order)
    verdict = page[order[0]:order[1]]
    assert "ddp_forward_on_subset" in verdict and "rank 0" in verdict and "model.module(x)" in verdict
    assert "<title>ddpwatch: ddp_forward_on_subset, rank 0 at val.py:42</title>" in page
    assert "/u/val.py:42 in validate" in page[order[3]:]


def test_self_contained_no_network():
    page = render_html(seed_incident())
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "http" not in page.lower()
    assert "<link" not in page and "@import" not in page and "<iframe" not in page
    assert not re.search(r"<script[^>]*\bsrc=", page)


def test_the_incident_json_is_embedded_whole():
    doc = seed_incident()
    assert embedded(render_html(doc)) == json.loads(json.dumps(doc))


def test_hostile_text_is_escaped_everywhere():
    evil = "</script><script>alert(1)</script><b onmouseover=x>"
    st = seed_states(2)
    st[0]["stacks"] = [main_stack(("train.py", 1, "main"), (f"/u/{evil}.py", 2, evil))]
    st[0]["inflight"][0]["region"]["site"]["function"] = evil
    doc = incident(st, analysis.analyze(st, 2, 2.0, 300.0))
    page = render_html(doc)
    assert page.count("<script") == 2 and "<b onmouseover" not in page
    assert embedded(page)["ranks"][0]["stacks"][0]["frames"][1]["function"] == evil
    assert html.escape(evil) in page


def test_at_scale_ranks_that_look_alike_share_a_lane():
    page = render_html(seed_incident(1024))
    assert lanes(page) == ["rank 0", "ranks 1-1023"]
    assert page.count('id="divergence"') == 1


def test_a_straggler_shows_the_busy_rank_as_the_culprit_and_no_divergence():
    st = states(rank_state(0, 2, inflight=[], idle=400.0, user_line=("val.py", 40, "validate")),
                rank_state(1, 2, inflight=[barrier(age=301.0)], idle=301.0))
    doc = incident(st, analysis.analyze(st, 2, 2.0, 300.0), trigger="timeout")
    page = render_html(doc)
    assert 'id="divergence"' not in page
    assert re.search(r'<g class="op busy culprit" data-rank="0"><title>rank 0: busy outside collectives at '
                     r"val.py:40", page)


def test_no_findings_and_no_records_still_render():
    st = states(rank_state(0, 1, inflight=[], stacks=[]))
    page = render_html(incident(st, [], trigger="dump"))
    assert "No hang proven (dump)" in page and lanes(page) == ["rank 0"]


def test_many_positions_keep_the_divergence_in_view():
    st = seed_states(2)
    for state in st.values():
        state["recent"] = [done(seq, "all_reduce", site=("train.py", 70, "train")) for seq in range(1, 11)] + \
            [done(seq, "all_reduce") for seq in range(12, 100)]  # more positions than the view shows
        for index, record in enumerate(state["recent"]):
            record["start"] = 1_600_000_000.0 + index
    st[0]["inflight"][0]["start"] = st[1]["inflight"][0]["start"] = 1_500_000_000.0  # oldest: would be cut
    page = render_html(incident(st, analysis.analyze(st, 2, 2.0, 300.0)))
    assert 'id="divergence"' in page and "older positions not shown" in page


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(BROWSER is None, reason="no `chromium` on PATH (Debian package `chromium`): the page's script "
                                            "is checked in a real headless browser only where one is installed")
@pytest.mark.timeout(90)
def test_page_script_runs_in_a_headless_browser(tmp_path):
    path = tmp_path / "report.html"
    path.write_text(render_html(seed_incident(3)), encoding="utf-8")
    done_run = subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                               path.as_uri()], capture_output=True, text=True, timeout=60)
    dom = done_run.stdout
    assert 'data-ready="1"' in dom, done_run.stderr[-2000:]  # the script ran to its end without an error
    # It opened the culprit's details on load: its call site and the rank's stack.
    details = re.search(r'<div id="details"[^>]*>(.*?)</div>', dom, re.S).group(1)
    assert "rank 0: broadcast [_broadcast_coalesced] group 0 seq 11, in_flight" in details
    assert "main-thread stack of rank 0" in details
    # The rendered DOM, as the browser built it: one lane per rank and the divergence highlighted.
    assert lanes(dom) == ["rank 0", "rank 1", "rank 2"]
    assert dom.count('id="divergence"') == 1
    shot = tmp_path / "report.png"
    subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1200,900", f"--screenshot={shot}", path.as_uri()],
                   capture_output=True, text=True, timeout=60)
    assert shot.exists() and shot.stat().st_size > 10_000  # a picture, saved under the test's temp dir


NODE = shutil.which("node") or shutil.which("nodejs")

# A few lines of DOM, enough for the page's script: elements found by id or by class, click handlers, classList.
FAKE_DOM = r"""
const fs = require('fs');
const page = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
function el(attrs) {
  const classes = new Set((attrs['class'] || '').split(/\s+/).filter(Boolean));
  const handlers = {};
  return {attrs, handlers, style: {}, hidden: false, textContent: attrs.text || '', parentNode: {hidden: true},
    classList: {add: c => classes.add(c), remove: c => classes.delete(c), contains: c => classes.has(c)},
    has: c => classes.has(c), getAttribute: n => (n in attrs ? attrs[n] : null),
    setAttribute: (n, v) => { attrs[n] = v; }, addEventListener: (t, f) => { handlers[t] = f; }};
}
const ops = page.ops.map(el), buttons = page.buttons.map(el);
const byId = {'incident-data': el({text: page.data}), 'details': el({}), 'sequence-view': el({}), 'time-view': el({})};
function select(sel) {
  if (sel === '.op') return ops;
  if (sel === '.op.sel') return ops.filter(o => o.has('sel'));
  if (sel === 'button[data-view]') return buttons;
  const want = sel.split('.').filter(Boolean);
  return ops.filter(o => want.every(c => o.has(c)));
}
global.document = {getElementById: id => byId[id], querySelectorAll: select,
                   querySelector: sel => select(sel)[0] || null, body: el({})};
eval(page.script);
const out = {ready: document.body.getAttribute('data-ready'), onload: byId['details'].textContent};
const waiting = ops.find(o => o.has('waiting'));
waiting.handlers.click();
out.clicked = byId['details'].textContent;
buttons[1].handlers.click();
out.timeShown = !byId['time-view'].parentNode.hidden && byId['sequence-view'].style.display === 'none';
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(NODE is None, reason="no `node` on PATH: the page's script is run against a fake DOM only there")
def test_page_script_shows_details_and_switches_views(tmp_path):
    page = render_html(seed_incident(3))
    ops = [dict(re.findall(r'([\w-]+)="([^"]*)"', attrs)) for attrs in re.findall(r'<g (class="op [^>]*)>', page)]
    buttons = [{"data-view": view} for view in re.findall(r'<button type="button" data-view="([^"]+)"', page)]
    script = re.findall(r"<script>(.*?)</script>", page, re.S)[-1]
    data = re.search(r'id="incident-data">(.*?)</script>', page, re.S).group(1)
    (tmp_path / "page.json").write_text(json.dumps({"ops": ops, "buttons": buttons, "script": script, "data": data}))
    (tmp_path / "dom.js").write_text(FAKE_DOM)
    run = subprocess.run([NODE, str(tmp_path / "dom.js"), str(tmp_path / "page.json")], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["ready"] == "1"
    assert result["onload"].startswith("rank 0: broadcast [_broadcast_coalesced] group 0 seq 11, in_flight for 3.0 s")
    assert "inside ddp_forward called at /u/val.py:42 in validate()" in result["onload"]
    assert "main-thread stack of rank 0 (most recent call last):\n  > /u/train.py:120 in main" in result["onload"]
    assert result["clicked"].startswith("rank 1: barrier [barrier] group 0 seq 11, in_flight")
    assert "call site: /u/train.py:88 in train()" in result["clicked"]
    assert result["timeShown"] is True
