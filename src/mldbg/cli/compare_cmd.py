"""``mldbg compare A B`` and ``mldbg captures``: parity from the command line.

Exit codes: 0 when everything agrees, 1 when something diverges, 2 on bad input (a
missing capture, a corrupt file, nothing comparable, a bad map file, an unknown session).

The comparison runs here, in the CLI's process, not in the daemon as the other verbs do:
its progress bar draws while the tensors stream (the daemon answers once, at the end),
exit codes 0/1/2 say the verdict, ``--propose-map`` and ``--html`` write where the user
runs, no daemon is needed to compare two directories, and a long comparison never takes
CPU and memory from the daemon that serves live sessions.  Which run store it reads is
decided as for every run-store verb (``server/handlers.store_home``): ``--home``, else
``--session``'s store (the daemon says which: the one place that knows), else
``$MLDBG_HOME``, else ``./.mldbg``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from .. import deadline, verbs
from .. import results as R
from ..compare import CompareInputError, compare
from ..compare.report.answer import Selection, bounded
from ..errors import BAD_ARGUMENT, BAD_SHARDS, MldbgError
from ..text import compare as compare_render
from ..text import render
from ..verbs import Arg

EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT = 0, 1, 2


# The verb's arguments the CLI takes as every command does: ``session`` (--session, -s),
# which every command's parser takes already.
_PAGING = ("session",)


def add_arguments(p: argparse.ArgumentParser, add_arg: Callable[[Any, Arg], None]) -> None:
    """The ``compare`` verb's own arguments (declared once, in the verb table), as the CLI
    spells them, plus what only a terminal needs: the proposed-map file."""
    for arg in verbs.get("compare").args:
        if arg.name in _PAGING or not arg.cli:
            continue
        if arg.name == "map":  # a file here; REST and MCP also take the map inline
            p.add_argument("--map", metavar="FILE", help=arg.help)
        elif arg.name == "shards":  # GLOB=DIM or GLOB=sum, once per rule
            p.add_argument(
                "--shards", action="append", default=[], metavar="GLOB=DIM|sum", help=arg.help
            )
        elif arg.name == "layout":  # NCHW/nhwc/Auto: any case
            p.add_argument(
                "--layout",
                choices=arg.choices,
                type=lambda v: {"nchw": "NCHW", "nhwc": "NHWC"}.get(v.lower(), v.lower()),
                help=arg.help,
            )
        else:
            add_arg(p, arg)
    p.add_argument(
        "--propose-map",
        metavar="FILE",
        help="write the map proposed from the module trees (when few entries pair) to FILE",
    )


def parse_shards(rules: list[str]) -> dict[str, int | str] | None:
    """``--shards 'layers.*.mlp.*=0' --shards '*.o_proj.bias=sum'``: the rules ``compare``
    takes as ``shards`` (a dimension to concatenate along, or ``sum``)."""
    shards: dict[str, int | str] = {}
    for rule in rules:
        glob, sep, how = rule.rpartition("=")
        if not sep or not glob:
            raise CompareInputError(
                f"--shards {rule!r}: give GLOB=DIM (a dimension) or GLOB=sum", code=BAD_SHARDS
            )
        how = how.strip()
        shards[glob] = int(how) if how.lstrip("-").isdigit() else how
    return shards or None


def store_home(args: argparse.Namespace) -> str | None:
    """The run store ``--home`` or ``--session`` names (as the daemon resolves it for every
    run-store verb), or None: ``$MLDBG_HOME``, else ``./.mldbg``, as ``compare`` finds it."""
    if args.home:
        return os.path.abspath(os.path.expanduser(args.home))
    session = getattr(args, "session", None)
    if not session:
        return None
    from ..client.api import connect

    store: R.Runs = connect().call("runs", None, session=session, limit=1)
    return store["home"]


def run_compare(args: argparse.Namespace, as_json: bool) -> int:
    try:
        shards = parse_shards(args.shards)
        home = store_home(args)
        seconds = deadline.seconds_allowed()
        with compare_render.progress_bar(enabled=sys.stderr.isatty()) as progress:
            comparison = deadline.call_bounded(
                "compare",
                seconds,
                lambda: compare(
                    args.a,
                    args.b,
                    rtol=args.rtol,
                    atol=args.atol,
                    map=args.map,
                    layout=args.layout,
                    replay=args.replay,
                    better=args.better,
                    shards=shards,
                    html=args.html,
                    home=home,
                    progress=progress,
                ),
            )
    except (CompareInputError, MldbgError) as exc:
        proposal = getattr(exc, "extra", {}).get("proposed_map") if args.propose_map else None
        if proposal:
            refused = _write_map(args.propose_map, proposal)
            if refused is not None:
                return _bad_input(refused, as_json)
        return _bad_input(exc, as_json)
    except OSError as exc:
        return _bad_input(
            CompareInputError(f"{exc.filename or ''}: {exc.strerror or exc}"), as_json
        )
    proposal = comparison.result.get("proposed_map")
    if args.propose_map and proposal:
        refused = _write_map(args.propose_map, proposal)
        if refused is not None:
            return _bad_input(refused, as_json)
    selection = Selection(
        passing=args.passing,
        inputs=args.inputs,
        module=args.module,
        call=args.call,
        status=args.status,
        kind=args.kind,
    )
    if as_json:  # the page an agent gets on every surface: bounded, with its `next`
        page = bounded(
            comparison.result,
            passing=args.passing,
            inputs=args.inputs,
            module=args.module,
            call=args.call,
            status=args.status,
            kind=args.kind,
            offset=args.offset,
            limit=args.limit,
        )
        if args.html:
            page["html"] = args.html
        print(json.dumps(page, indent=2, allow_nan=False))
    else:
        compare_render.show(
            comparison.result,
            show_all=args.passing,
            show_inputs=args.inputs,
            selection=selection,
        )
        if args.html:
            render.out.print(f"report: {args.html}")
    return comparison.exit_code


def _write_map(path: str, proposal: Mapping[str, object]) -> CompareInputError | None:
    """The proposed map as a JSON file: it replaces only a JSON object file (an earlier
    map), never a FIFO (the write blocked forever), a device or another file; the error
    (bad input) when it could not be written."""
    from ..store.output_files import replace_output

    try:
        replace_output(path, json.dumps(proposal, indent=2) + "\n", b"{")
    except OSError as exc:
        return CompareInputError(f"--propose-map {path}: {exc.strerror or exc}", code=BAD_ARGUMENT)
    return None


def _bad_input(exc: MldbgError, as_json: bool) -> int:
    if as_json:
        print(json.dumps(exc.to_json(), indent=2, default=str))
    else:
        render.error(exc.to_json())
    return EXIT_BAD_INPUT
