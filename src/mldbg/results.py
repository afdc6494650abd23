"""The JSON shapes mldbg calls stable: what each verb answers.

These TypedDicts are the output schemas of the MCP tools and the response models of the
REST routes (both derived from ``verbs.py``), and the types the typed client returns.
Fields are only ever added.  Nested values an agent rarely branches on stay ``dict``.

``typing_extensions.TypedDict`` rather than ``typing``'s: pydantic needs it below 3.12 to
turn these into schemas.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import NotRequired, TypedDict


class Truncation(TypedDict, total=False):
    """Present wherever an answer was cut to its budget: what was left out, how to get it."""

    truncated: bool
    total: int
    shown: int
    next: dict[str, Any]  # the call that gets the rest: {"verb", "args"}


class Location(TypedDict, total=False):
    file: str
    line: int
    function: str
    code: list[list[Any]]


class BreakpointSpec(TypedDict, total=False):
    file: str
    line: int
    condition: str | None
    hits: str | None
    log: str | None
    checkpoint: str | None
    function: str | None  # a dotted name instead of file and line
    exception: str | None  # "raised" or "uncaught" (with types)
    types: list[str] | None
    this_thread: bool | None


class BreakpointInfo(TypedDict, total=False):
    id: int
    file: str
    line: int
    checkpoint: str
    condition: str | None
    hits: str | None
    log: str | None
    hit_count: int
    warning: str  # e.g. the file is not the copy of its module the script imports
    function: str  # set by a function breakpoint
    pending: bool  # a function breakpoint whose module is not found yet
    exception: str  # "raised" / "uncaught": an exception breakpoint
    types: list[str]
    temporary: bool  # until's one-shot breakpoint
    this_thread: bool
    existing: bool  # until reused the breakpoint already on that line
    nonfinite: bool  # the tripwire (break --nonfinite), with max_abs and subnormal
    max_abs: float | None
    subnormal: bool


class Watch(TypedDict, total=False):
    id: int
    expression: str
    value: str  # at a stop: the value's one line (bounded)
    error: str  # at a stop: what evaluating it raised


class Breakpoints(TypedDict, total=False):
    breakpoints: list[BreakpointInfo]
    watches: list[Watch]


class Watches(TypedDict, total=False):
    watch: Watch  # the one just set
    removed: list[Watch]
    watches: list[Watch]


class ThreadInfo(TypedDict, total=False):
    number: int
    id: int
    native_id: int | None
    name: str
    daemon: bool
    paused: bool
    stopped_here: bool
    selected: bool
    where: dict[str, Any] | None


class Threads(Truncation, total=False):
    threads: list[ThreadInfo]
    pid: int


class Removed(TypedDict):
    removed: int


class Recovered(TypedDict, total=False):
    """A session a previous daemon left behind, as the next daemon found it."""

    session: str
    pid: int
    run_dir: str
    run_id: str
    state: str | None  # what run.json now says (exited)
    ended_reason: str | None  # daemon_lost
    found: str  # ended_itself | ended_now | vanished
    store_error: str


class State(TypedDict, total=False):
    session: str
    state: str  # starting | running | paused | exited | crashed
    reason: str | None  # entry | breakpoint | step | pause | exception | checkpoint | tripwire
    location: Location | None
    pid: int | None
    exit_code: int | None
    signal: str | None
    exception: dict[str, Any] | None
    breakpoint: dict[str, Any] | None
    condition_error: str | None
    checkpoint: dict[str, Any] | None
    thread: dict[str, Any] | None
    frame_index: int | None
    run_id: str | None
    run_dir: str | None
    python: str | None
    python_version: str | None
    backend: str | None
    output_tail: NotRequired[str]
    output_truncated: NotRequired[bool]
    terminated: NotRequired[bool]
    store_error: NotRequired[str]
    recovered: NotRequired[Recovered]  # listed again by a restarted daemon (live_runs.py)
    warnings: NotRequired[list[str]]
    parent: NotRequired[str | None]  # a child process's session: the one that started it
    paused_children: NotRequired[list[str]]  # the run's child sessions paused now (at most 20)
    # children that could not reach the daemon and run undebugged: {"total", "last": [...]}
    detached_children: NotRequired[dict[str, Any]]
    watches: NotRequired[list[Watch]]  # every watch expression, evaluated at this stop
    note: NotRequired[str]  # e.g. a pause that had to stop in library code
    fix: NotRequired[list[dict[str, Any]]]  # calls that help from here (step out)
    raised: NotRequired[bool]  # stopped by break --raised: the exception is live
    raised_in: NotRequired[dict[str, Any]]  # where a library raised what stopped here
    until: NotRequired[BreakpointInfo]  # the one-shot breakpoint until set
    restarted_from: NotRequired[str]  # restart: the run id this one replaces
    selected: NotRequired[int]  # thread: the selected thread's id
    interrupted: NotRequired[bool]  # pause while paused: an evaluation was interrupted
    # at a stop: {"process": {rss_bytes, peak_rss_bytes}, "mlx": {active_bytes, peak_bytes,
    # cache_bytes, device}, "torch": {"cuda": {...}, "mps": {...}}} where each applies (memory.py)
    memory: NotRequired[dict[str, Any]]
    # reason "tripwire" (break --nonfinite): {id, module, class, framework, rule, found:
    # [{name, shape, dtype, nan, inf, above_max_abs, subnormal}], hit_count}
    tripwire: NotRequired[dict[str, Any]]


class Frame(TypedDict, total=False):
    index: int
    file: str
    line: int
    function: str
    library: bool


class Stack(Truncation, total=False):
    frames: list[Frame]
    selected: int
    hidden_library_frames: int


class FrameSelected(TypedDict, total=False):
    selected: int
    frame: dict[str, Any]
    note: str  # up/down past the last frame: where it stopped
    clamped: bool


class Variable(TypedDict):
    name: str
    scope: str
    type: str
    summary: str


class Variables(Truncation, total=False):
    frame: dict[str, Any]
    variables: list[Variable]


class Evaluation(TypedDict, total=False):
    expression: str
    result: str
    type: str
    summary: Any
    output: str
    output_truncated: bool
    result_truncated: bool
    # eval --against SESSION: that session's {session, result, type, summary, output}, and
    # the difference (side_by_side.py): tensors {shape_a, shape_b, equal, mismatched,
    # max_abs, mean_abs, rel_rms, cosine, nonfinite_a, nonfinite_b, first_mismatch, worst},
    # plain numbers {equal, b_minus_a, rel}
    session: str  # with against: the session asked first
    against: dict[str, Any]
    difference: dict[str, Any]
    # between the agent and the daemon only (removed before the answer): what eval's
    # export wrote for --against, {"written", "path"} or {"written": false, "reason"}
    export: dict[str, Any]


class Output(Truncation, total=False):
    output: str
    path: str | None
    size: int
    offset: int  # byte offset of the first byte shown


class Forgotten(TypedDict):
    removed: str


class TraceStep(TypedDict, total=False):
    time: float
    event: str
    reason: str
    location: dict[str, Any]
    stack: list[dict[str, Any]]
    variables: list[dict[str, Any]]


class Trace(Truncation, total=False):
    run_id: str
    path: str
    steps: list[TraceStep]


class Sessions(Truncation, total=False):
    sessions: list[State]
    pruned: list[str]


class Runs(Truncation, total=False):
    home: str
    runs: list[dict[str, Any]]


class Checkpoints(Truncation, total=False):
    run_id: str
    path: str
    checkpoints: list[dict[str, Any]]
    unreadable_lines: int


class CheckpointPairs(Truncation, total=False):
    a: dict[str, Any]  # {run_id, path}
    b: dict[str, Any]
    # [{checkpoint_name, hit_count, location_a, location_b, variables: {name: {kind, ...}},
    #   only_a, only_b}] (checkpoint_diff.py)
    pairs: list[dict[str, Any]]
    unpaired_a: list[str]  # "name#hit" in one run only (50 shown)
    unpaired_b: list[str]
    unpaired_counts: dict[str, int]
    records_cut: dict[str, Any]


class FirstNonfinite(TypedDict, total=False):
    source: dict[str, Any]  # {spec, kind, path, label}
    # {module, call, class, entries: [{name, shape, dtype, nan, inf}], inputs_checked} or None
    first: dict[str, Any] | None
    calls_checked: int
    victims: int


class ModuleTable(Truncation, total=False):
    a: dict[str, Any]  # the sources, as compare describes them
    b: dict[str, Any] | None
    # [{module, call, class, depth, a: {seconds, self_seconds, in_dtypes, out_dtypes},
    #   b: {...} | None, dtype_differs, time_ratio}] (compare/table.py)
    rows: list[dict[str, Any]]
    summary: dict[str, Any]


class Captures(Truncation, total=False):
    home: str
    captures: list[dict[str, Any]]


class CompareSummary(Truncation, total=False):
    ok: bool
    a: dict[str, Any]  # the source as found: spec, kind, path, ...
    b: dict[str, Any]
    rtol: float | None
    atol: float | None
    first_divergence: dict[str, Any] | None
    entries: list[dict[str, Any]]
    counts: dict[str, Any]
    unpaired_a: list[Any]
    unpaired_b: list[Any]
    warnings: list[Any]
    html: str | None


class WeightAudit(Truncation, total=False):
    ok: bool
    reference: dict[str, Any]  # label, framework, count
    port: dict[str, Any]
    fresh: dict[str, Any] | None
    counts: dict[str, int]  # parameters per status
    problems: list[dict[str, Any]]  # failing first: name, name_port, status, note, shapes...
    proposed_map: dict[str, Any] | None


class TensorStore(Truncation, total=False):
    """``list``: path, tensors, size_bytes (+ the page counts); ``clear``: removed;
    ``info``: one tensor's own fields at the top level (name, path, size_bytes, shape,
    dtype, metadata, or error when its file is unreadable)."""

    path: str
    tensors: list[dict[str, Any]]
    size_bytes: int
    removed: list[str]
    name: str
    shape: list[int]
    dtype: str
    metadata: dict[str, Any]
    error: str


class Cleaned(TypedDict, total=False):
    removed: list[str]
    kept_live: list[str]
    freed_bytes: int
    dry_run: bool
