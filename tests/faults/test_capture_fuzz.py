"""Fuzzing the readers of captures: hostile run stores get an answer or a code, never more.

A capture directory is input like any other: a damaged disk, a killed run, a file copied
from elsewhere or written by hand.  Hypothesis mutates real captures of a tiny torch MLP
(the slow tier of ``make test``, derandomized, a fixed number of examples each) and
drives every reader with them:

* index lines: fields of any type, lines dropped, repeated, moved or garbled, parent
  graphs with cycles, dangling and forward parents, duplicate sequence numbers, tensor
  infos that lie, statistics of any value; and ``capture.json`` of any shape;
* tensor file headers: any dtype, shape and offsets, truncated or random bytes;
* maps: renames, regex rules (bad ones included) and ignore globs of any text;
* shard sets: rank captures with any rank and world size, and shard rules of any kind.

Each example runs compare (both ways, so the mutated capture is the reference whose tree
compare walks, and coarse captures get narrow's hint), module-table, nonfinite and the
weight audit, each under a deadline.  Every call must answer (and its answer must be the
JSON the daemon can send) or raise an ``MldbgError`` whose code is one ``errors.py``
documents; an exception of another kind, the generic codes, or the deadline (a hang) fail.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mldbg  # noqa: E402
from mldbg import deadline, errors  # noqa: E402
from mldbg.compare import compare_answer  # noqa: E402
from mldbg.compare.culprit.nonfinite import first_nonfinite  # noqa: E402
from mldbg.compare.report.table import module_table  # noqa: E402
from mldbg.store import current_run  # noqa: E402
from mldbg.weights.audit import audit_weights  # noqa: E402
from tiny_torch import MLP  # noqa: E402

pytestmark = pytest.mark.slow

PER_CALL = 30.0  # seconds one analysis of a tiny capture may take before it counts as a hang
# Every code errors.py names, but the two that say nothing: what a client can branch on.
DOCUMENTED = {
    value
    for name, value in vars(errors).items()
    if name.isupper() and isinstance(value, str) and value not in (errors.ERROR, errors.INTERNAL)
}
FUZZ = settings(
    max_examples=60,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real captures to mutate: ``ref``, ``port`` (fc2 differs, so compare names a
    culprit) and a ``coarse`` summary capture, each with its weights saved."""
    home = tmp_path_factory.mktemp("made") / ".mldbg"
    found: dict[str, Path] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLDBG_HOME", str(home))
        for name, options in (("ref", {}), ("port", {}), ("coarse", {"mode": "summary"})):
            current_run.reset()
            torch.manual_seed(0)
            model = MLP()
            if name != "ref":
                with torch.no_grad():
                    model.fc2.weight[0, 0] += 1.0
            with torch.no_grad(), mldbg.capture(model, name, **options) as cap:
                cap.save_weights()
                model(torch.randn(3, 8))
            assert cap.path is not None and not cap.errors
            found[name] = cap.path
        current_run.reset()
    return found


# -- what the mutations are made of ------------------------------------------------------------

_text = st.text(max_size=12)
_number = st.one_of(
    st.integers(min_value=-3, max_value=12),
    st.sampled_from([10**20, -(10**20), 2**63, 1e400, -1e400, 0.5, -0.0]),
)
_scalar = st.one_of(st.none(), st.booleans(), _number, _text)
_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
    max_leaves=6,
)
_FIELDS = [
    "event", "seq", "module", "call", "class", "parent", "depth", "file", "tensors", "end",
    "error", "site", "sensitivity", "step", "amplification", "skipped", "seconds", "quant",
]  # fmt: skip
_GARBAGE = ["", "not json", "[1, 2]", '{"seq": ', "[" * 5000 + "]" * 5000, "\x00\xff", "null"]


def _set_field(records: list[Any], at: int, field: str, value: Any) -> None:
    if records and isinstance(records[at % len(records)], dict):
        records[at % len(records)][field] = value


def _set_parent(records: list[Any], at: int, to: int) -> None:
    """A parent graph edit: the call at ``at`` gets the ``seq`` of the call ``to`` (itself,
    a later one, or one that does not exist when ``to`` is past the end)."""
    calls = [r for r in records if isinstance(r, dict) and r.get("event") == "call"]
    if calls:
        target = calls[to] if 0 <= to < len(calls) else {"seq": 90 + to}
        calls[at % len(calls)]["parent"] = target.get("seq")


def _tensor_info(records: list[Any], at: int, field: str, value: Any) -> None:
    with_tensors = [
        r for r in records if isinstance(r, dict) and isinstance(r.get("tensors"), dict)
    ]
    if with_tensors:
        tensors = with_tensors[at % len(with_tensors)]["tensors"]
        for info in list(tensors.values())[:1]:
            if isinstance(info, dict):
                info[field] = value


