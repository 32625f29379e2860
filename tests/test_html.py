"""report.html: one self-contained page; the timeline tells the seed's story (structure checked without a browser)."""

import html
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from factory import (
    DDP_FILE,
    TORCH_FILE,
    barrier,
    done,
    incident,
    main_stack,
    rank_state,
    seed_states,  # noqa: E402
    states,
    wrapped_stack,
)

from ddpwatch import analysis  # noqa: E402
from ddpwatch.render.html import render_html  # noqa: E402


def seed_incident(world_size=2):
    st = seed_states(world_size)
    for state in st.values():
        state["recent"] = [done(9, "all_reduce", age=30.0), done(10, "barrier", age=29.0)]
    return incident(st, analysis.assess(st, world_size, 2.0, 300.0).findings)


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
    assert re.search(
        r'class="op in_flight mismatch culprit ddp"[^>]*><title>rank 0 - group 0 seq 11: broadcast of '
        r"module buffers inside DistributedDataParallel.forward called at val.py:42",
        page,
    )


def wrapped_incident():
    """The seed incident with ddpwatch's own frames in rank 0's main stack."""
    st = seed_states(2)
    st[0]["stacks"] = [wrapped_stack()]
    return incident(st, analysis.assess(st, 2, 2.0, 300.0).findings)


FOLDED_RANK0 = [
    "/u/train.py:120 in main",
    "/u/val.py:42 in validate",
    "... 3 ddpwatch frames",
    f"{DDP_FILE}:1600 in forward",
    f"{TORCH_FILE}:2400 in _broadcast_coalesced",
    "... 3 ddpwatch frames",
]


def test_ddpwatch_own_frames_fold_into_one_line_in_the_stacks_section():
    page = render_html(wrapped_incident())
    rank0 = re.search(
        r'<section id="stacks">.*?<summary>rank 0</summary><ol class="frames">(.*?)</ol>', page, re.S
    ).group(1)
    assert [html.unescape(item) for item in re.findall(r"<li[^>]*>(.*?)</li>", rank0)] == FOLDED_RANK0
    assert rank0.count('<li class="internal own">') == 2
    assert embedded(page)["ranks"][0]["stacks"] == [wrapped_stack()]  # the embedded data keeps every frame


def test_the_verdict_comes_first_then_the_timeline_then_the_stacks():
    page = render_html(seed_incident())
    order = [page.index(marker) for marker in ('id="verdict"', 'id="timeline"', 'id="positions"', 'id="stacks"')]
    assert order == sorted(order)
    verdict = page[order[0] : order[1]]
    assert "ddp_forward_on_subset" in verdict and "rank 0" in verdict and "model.module(x)" in verdict
    assert "<title>ddpwatch: ddp_forward_on_subset, rank 0 at val.py:42</title>" in page
    assert "/u/val.py:42 in validate" in page[order[3] :]


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
    doc = incident(st, analysis.assess(st, 2, 2.0, 300.0).findings)
    page = render_html(doc)
    assert page.count("<script") == 2 and "<b onmouseover" not in page
    assert embedded(page)["ranks"][0]["stacks"][0]["frames"][1]["function"] == evil
    assert html.escape(evil) in page


HOSTILE = [
    '"><script>document.body.setAttribute("data-pwned","1")</script>',
    "' onmouseover='document.body.setAttribute(\"data-pwned\",\"1\")' x='",
    "</style><img src=x onerror=\"document.body.setAttribute('data-pwned','1')\">",
    "</script><b onmouseover=x>",
    "]]><svg onload=alert(4)>",
    "<!--",
    "&amp;&lt;",
]
# The elements ddpwatch's page is made of: anything else in a parsed page came from the data.
PAGE_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "header",
    "h1",
    "h2",
    "p",
    "b",
    "section",
    "div",
    "span",
    "button",
    "svg",
    "g",
    "rect",
    "text",
    "line",
    "ul",
    "li",
    "table",
    "tr",
    "th",
    "td",
    "details",
    "summary",
    "ol",
    "script",
}


def straggler_incident():
    st = states(
        rank_state(0, 2, inflight=[], idle=400.0, user_line=("val.py", 40, "validate")),
        rank_state(1, 2, inflight=[barrier(age=301.0)], idle=301.0),
    )
    return incident(st, analysis.assess(st, 2, 2.0, 300.0).findings, trigger="timeout")


