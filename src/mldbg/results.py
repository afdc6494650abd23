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


class Call(TypedDict):
    """A call to make next, as every surface words it (a CLI command, an MCP tool call):
    the one that gets the rest of a cut answer (``next``), or that fixes an error
    (``fix``).  Built by ``verbs.fix`` and ``budget.page_info``; arguments left out are
    None."""

    verb: str
    args: dict[str, object]  # JSON values, passed back as they are


class Truncation(TypedDict, total=False):
    """Present wherever an answer was cut to its budget: what was left out, how to get it."""

    truncated: bool
    total: int
    shown: int
    next: Call  # the call that gets the rest


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


class DaemonStopped(TypedDict):
    """``mldbg serve --stop --json`` once the daemon's process is gone."""

    stopped: bool
    running: bool
    pid: int
    forced: str | None  # "SIGKILL": it did not end itself in time (a thread stuck in C)


class DetachedChild(TypedDict):
    """A child process that could not reach the daemon and runs undebugged, as it wrote
    in the run's detached.jsonl."""

    pid: int | None
    ppid: int | None
    reason: str | None
    time: float | None


class DetachedChildren(TypedDict):
    total: int
    last: list[DetachedChild]  # the last five


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
    # terminate: the session had ended before it was asked (not an error: it is ended)
    already_ended: NotRequired[bool]
    store_error: NotRequired[str]
    recovered: NotRequired[Recovered]  # listed again by a restarted daemon (live_runs.py)
    warnings: NotRequired[list[str]]
    parent: NotRequired[str | None]  # a child process's session: the one that started it
    paused_children: NotRequired[list[str]]  # the run's child sessions paused now (at most 20)
    # children that could not reach the daemon and run undebugged
    detached_children: NotRequired[DetachedChildren]
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


class ElementPair(TypedDict):
    """One element in both tensors: where, and each side's value ("nan"/"inf" as text)."""

    index: list[int]
    a: float | str | None
    b: float | str | None


class TensorDifference(TypedDict, total=False):
    """``eval --against``: how the tensor of the session set against differs from the
    first's (``side_by_side.tensor_difference``); ``error`` when they cannot be compared.
    Numbers that are not finite are text ("nan", "inf")."""

    shape_a: list[int]
    shape_b: list[int]
    note: str
    error: str
    equal: bool
    mismatched: int
    max_abs: float | str | None
    mean_abs: float | str | None
    rel_rms: float | str | None
    cosine: float | str | None
    nonfinite_a: int
    nonfinite_b: int
    first_mismatch: ElementPair
    worst: ElementPair


class ScalarDifference(TypedDict, total=False):
    """``eval --against`` of plain values: numbers subtract, others only compare."""

    equal: bool
    b_minus_a: float | str | None
    rel: float | str | None


class Output(Truncation, total=False):
    output: str
    path: str | None
    size: int
    offset: int  # byte offset of the first byte shown


class Forgotten(TypedDict):
    removed: str


class TraceLocation(TypedDict):
    """Where a recorded stop was: None where the record does not say."""

    file: str | None
    line: int | None
    function: str | None
    code: list[list[object]] | None  # [line number, text] around the line


class TraceStep(TypedDict, total=False):
    """One stop of a run, as its events.jsonl recorded it."""

    time: float | None  # None only where the record lacks it
    event: str | None
    reason: str | None
    location: TraceLocation
    stack: list[dict[str, object]]  # the frames as ``stack`` gave them then
    variables: list[dict[str, object]]  # the variables as ``vars`` gave them then
    exception: dict[str, object]  # as the stop said them, where it had them
    breakpoint: dict[str, object]
    checkpoint: dict[str, object]
    condition_error: str
    truncated: bool  # cut to its budget (budget.shrink), with what was cut
    cut: dict[str, dict[str, int]]


class Trace(Truncation, total=False):
    run_id: str
    path: str
    steps: list[TraceStep]