def _line_edit(records: list[Any], at: int, kind: str, garbage: str) -> None:
    if not records:
        return
    at %= len(records)
    if kind == "drop":
        records.pop(at)
    elif kind == "repeat":
        records.insert(at, json.loads(json.dumps(records[at])))
    elif kind == "move":
        records.insert(0, records.pop(at))
    else:
        records.insert(at, garbage)  # a raw line, not JSON


_edit = st.one_of(
    st.tuples(st.just(_set_field), st.integers(0, 20), st.sampled_from(_FIELDS), _value),
    st.tuples(st.just(_set_parent), st.integers(0, 20), st.integers(-1, 8)),
    st.tuples(
        st.just(_tensor_info),
        st.integers(0, 20),
        st.sampled_from(["shape", "dtype", "key", "stats", "sketch"]),
        st.one_of(
            _value,
            st.lists(st.integers(-2, 40), max_size=3),
            st.sampled_from(["F32", "BF16", "F16", "I64", "F8_E8M0", "C64", "BOOL", "??"]),
            st.fixed_dictionaries(
                {},
                optional={
                    key: st.one_of(_number, st.none())
                    for key in ("numel", "nan", "inf", "min", "max", "mean", "rms", "norm")
                },
            ),
        ),
    ),
    st.tuples(
        st.just(_line_edit),
        st.integers(0, 20),
        st.sampled_from(["drop", "repeat", "move", "garbage"]),
        st.sampled_from(_GARBAGE),
    ),
)
_meta_edit = st.dictionaries(
    st.sampled_from(
        [
            "mode",
            "depth",
            "budget_limit",
            "upstream",
            "name",
            "created",
            "state",
            "modules",
            "weights",
            "within",
        ]
    ),
    st.one_of(
        _value,
        st.sampled_from(["summary", "full", "capturing"]),
        st.lists(st.fixed_dictionaries({"capture": _text, "ended": _number}), max_size=2),
    ),
    max_size=3,
)


def _rewrite(directory: Path, edits: list[tuple[Any, ...]], meta: dict[str, Any]) -> None:
    """Apply ``edits`` to a capture's index and ``meta`` to its capture.json."""
    index = directory / "index.jsonl"
    records: list[Any] = [json.loads(line) for line in index.read_text().splitlines()]
    for edit, *args in edits:
        edit(records, *args)
    lines = [r if isinstance(r, str) else json.dumps(r, allow_nan=True) for r in records]
    index.write_text("".join(line.replace("Infinity", "1e400") + "\n" for line in lines))
    if meta:
        path = directory / "capture.json"
        saved = json.loads(path.read_text())
        saved.update(meta)
        path.write_text(json.dumps(saved, allow_nan=True).replace("Infinity", "1e400"))


# -- the readers, each bounded, each answer checked -------------------------------------------


def _drive(calls: list[tuple[str, Callable[[], Any]]]) -> list[str]:
    """Run each reader; what went wrong, one line each."""
    problems = []
    for label, call in calls:
        try:
            answer = deadline.call_bounded(label, PER_CALL, call)
            json.dumps(answer, allow_nan=False, default=str)  # what the daemon sends
        except errors.TooSlow:
            problems.append(f"{label}: no answer within {PER_CALL:g} s (a hang)")
        except errors.MldbgError as exc:
            if exc.code not in DOCUMENTED:
                problems.append(f"{label}: code {exc.code!r}: {exc.message[:200]}")
        except Exception as exc:  # what must never escape a reader
            problems.append(f"{label}: {type(exc).__name__}: {str(exc)[:300]}")
    return problems


def _readers(
    home: Path, ref: Path, fuzzed: Path, **compare: Any
) -> list[tuple[str, Callable[[], Any]]]:
    return [
        ("compare ref fuzzed", lambda: compare_answer(home, a=str(ref), b=str(fuzzed), **compare)),
        ("compare fuzzed ref", lambda: compare_answer(home, a=str(fuzzed), b=str(ref), **compare)),
        ("module-table", lambda: module_table(str(fuzzed), str(ref), home=home)),
        ("nonfinite", lambda: first_nonfinite(str(fuzzed), home=home)),
        ("weights", lambda: audit_weights(str(ref), str(fuzzed), home=home)),
    ]


def _check(problems: list[str], example: object) -> None:
    assert not problems, f"{example!r}:\n" + "\n".join(problems)