def poisoned(value, counter=None, ranks_too=False):
    """Every string in the document (values and the names of groups) with a hostile string appended; with
    ranks_too, every rank number (states, findings, rows, missing ranks) replaced by one."""
    counter = counter if counter is not None else [0]

    def evil():
        counter[0] += 1
        return HOSTILE[counter[0] % len(HOSTILE)]

    if isinstance(value, str):
        return value + evil()
    if isinstance(value, list):
        return [poisoned(v, counter, ranks_too) for v in value]
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in ("last_seq", "groups", "site_counts") and isinstance(item, dict):
                out[key] = {k + evil(): poisoned(v, counter, ranks_too) for k, v in item.items()}
            elif ranks_too and key in ("rank", "written_by", "peer") and isinstance(item, int):
                out[key] = str(item) + evil()
            elif ranks_too and key in ("ranks", "missing_ranks") and all(isinstance(r, int) for r in item):
                out[key] = [str(r) + evil() for r in item]
            else:
                out[key] = poisoned(item, counter, ranks_too)
        return out
    return value


class PageParser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.scripts = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, attrs))
        if tag == "script":
            self.scripts.append(dict(attrs))

    handle_startendtag = handle_starttag


def assert_no_markup_comes_through(page):
    parser = PageParser()
    parser.feed(page)
    parser.close()
    assert {tag for tag, _ in parser.tags} <= PAGE_TAGS, {tag for tag, _ in parser.tags} - PAGE_TAGS
    assert parser.scripts == [{"type": "application/json", "id": "incident-data"}, {}]
    handlers = [(tag, name) for tag, attrs in parser.tags for name, _ in attrs if name.lower().startswith("on")]
    assert handlers == []
    names = {name for _, attrs in parser.tags for name, _ in attrs}
    assert names <= {
        "lang",
        "charset",
        "name",
        "content",
        "id",
        "class",
        "width",
        "height",
        "viewbox",
        "role",
        "aria-label",
        "x",
        "y",
        "rx",
        "x1",
        "x2",
        "y1",
        "y2",
        "data-ranks",
        "data-rank",
        "data-record",
        "tabindex",
        "type",
        "data-view",
        "hidden",
        "open",
    }, names
    return parser


@pytest.mark.parametrize("make", [seed_incident, straggler_incident])
@pytest.mark.parametrize("ranks_too", [False, True])
def test_hostile_strings_in_every_field_bring_no_markup(make, ranks_too):
    doc = poisoned(make(), ranks_too=ranks_too)
    page = render_html(doc)
    parser = assert_no_markup_comes_through(page)
    assert embedded(page) == json.loads(json.dumps(doc))  # the data itself is kept whole
    if ranks_too:  # an attribute keeps the hostile rank as one value (the issue's `data-rank="0"><script>`)
        ranks = [dict(attrs)["data-rank"] for tag, attrs in parser.tags if "data-rank" in dict(attrs)]
        assert ranks and all(rank[:1].isdigit() and rank[1:] in HOSTILE for rank in ranks)


def test_at_scale_ranks_that_look_alike_share_a_lane():
    page = render_html(seed_incident(1024))
    assert lanes(page) == ["rank 0", "ranks 1-1023"]
    assert page.count('id="divergence"') == 1


def test_a_straggler_shows_the_busy_rank_as_the_culprit_and_no_divergence():
    st = states(
        rank_state(0, 2, inflight=[], idle=400.0, user_line=("val.py", 40, "validate")),
        rank_state(1, 2, inflight=[barrier(age=301.0)], idle=301.0),
    )
    doc = incident(st, analysis.assess(st, 2, 2.0, 300.0).findings, trigger="timeout")
    page = render_html(doc)
    assert 'id="divergence"' not in page
    assert re.search(
        r'<g class="op busy culprit" data-rank="0"><title>rank 0: busy outside collectives at '
        r"val.py:40",
        page,
    )


def test_no_findings_and_no_records_still_render():
    st = states(rank_state(0, 1, inflight=[], stacks=[]))
    page = render_html(incident(st, [], trigger="dump"))
    assert "No hang proven (dump)" in page and lanes(page) == ["rank 0"]