class Sessions(Truncation, total=False):
    sessions: list[State]
    pruned: list[str]


class RunMeta(TypedDict, total=False):
    """A run's run.json: written by the daemon as it starts and ends the script, by the
    script itself without the debugger (``current_run``), by the agent when its daemon
    went away (``ended_reason``), by the profiler; every field optional."""

    run_id: str
    kind: str  # plain (no debugger) | profile; absent for a debug session
    session: str
    script: str | None
    module: str | None  # python -m
    argv: list[str]
    cwd: str
    python: str
    python_version: str | None
    backend: str | None
    libraries: dict[str, object]  # name -> version, as the agent found them
    mldbg_version: str
    pid: int
    state: str  # starting | running | paused | exited | crashed
    started_at: str
    ended_at: str
    exit_code: int | None
    signal: str | int | None
    terminated: bool
    exception: dict[str, object] | None  # the uncaught exception, as the stop said it
    output_tail: str
    ended_reason: str | None  # daemon_lost, ...
    ended_note: str
    env: dict[str, str]  # the variables start added to its client's environment
    env_left_out: int  # variables not kept in env (it is bounded)
    paused_at: object  # where the script was paused when its daemon went away
    store_error: str
    capture_problems: list[str]  # what start --capture could not do (zero_edit.Tracker)


class RunRecord(TypedDict):
    """One run of the store, as ``runs`` lists it (``store.runs.describe_run``): what its
    run.json says, and what the directory holds."""

    run_id: str
    path: str
    state: str | None
    script: str | None  # the script's path, or the module run with -m
    started_at: str | None
    ended_at: str | None
    exit_code: int | None
    signal: str | int | None  # a session names it (SIGKILL), a profile run numbers it
    size_bytes: int
    checkpoints: int  # records in checkpoints.jsonl


class Runs(Truncation, total=False):
    home: str
    runs: list[RunRecord]


class CodeContext(TypedDict):
    """The lines around a checkpoint, by line number."""

    start_line: int
    end_line: int
    lines: dict[str, str]


class CheckpointRecord(TypedDict, total=False):
    """One line of a run's checkpoints.jsonl (``store.checkpoint.debug_checkpoint``)."""

    checkpoint_name: str
    hit_count: int
    timestamp: str  # ISO 8601 with the local offset
    timestamp_unix: float
    location: Location
    code_context: CodeContext
    # name -> a tensor summary (shape, dtype, stats, preview, ...) or {type, value, repr}
    variables: dict[str, dict[str, object]]
    values: dict[str, object]  # the first release's shape: tensors summarized, plain values bare
    metadata: object  # what the script passed as metadata=, as JSON, or None
    truncated: bool  # cut to its budget (budget.shrink), with what was cut
    cut: dict[str, dict[str, int]]


class Checkpoints(Truncation, total=False):
    run_id: str
    path: str
    checkpoints: list[CheckpointRecord]
    unreadable_lines: int


class RunRef(TypedDict):
    """A run of the store, by id and directory."""

    run_id: str
    path: str


class VariableComparison(TypedDict, total=False):
    """One variable in both runs' records (``store.checkpoint_diff``): ``kind`` tensor
    (shapes, dtypes, statistics and their differences, the previews side by side), value
    (``a``, ``b``, ``equal``, and ``b_minus_a`` for numbers) or mismatch (a tensor on one
    side only)."""

    kind: str  # tensor | value | mismatch
    note: str
    a: object  # a plain value as recorded
    b: object
    equal: bool
    b_minus_a: float | str  # "nan"/"inf" when not finite
    shape_a: object  # as each record says it (a list of ints)
    shape_b: object
    shape_match: bool
    dtype_a: object
    dtype_b: object
    stats_a: dict[str, object] | None
    stats_b: dict[str, object] | None
    stats_b_minus_a: dict[str, float | str]
    stats_max_rel: float
    nan_a: object
    nan_b: object
    inf_a: object
    inf_b: object
    preview_a: list[object]
    preview_b: list[object]
    preview_max_abs: float | str


