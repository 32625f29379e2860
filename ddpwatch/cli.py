"""The `ddpwatch` command line: demo, report, lint, run, dump, --version."""

from __future__ import annotations

import argparse
import sys

from .config import DEFAULTS


def _say(error) -> None:
    """An error on stderr; it may quote a settings file from a cloned repository: escapes shown, never obeyed."""
    from .terminal import visible

    print(visible(str(error), keep_newlines=True), file=sys.stderr)


def _cmd_demo(args) -> int:
    from . import config
    from .demo import demo_report_dir, run_demo

    try:
        settings = config.load()  # defaults < files < DDPWATCH_* variables < --dir, as for every command
    except config.ConfigError as exc:
        _say(exc)
        return 2
    return run_demo(fixed=args.fixed, report_dir=demo_report_dir(args.dir, settings))


def report_formats() -> tuple:
    from .render.report import RENDERERS

    return tuple(RENDERERS)  # read when asked: a row added to the table is offered at once


def _cmd_report(args) -> int:
    from .sources import report_command

    return report_command.run_command(args)


def _cmd_run(rest) -> int:
    """`ddpwatch run [--] CMD ...`: CMD, and every Python process it starts, runs guarded (DDPWATCH=1)."""
    import os

    from . import config
    from .bootstrap import BOOTSTRAP_DIR

    command = rest[1:] if rest[:1] == ["--"] else rest
    if not command or command[0] in ("-h", "--help"):
        print(
            "usage: ddpwatch run [--] CMD [ARG ...]\n\nRun CMD with DDPWATCH=1 and ddpwatch's sitecustomize first on "
            "PYTHONPATH,\nso that every Python rank it starts is guarded with no change to its code.",
            file=sys.stderr if not command else sys.stdout,
        )
        return 2 if not command else 0
    env = config.activation_environ(BOOTSTRAP_DIR)
    try:
        config.load(environ=env)  # a bad value stops here, before anything is started
    except config.ConfigError as exc:
        _say(exc)
        return 2
    try:
        os.execvpe(command[0], command, env)  # the same pid: signals from a scheduler reach CMD itself
    except OSError as exc:
        print(f"ddpwatch run: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127


def _cmd_dump(args) -> int:
    from . import dump_client

    if args.list:
        return dump_client.list_ranks()
    return dump_client.dump(pid=args.pid, job=args.job, report_dir=args.dir, wait=args.wait)


def _cmd_lint(args, rest) -> int:
    from . import config, lint

    try:
        settings = config.load()
    except config.ConfigError as exc:
        _say(exc)
        return 2
    return lint.main(rest, default_ignore=settings.lint_ignore)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="ddpwatch", description="Catch hangs in distributed PyTorch training.")
    parser.add_argument("--version", action="version", version=f"ddpwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the seed stall on 2 CPU ranks and watch ddpwatch catch it")
    demo.add_argument("--fixed", action="store_true", help="run the fixed loop (model.module(x)); no report expected")
    demo.add_argument(
        "--dir",
        default=None,
        help="report directory (default: DDPWATCH_DIR or the dir of "
        "setup.cfg/pyproject.toml if set, else a folder under the temp dir)",
    )
    rep = sub.add_parser("report", help="re-render a saved incident, or merge rank dumps / Flight Recorder dumps")
    rep.add_argument(
        "path",
        nargs="*",
        help="an incident folder or report.json; or rank-<r>.json files and folders "
        "holding them (searched recursively) to merge",
    )
    rep.add_argument(
        "--format",
        choices=report_formats(),
        default="text",
        help="text (report.txt, the default), json (report.json), html (report.html, one self-contained "
        "page) or trace (trace.json, for Perfetto)",
    )
    rep.add_argument("-o", "--output", metavar="FILE", help="write to FILE (atomically) instead of stdout")
    rep.add_argument("--reanalyze", action="store_true", help="run the analysis again on the saved rank states")
    rep.add_argument(
        "--flight-recorder",
        metavar="DIR",
        action="append",
        help="read PyTorch Flight Recorder dumps (<prefix><rank>, pickle or JSON) under DIR instead; repeatable",
    )
    rep.add_argument(
        "--grace", type=float, default=None, help=f"analysis grace in seconds (default {DEFAULTS['grace']:g})"
    )
    rep.add_argument(
        "--timeout", type=float, default=None, help=f"analysis timeout in seconds (default {DEFAULTS['timeout']:g})"
    )
    sub.add_parser("lint", help="find hangs in the source before it runs (see docs/lint.md)", add_help=False)
    sub.add_parser(
        "run", help="run a command (torchrun ...) with every Python rank guarded, no code change", add_help=False
    )
    dump = sub.add_parser("dump", help="ask a live guarded job on this host for a report now (SIGUSR1)")
    dump.add_argument("--pid", type=int, help="the rank to ask (default: the lowest rank of the one local job)")
    dump.add_argument("--job", help="the job (TORCHELASTIC_RUN_ID, SLURM_JOB_ID or MASTER_ADDR:MASTER_PORT)")
    dump.add_argument("--dir", help="where the report lands (default: the rank's own report directory)")
    dump.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the report (default 30)")
    dump.add_argument("--list", action="store_true", help="list the guarded ranks running on this host")
    return parser


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "lint":
        return _cmd_lint(None, argv[1:])
    if argv and argv[0] == "run":
        return _cmd_run(argv[1:])
    args = build_parser().parse_args(argv)
    return {"demo": _cmd_demo, "report": _cmd_report, "dump": _cmd_dump}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
