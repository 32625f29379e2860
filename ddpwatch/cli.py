"""The `ddpwatch` command line: demo, report, lint."""

from __future__ import annotations

import argparse
import sys


def _cmd_demo(args) -> int:
    from .demo import run_demo

    return run_demo(fixed=args.fixed, report_dir=args.dir)


def _cmd_report(args) -> int:
    from . import render, report, snapshot

    try:
        incident = report.load_incident(args.path)
    except (OSError, snapshot.FormatError) as exc:
        print(f"ddpwatch report: {exc}", file=sys.stderr)
        return 2
    if args.reanalyze:
        from . import analysis

        states = {state["rank"]: state for state in incident.get("ranks") or ()}
        incident["findings"] = analysis.analyze(states, incident["world_size"], incident.get("grace", 2.0),
                                                incident.get("timeout", 300.0)) or incident.get("findings", [])
    text = render.render_json(incident) if args.format == "json" else render.render_text(incident)
    sys.stdout.write(text)
    return 0


def _cmd_lint(args, rest) -> int:
    from . import config, lint

    try:
        settings = config.load()
    except config.ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    return lint.main(rest, default_ignore=settings.lint_ignore)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddpwatch", description="Catch hangs in distributed PyTorch training.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the seed stall on 2 CPU ranks and watch ddpwatch catch it")
    demo.add_argument("--fixed", action="store_true", help="run the fixed loop (model.module(x)); no report expected")
    demo.add_argument("--dir", default=None, help="report directory (default: a folder under the temp dir)")
    rep = sub.add_parser("report", help="re-render a saved incident folder")
    rep.add_argument("path", help="an incident folder or its report.json")
    rep.add_argument("--format", choices=("text", "json"), default="text")
    rep.add_argument("--reanalyze", action="store_true", help="run the analysis again on the saved rank states")
    sub.add_parser("lint", help="find hangs in the source before it runs (see docs/lint.md)", add_help=False)
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "lint":
        return _cmd_lint(None, argv[1:])
    args = build_parser().parse_args(argv)
    return {"demo": _cmd_demo, "report": _cmd_report}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