class CheckpointPair(TypedDict, total=False):
    """A checkpoint name and hit found in both runs, variable by variable."""

    checkpoint_name: str | None  # None only for a record that lacks it
    hit_count: int | None
    location_a: Location | None
    location_b: Location | None
    variables: dict[str, VariableComparison]
    only_a: list[str]  # variables one record has and the other not
    only_b: list[str]
    truncated: bool  # cut to its budget (budget.shrink), with what was cut
    cut: dict[str, dict[str, int]]


class RecordsCut(TypedDict):
    """Which run had more records than are read (``read``), after the name/hit filter."""

    a: bool
    b: bool
    read: int


class CheckpointPairs(Truncation, total=False):
    a: RunRef
    b: RunRef
    pairs: list[CheckpointPair]
    unpaired_a: list[str]  # "name#hit" in one run only (50 shown)
    unpaired_b: list[str]
    unpaired_counts: dict[str, int]
    records_cut: RecordsCut


class SourceRef(TypedDict):
    """A source as compare found it (``compare.sources.Source.describe``): the spec it
    was given, what it is (capture, run, tensors...), where, and its label."""

    spec: str
    kind: str
    path: str
    label: str


class FirstNonfinite(TypedDict, total=False):
    source: SourceRef
    # {module, call, class, entries: [{name, shape, dtype, nan, inf}], inputs_checked} or None
    first: dict[str, Any] | None
    calls_checked: int
    victims: int


class ModuleTable(Truncation, total=False):
    a: SourceRef
    b: SourceRef | None
    # [{module, call, class, depth, a: {seconds, self_seconds, in_dtypes, out_dtypes},
    #   b: {...} | None, dtype_differs, time_ratio}] (compare/report/table.py)
    rows: list[dict[str, Any]]
    summary: dict[str, Any]


class CaptureRecord(TypedDict, total=False):
    """One module capture, as ``captures`` lists it: what its capture.json says."""

    name: str | None
    run_id: str | None
    framework: str | None
    model_class: str | None
    state: str | None  # capturing | complete | ... | "unreadable capture.json"
    records: int | None
    tensors: int | None
    bytes: int | None
    path: str


class Captures(Truncation, total=False):
    home: str
    captures: list[CaptureRecord]


class CompareSummary(Truncation, total=False):
    ok: bool
    a: SourceRef
    b: SourceRef
    rtol: float | None
    atol: float | None
    first_divergence: dict[str, Any] | None
    entries: list[dict[str, Any]]
    counts: dict[str, int]  # compared, passed, failed, noted, unpaired_a, unpaired_b
    unpaired_a: list[str]  # entry names in one source only
    unpaired_b: list[str]
    warnings: list[str]
    html: str | None
    line: Call  # after a module or glue verdict: the line step's call


class ParamsSide(TypedDict):
    """One model of a weight audit: its label, framework and parameter count."""

    label: str
    count: int
    framework: NotRequired[str | None]  # not said of the fresh model
    ranks: NotRequired[list[str]]  # the captures gathered, rank by rank (port=tp@rank*)


class ProposedMap(TypedDict):
    rename: dict[str, str]  # as compare's --map file takes it


class WeightAudit(Truncation, total=False):
    ok: bool
    reference: ParamsSide
    port: ParamsSide
    fresh: ParamsSide | None
    counts: dict[str, int]  # parameters per status
    problems: list[dict[str, Any]]  # failing first: name, name_port, status, note, shapes...
    proposed_map: ProposedMap | None


class TensorHeader(TypedDict):
    """What a safetensors file's header says of its tensor (``store.tensors.read_header``)."""

    dtype: str | None
    shape: list[int] | None
    metadata: dict[str, str]