def test_fuzzed_index_lines_and_capture_json(made: dict[str, Path]) -> None:
    @FUZZ
    @given(
        base=st.sampled_from(["port", "coarse"]),
        edits=st.lists(_edit, min_size=1, max_size=6),
        meta=_meta_edit,
    )
    def example(base: str, edits: list[tuple[Any, ...]], meta: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp) / ".mldbg"
            fuzzed = Path(tmp) / "fuzzed"
            shutil.copytree(made[base], fuzzed)
            _rewrite(fuzzed, edits, meta)
            reference = made["ref"] if base == "port" else made["coarse"]
            _check(_drive(_readers(home, reference, fuzzed)), (base, edits, meta))

    example()


_header = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(
            ["F32", "F16", "BF16", "F64", "I8", "U8", "BOOL", "F8_E4M3", "F8_E8M0", "C64", "XX", ""]
        ),
        "shape": st.lists(st.integers(-1, 20), max_size=3),
        "data_offsets": st.lists(st.integers(-4, 200), min_size=0, max_size=3),
    }
)


def test_fuzzed_tensor_file_headers(made: dict[str, Path]) -> None:
    @FUZZ
    @given(
        which=st.integers(0, 8),
        header=st.one_of(_header.map(lambda h: {"out": h}), _value),
        data=st.binary(max_size=300),
        raw=st.one_of(st.none(), st.binary(max_size=40)),
    )
    def example(which: int, header: Any, data: bytes, raw: bytes | None) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp) / ".mldbg"
            fuzzed = Path(tmp) / "fuzzed"
            shutil.copytree(made["port"], fuzzed)
            files = sorted(fuzzed.glob("*.safetensors"))  # the calls' files and weights
            target = files[which % len(files)]
            if raw is not None:
                target.write_bytes(raw)  # truncated, or not safetensors at all
            else:
                text = json.dumps(header, allow_nan=True).encode()
                target.write_bytes(len(text).to_bytes(8, "little") + text + data)
            _check(_drive(_readers(home, made["ref"], fuzzed)), (target.name, header, raw))

    example()


_pattern = st.text(alphabet="x.#()[]*+?|^$\\d0123ab", max_size=10)
_map = st.fixed_dictionaries(
    {},
    optional={
        "rename": st.dictionaries(_text, st.one_of(_text, _value), max_size=3),
        "regex": st.one_of(
            st.lists(st.lists(_pattern, min_size=2, max_size=2), max_size=3), _value
        ),
        "ignore": st.one_of(st.lists(_text, max_size=3), _value),
        "nonsense": _value,
    },
)


def test_fuzzed_maps(made: dict[str, Path]) -> None:
    @FUZZ
    @given(name_map=_map)
    def example(name_map: dict[str, Any]) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp) / ".mldbg"
            calls = [
                (
                    "compare",
                    lambda: compare_answer(
                        home, a=str(made["ref"]), b=str(made["port"]), map=name_map
                    ),
                ),
                (
                    "weights",
                    lambda: audit_weights(
                        str(made["ref"]), str(made["port"]), map=name_map, home=home
                    ),
                ),
            ]
            _check(_drive(calls), name_map)

    example()


_rank_meta = st.fixed_dictionaries(
    {},
    optional={
        "rank": st.one_of(st.integers(-1, 4), _value),
        "world_size": st.one_of(st.integers(-1, 4), _value),
    },
)
_shards = st.one_of(
    st.dictionaries(
        st.sampled_from(
            ["*", "fc1#*.out*", "act#*", "fc2#*.in*", "fc2#*.out*", "fc1.*", "*.weight", "", "["]
        ),
        st.one_of(st.integers(-3, 3), st.just("sum"), _value),
        max_size=4,
    ),
    _value,
)


def test_fuzzed_rank_sets_and_shard_rules(made: dict[str, Path]) -> None:
    @FUZZ
    @given(
        ranks=st.lists(
            st.tuples(
                st.sampled_from(["tp@rank0", "tp@rank1", "tp@rank2", "tp@rank1-2", "tp@rankx"]),
                _rank_meta,
            ),
            min_size=1,
            max_size=4,
        ),
        shards=_shards,
    )
    def example(ranks: list[tuple[str, dict[str, Any]]], shards: Any) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp) / ".mldbg"
            for n, (name, meta) in enumerate(ranks):
                directory = home / "runs" / f"r{n}" / "captures" / name
                shutil.copytree(made["port"], directory)
                _rewrite(directory, [], meta)
            calls = [
                (
                    "compare ranks",
                    lambda: compare_answer(home, a=str(made["ref"]), b="tp@rank*", shards=shards),
                ),
                (
                    "weights ranks",
                    lambda: audit_weights(str(made["ref"]), "tp@rank*", shards=shards, home=home),
                ),
            ]
            _check(_drive(calls), (ranks, shards))

    example()