def test_many_positions_keep_the_divergence_in_view():
    st = seed_states(2)
    for state in st.values():
        state["recent"] = [done(seq, "all_reduce", site=("train.py", 70, "train")) for seq in range(1, 11)] + [
            done(seq, "all_reduce") for seq in range(12, 100)
        ]  # more positions than the view shows
        for index, record in enumerate(state["recent"]):
            record["start"] = 1_600_000_000.0 + index
    st[0]["inflight"][0]["start"] = st[1]["inflight"][0]["start"] = 1_500_000_000.0  # oldest: would be cut
    page = render_html(incident(st, analysis.assess(st, 2, 2.0, 300.0).findings))
    assert 'id="divergence"' in page and "older positions not shown" in page


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.real
@pytest.mark.skipif(
    BROWSER is None,
    reason="no `chromium` on PATH (Debian package `chromium`): the page's script "
    "is checked in a real headless browser only where one is installed",
)
@pytest.mark.timeout(90)
def test_page_script_runs_in_a_headless_browser(tmp_path):
    path = tmp_path / "report.html"
    path.write_text(render_html(seed_incident(3)), encoding="utf-8")
    done_run = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", path.as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
    )
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
    subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1200,900",
            f"--screenshot={shot}",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shot.exists() and shot.stat().st_size > 10_000  # a picture, saved under the test's temp dir


@pytest.mark.real
@pytest.mark.skipif(BROWSER is None, reason="no `chromium` on PATH (Debian package `chromium`)")
@pytest.mark.timeout(90)
def test_a_hostile_report_runs_no_injected_script_in_a_browser(tmp_path):
    path = tmp_path / "report.html"
    path.write_text(render_html(poisoned(seed_incident(), ranks_too=True)), encoding="utf-8")
    done_run = subprocess.run(
        [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", path.as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    dom = done_run.stdout
    assert 'data-ready="1"' in dom, done_run.stderr[-2000:]  # the page's own script ran to its end
    assert not re.search(r"<body[^>]*data-pwned", dom)  # no injected script or handler did
    assert "<img" not in dom


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


def run_page_script(page, tmp_path) -> dict:
    """The page's script run by node against FAKE_DOM: what it showed on load, after a click, after a view switch."""
    ops = [dict(re.findall(r'([\w-]+)="([^"]*)"', attrs)) for attrs in re.findall(r'<g (class="op [^>]*)>', page)]
    buttons = [{"data-view": view} for view in re.findall(r'<button type="button" data-view="([^"]+)"', page)]
    script = re.findall(r"<script>(.*?)</script>", page, re.S)[-1]
    data = re.search(r'id="incident-data">(.*?)</script>', page, re.S).group(1)
    (tmp_path / "page.json").write_text(json.dumps({"ops": ops, "buttons": buttons, "script": script, "data": data}))
    (tmp_path / "dom.js").write_text(FAKE_DOM)
    run = subprocess.run(
        [NODE, str(tmp_path / "dom.js"), str(tmp_path / "page.json")], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.real
@pytest.mark.skipif(NODE is None, reason="no `node` on PATH: the page's script is run against a fake DOM only there")
def test_page_script_shows_details_and_switches_views(tmp_path):
    result = run_page_script(render_html(seed_incident(3)), tmp_path)
    assert result["ready"] == "1"
    assert result["onload"].startswith("rank 0: broadcast [_broadcast_coalesced] group 0 seq 11, in_flight for 3.0 s")
    assert "inside ddp_forward called at /u/val.py:42 in validate()" in result["onload"]
    assert "main-thread stack of rank 0 (most recent call last):\n  > /u/train.py:120 in main" in result["onload"]
    assert result["clicked"].startswith("rank 1: barrier [barrier] group 0 seq 11, in_flight")
    assert "call site: /u/train.py:88 in train()" in result["clicked"]
    assert result["timeShown"] is True


@pytest.mark.real
@pytest.mark.skipif(NODE is None, reason="no `node` on PATH: the page's script is run against a fake DOM only there")
def test_page_script_folds_ddpwatch_own_frames_in_the_details(tmp_path):
    result = run_page_script(render_html(wrapped_incident()), tmp_path)
    shown = result["onload"].split("main-thread stack of rank 0 (most recent call last):\n")[1]
    assert shown.splitlines() == [("  > " if line.startswith("/u/") else "    ") + line for line in FOLDED_RANK0]