class TensorRecord(TypedDict, total=False):
    """One tensor of the ``debug_save`` store: its file, and its header's fields (or
    ``error`` when the file is unreadable)."""

    name: str
    path: str
    size_bytes: int
    dtype: str | None
    shape: list[int] | None
    metadata: dict[str, str]
    error: str


class TensorStore(Truncation, total=False):
    """``list``: path, tensors, size_bytes (+ the page counts); ``clear``: removed;
    ``info``: one tensor's own fields at the top level (name, path, size_bytes, shape,
    dtype, metadata, or error when its file is unreadable)."""

    path: str
    tensors: list[TensorRecord]
    size_bytes: int
    removed: list[str]
    name: str
    shape: list[int] | None
    dtype: str | None
    metadata: dict[str, str]
    error: str


class Cleaned(TypedDict, total=False):
    removed: list[str]
    kept_live: list[str]
    freed_bytes: int
    dry_run: bool


class DocsLink(TypedDict):
    """``POST /v1/docs-link`` (``mldbg docs``): a one-time link to the OpenAPI docs for a
    browser; opened within ``expires_in_s`` it leaves a cookie good for ``cookie_s`` that
    opens the docs pages only."""

    url: str
    expires_in_s: float
    cookie_s: float


Number = int | float | str  # a JSON number, or "nan" / "inf" / "-inf"


class LineValue(TypedDict, total=False):
    """One value a line of a script bound, as the line step recorded it."""

    file: str
    line: int
    function: str
    text: str  # the statement's first line
    name: str  # q, self.cache, outs[3], return, sdpa.probs, in.timestep
    kind: str  # local | attribute | item | return | argument | fused | input
    shape: list[int] | None
    dtype: str | None
    head: list[Number]  # its first elements
    rms: float | None
    runs: int  # values this line bound under this name in the scope (loops: more than 1)
    kept: bool  # False: its value was not kept (byte budget, unreadable): never named


class LineCounterpart(TypedDict, total=False):
    """A reference value near a port value: how far, and the port's value as read in
    the reference's shape."""

    a: LineValue
    rel_rms: float | None
    reading: str  # as is, reshaped ..., read as [...]
    head_b: list[Number] | None


class LinePair(TypedDict, total=False):
    """A port value and its closest reference values (``ok``: within the bound)."""

    b: LineValue
    ok: bool | None  # None: nothing of its size in the reference, or not kept
    nearest: list[LineCounterpart]


class FusedCall(TypedDict, total=False):
    """A reference line that computes in one call what the port spells out in several."""

    a: LineValue
    inside: list[LineValue]  # the port's lines it covers
    contradicted: LinePair | None  # the first port line its output contradicts
    note: str


class LineScope(TypedDict, total=False):
    """What each script's re-run recorded."""

    kind: str  # module | glue
    model: int  # the run's n-th model
    module_a: str
    module_b: str
    call: int
    sites_a: list[str]  # glue: the call sites in the reference's script
    sites_b: list[str]
    input: str | None  # glue: the differing input of the call that ends the scope


class LineStep(Truncation, total=False):
    """``line``: the first line of the port whose value has no counterpart in the
    reference, after a module or glue verdict (``state: running`` while the scripts run
    again: call again; ``done`` with the answer)."""

    state: str  # running | done
    phase: str  # comparing | reference | port | aligning | done
    job: str  # the step, kept by the daemon: call again with it to page or to wait
    a: str
    b: str
    culprit: str | None  # compare's verdict it starts from
    scope: LineScope
    bound: float | None  # the relative error a value may differ by and still agree
    first_wrong: LinePair | None
    last_agreeing: LinePair | None
    fused: FusedCall | None
    skipped: list[LineValue]  # reference lines between, of whose values the port has none
    lines: list[LinePair]  # the port's values around the first wrong one
    reason: str
    notes: list[str]
    runs: dict[str, str]  # a, b: the re-runs' run ids
    records: dict[str, int]  # a, b: values recorded
    elapsed: float
