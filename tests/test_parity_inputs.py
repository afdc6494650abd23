"""Bad input to the parity-at-scale verbs (capture options, compare, shards, weights): a
clear error code on every surface, nothing that hangs, crashes or reads outside a capture.

The captures are real (a tiny torch MLP, captured here); what is hostile is what a damaged
or hostile run store, a typo or an agent puts where a capture, a map or an option belongs:
a FIFO or ``/dev/zero`` where a file belongs (a read that blocks forever or never ends), JSON
nested too deep to parse, an index line that names a file outside its capture or a shape its
file does not hold, a ``capture.json`` of the wrong types, a byte budget of ``inf``.  Each
command runs as a subprocess (or over HTTP, or through the MCP client) with a timeout, so a
hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import mldbg
from conftest import Api, call
from mldbg.capture.budget import MAX_BUDGET, parse_size
from mldbg.capture.store import check_capture_name
from mldbg.capture_options import MAX_NAME, Spec
from mldbg.compare import CompareInputError
from mldbg.store import current_run, reading
from tiny_torch import MLP


def _capture(name: str, **options: Any) -> Path:
    """A capture of the MLP in a run of its own; its directory."""
    current_run.reset()
    torch.manual_seed(0)
    model = MLP()
    with torch.no_grad(), mldbg.capture(model, name, **options) as cap:
        model(torch.randn(3, 8))
    assert cap.path is not None and not cap.errors
    return cap.path


@pytest.fixture
def captures(home: Path) -> tuple[Path, Path]:
    return _capture("ref"), _capture("port")


def _copy(source: Path, to: Path) -> Path:
    shutil.copytree(source, to)
    return to


def _index(capture: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (capture / "index.jsonl").read_text().splitlines()]


def _write_index(capture: Path, records: list[dict[str, Any]]) -> None:
    (capture / "index.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _tensor_file(capture: Path) -> Path:
    """The first call's output file (fc1's), which compare reads."""
    line = next(r for r in _index(capture) if r.get("event") == "return" and r.get("file"))
    return capture / line["file"]


def _compare(home: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """``mldbg compare --json``: its exit code and answer; a hang fails, it does not stall."""
    result = subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", "--json", *args],
        env={**os.environ, "MLDBG_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.returncode, json.loads(result.stdout)


# -- special files where a capture's files belong ----------------------------------------------


@pytest.mark.parametrize("member", ["index.jsonl", "capture.json", "tensor"])
@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_fifo_or_device_in_a_capture_is_refused_not_read(
    captures: tuple[Path, Path], home: Path, tmp_path: Path, member: str, kind: str
) -> None:
    """A FIFO blocked ``open`` forever (the CLI, or a daemon worker with the agent's
    request); ``/dev/zero`` as ``capture.json`` was read until memory ran out."""
    ref, port = captures
    bad = _copy(port, tmp_path / f"bad-{member}-{kind}")
    target = _tensor_file(bad) if member == "tensor" else bad / member
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    code, answer = _compare(home, str(ref), str(bad))
    if member == "capture.json":  # the settings are lost, the tensors are not
        assert code == 0 and answer["ok"], answer
        assert any("capture.json is unreadable" in w for w in answer["warnings"]), answer
    else:
        assert code == 2 and answer["code"] == "unreadable", answer
        assert "not a regular file" in answer["error"] and target.name in answer["error"]


def test_a_special_file_named_as_a_source_or_map_is_refused(
    captures: tuple[Path, Path], home: Path, tmp_path: Path
) -> None:
    ref, port = captures
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    code, answer = _compare(home, str(ref), "/dev/zero")
    assert code == 2 and answer["code"] == "not_tensors"
    assert "not a regular file or a directory" in answer["error"]
    code, answer = _compare(home, str(ref), str(fifo))
    assert code == 2 and answer["code"] == "not_tensors"
    for special in (str(fifo), "/dev/zero"):
        code, answer = _compare(home, str(ref), str(port), "--map", special)
        assert code == 2 and answer["code"] == "bad_map", answer
        assert "cannot be read" in answer["error"] and "not a regular file" in answer["error"]


def test_reading_helpers_bound_what_they_read(tmp_path: Path) -> None:
    """One line past the limit is unreadable and skipped to its end; the next line reads."""
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b"x" * 5000 + b'\n{"b": 2}\n' + b"[" * 200_000 + b"\n")
    assert list(reading.lines(path, limit=1000)) == [b'{"a": 1}', None, b'{"b": 2}', None]
    with pytest.raises(ValueError, match="nested too deeply"):
        reading.loads("[" * 200_000 + "]" * 200_000)
    with pytest.raises(reading.FileTooLarge):
        reading.read_bytes(path, limit=100)
    with pytest.raises(reading.NotARegularFile):
        reading.read_bytes(Path("/dev/zero"))


# -- index.jsonl and capture.json that lie ---------------------------------------------------


def test_json_nested_too_deep_is_a_corrupt_line_or_file_not_a_crash(
    captures: tuple[Path, Path], home: Path, tmp_path: Path
) -> None:
    ref, port = captures
    deep_index = _copy(port, tmp_path / "deep-index")
    with open(deep_index / "index.jsonl", "a") as fh:
        fh.write("[" * 100_000 + "]" * 100_000 + "\n")
    code, answer = _compare(home, str(ref), str(deep_index))
    assert code == 0 and any("1 unreadable line" in w for w in answer["warnings"]), answer

    deep_header = _copy(port, tmp_path / "deep-header")
    raw = b"[" * 50_000 + b"]" * 50_000
    _tensor_file(deep_header).write_bytes(struct.pack("<Q", len(raw)) + raw)
    code, answer = _compare(home, str(ref), str(deep_header))
    assert code == 2 and answer["code"] == "corrupt_file", answer


def test_an_index_cannot_point_outside_its_capture(
    captures: tuple[Path, Path], home: Path, tmp_path: Path
) -> None:
    """``file`` is a name beside the index; ``../../…`` or ``/dev/zero`` made compare read
    whatever file it named."""
    ref, port = captures
    for n, file in enumerate(["../../../../../../etc/passwd", "/dev/zero", "sub/x.safetensors"]):
        bad = _copy(port, tmp_path / f"outside-{n}")
        records = _index(bad)
        for record in records:
            if record.get("file"):
                record["file"] = file
        _write_index(bad, records)
        code, answer = _compare(home, str(ref), str(bad))
        assert code == 2 and answer["code"] == "corrupt_capture", answer
        assert "not a file of the capture's own directory" in answer["error"]


@pytest.mark.parametrize(
    "lie",
    [
        {"shape": [10**12, 10**12]},  # the index claims a huge tensor
        {"shape": [3, 8], "dtype": "F64"},  # the same bytes, another shape and dtype
    ],
)
def test_an_index_that_disagrees_with_its_file_is_corrupt_not_a_divergence(
    captures: tuple[Path, Path], home: Path, tmp_path: Path, lie: dict[str, Any]
) -> None:
    """Before, the index's word was taken: "shapes differ" (a divergence, exit 1) or, where
    the file held another dtype, a traceback."""
    ref, port = captures
    bad = _copy(port, tmp_path / "liar")
    records = _index(bad)
    line = next(r for r in records if r.get("event") == "return" and r.get("tensors"))
    for info in line["tensors"].values():
        info.update(lie)
    _write_index(bad, records)
    code, answer = _compare(home, str(ref), str(bad))
    assert code == 2 and answer["code"] == "corrupt_file", answer
    assert "in the capture's index" in answer["error"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("seq", 1e400),  # JSON's 1e400 is inf: int() raised OverflowError
        ("seq", "x"),
        ("parent", {"a": 1}),
        ("depth", -2),
        ("tensors", [1, 2]),
        ("module", "m" * 5000),
    ],
)
def test_an_index_line_of_the_wrong_types_is_a_corrupt_capture(
    captures: tuple[Path, Path], home: Path, tmp_path: Path, field: str, value: Any
) -> None:
    ref, port = captures
    bad = _copy(port, tmp_path / "types")
    records = _index(bad)
    records[0][field] = value
    (bad / "index.jsonl").write_text(
        "".join(json.dumps(r, allow_nan=True) + "\n" for r in records).replace("Infinity", "1e400")
    )
    code, answer = _compare(home, str(ref), str(bad))
    assert code == 2 and answer["code"] == "corrupt_capture", answer
    assert len(answer["error"]) < 1000


def test_an_index_with_no_readable_line_is_a_corrupt_capture(
    captures: tuple[Path, Path], home: Path, tmp_path: Path
) -> None:
    ref, port = captures
    bad = _copy(port, tmp_path / "binary")
    (bad / "index.jsonl").write_bytes(b"\xff\xfe\x00garbage\n[1, 2]\n")
    code, answer = _compare(home, str(ref), str(bad))
    assert code == 2 and answer["code"] == "corrupt_capture" and "none of its 2" in answer["error"]


def test_one_damaged_capture_json_does_not_hide_the_others(
    captures: tuple[Path, Path], home: Path, api: Api
) -> None:
    """``created`` of another type made every listing's sort raise: ``captures`` answered
    ``internal`` and ``compare ref port`` by name failed for every capture in the store."""
    ref, port = captures
    broken = _copy(port, ref.parent / "broken")
    (broken / "capture.json").write_text(
        json.dumps({"name": "broken", "created": "yesterday", "state": {"a": 1}})
    )
    code, answer = _compare(home, "ref", "port")
    assert code == 0 and answer["ok"], answer
    listed = call(api.client, "captures", None, home=str(home))
    assert {"ref", "port", "broken"} <= {c["name"] for c in listed["captures"]}


# -- capture options -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "budget", [float("inf"), float("nan"), "9" * 400 + "TB", 1e30, "١٠MB", -1, "1e30", [1]]
)
def test_a_byte_budget_that_is_not_a_size_is_refused(budget: Any) -> None:
    with pytest.raises(ValueError, match="byte"):
        parse_size(budget)


def test_byte_budgets_that_are_sizes() -> None:
    assert parse_size("1.5GB") == 1_500_000_000
    assert parse_size(" 2GiB ") == 2 * 1024**3
    assert parse_size("0") == 0
    assert parse_size(MAX_BUDGET) == MAX_BUDGET


def test_capture_options_of_the_wrong_type_say_so(home: Path) -> None:
    model = MLP()
    with pytest.raises(TypeError, match="within takes a module path"):
        mldbg.capture(model, "x", within=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="include takes a glob pattern"):
        mldbg.capture(model, "x", include=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="depth takes a whole number"):
        mldbg.capture(model, "x", depth=True)
    with pytest.raises(ValueError, match="depth takes a whole number"):
        mldbg.capture(model, "x", depth=-1)
    with pytest.raises(ValueError) as refused:
        mldbg.capture(model, "x", within="y" * 100_000)
    assert len(str(refused.value)) < 1000  # the unknown path is quoted, not echoed whole


@pytest.mark.parametrize("name", ["ref\n", "ref\r", "../ref", "a" * 101, "re\x00f", ""])
def test_a_capture_name_with_a_control_character_or_path_is_refused(name: str) -> None:
    """``$`` matched before a final newline: ``"ref\\n"`` became a directory name."""
    with pytest.raises(ValueError, match="bad capture name"):
        check_capture_name(name)


def test_zero_edit_names_leave_room_for_their_suffixes() -> None:
    """NAME.2 … NAME.64 and @rankN are added to NAME: a 100-character NAME left every model
    after the first (and every torchrun rank) uncaptured, said only on the script's stderr."""
    assert Spec.parse({"name": "n" * MAX_NAME}).name == "n" * MAX_NAME
    check_capture_name("n" * MAX_NAME + ".64@rank99999")
    with pytest.raises(ValueError, match="at most"):
        Spec.parse({"name": "n" * (MAX_NAME + 1)})
    for option in ("depth", "calls"):  # True was taken as 1, then refused inside the script
        with pytest.raises(ValueError, match="whole number"):
            Spec.parse({"name": "x", option: True})


def test_start_refuses_bad_capture_options_with_bad_argument(api: Api, tmp_path: Path) -> None:
    """Over REST a 400-digit budget answered ``internal`` (OverflowError) and a name with
    a newline started a capture."""
    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    for options in (
        {"capture": "x", "capture_budget": "9" * 400},
        {"capture": "x", "capture_budget": "inf"},
        {"capture": "x\n"},
        {"capture": "n" * (MAX_NAME + 1)},
    ):
        body = {"script": str(script), "cwd": str(tmp_path), **options}
        refused = call(api.client, "start", "bad-capture", 400, **body)
        assert refused["code"] == "bad_argument", refused
    # Each pattern within its limit, together too long for $MLDBG_CAPTURE: execve refused
    # the start with "Argument list too long", said of the interpreter.
    body = {"script": str(script), "capture": "x", "capture_ops": ["a" * 4000] * 100}
    refused = call(api.client, "start", "bad-capture", 400, **body)
    assert refused["code"] == "too_long" and "MLDBG_CAPTURE" in refused["error"], refused


# -- shards ----------------------------------------------------------------------------------


@pytest.fixture
def ranks(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two "ranks" of the same model (RANK/WORLD_SIZE set: captured as tp@rank0/1), full
    and in summary; and the one-process reference."""
    ref = _capture("ref")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        _capture("tp")
        _capture("sum", mode="summary")
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    return ref


@pytest.mark.parametrize("dim", [5, -5, 10**23])
def test_a_shard_dimension_the_tensor_lacks_is_bad_shards(
    ranks: Path, home: Path, dim: int
) -> None:
    """numpy's AxisError / OverflowError escaped as a traceback; a dimension past the rank
    was also taken modulo the rank for the shape, then concatenated along another axis."""
    with pytest.raises(CompareInputError, match="no dimension") as refused:
        mldbg.compare("ref", "tp@rank*", shards={"fc1#*": dim}, home=home)
    assert refused.value.code == "bad_shards"
    code, answer = _compare(home, "ref", "tp@rank*", "--shards", f"fc1#*={dim}")
    assert code == 2 and answer["code"] == "bad_shards"


def test_summary_ranks_gather_by_their_statistics_never_their_sketches(
    ranks: Path, home: Path
) -> None:
    """A summary file holds a sketch, and two ranks' sketches joined are no tensor's: the
    gathered entry carries the statistics the slices make together, and compare reads
    those (a lower bound), not the files."""
    result = mldbg.compare("ref", "sum@rank*", shards={"fc1#*.out*": -1}, home=home)
    (gathered,) = [e for e in result.entries if e["name"] == "fc1#0.out"]
    assert gathered["shape_b"][-1] == 2 * gathered["shape_a"][-1]  # both ranks' slices
    assert "gathered" not in (gathered.get("error") or "")


def test_ranks_whose_slices_disagree_in_shape_are_bad_shards(
    ranks: Path, home: Path, tmp_path: Path
) -> None:
    rank1 = next(home.glob("runs/*/captures/tp@rank1"))
    records = _index(rank1)
    call = next(r for r in records if r.get("event") == "call" and r.get("module") == "fc1")
    ret = next(r for r in records if r.get("event") == "return" and r["seq"] == call["seq"])
    for info in ret["tensors"].values():
        info["shape"] = [4, 12]
    _write_index(rank1, records)
    with pytest.raises(CompareInputError, match="differ in shape outside dimension 0"):
        mldbg.compare("ref", "tp@rank*", shards={"fc1#*.out*": 0}, home=home)


# -- weights and the other surfaces ------------------------------------------------------------


def test_weights_answers_compare_codes_for_corrupt_files(
    captures: tuple[Path, Path], home: Path, tmp_path: Path, api: Api
) -> None:
    ref, _ = captures
    good = _tensor_file(ref)
    liar = tmp_path / "liar.safetensors"
    header_length = struct.unpack("<Q", good.read_bytes()[:8])[0]
    header = json.loads(good.read_bytes()[8 : 8 + header_length])
    key = next(k for k in header if k != "__metadata__")
    header[key]["data_offsets"] = ["a", "b"]
    raw = json.dumps(header).encode()
    liar.write_bytes(struct.pack("<Q", len(raw)) + raw + good.read_bytes()[8 + header_length :])
    answer = call(
        api.client, "weights", None, 400, reference=str(good), port=str(liar), home=str(home)
    )
    assert answer["code"] == "corrupt_file" and "data offsets" in answer["error"], answer
    fifo = tmp_path / "p.safetensors"
    os.mkfifo(fifo)
    answer = call(
        api.client, "weights", None, 400, reference=str(good), port=str(fifo), home=str(home)
    )
    assert answer["code"] == "not_tensors", answer


def test_a_fifo_capture_over_rest_and_mcp_answers_a_code(
    captures: tuple[Path, Path], home: Path, tmp_path: Path, api: Api, config_dir: Path
) -> None:
    """The daemon's worker blocked on the FIFO: the REST request never answered."""
    from test_mcp import run_mcp

    ref, port = captures
    bad = _copy(port, tmp_path / "fifo-capture")
    (bad / "index.jsonl").unlink()
    os.mkfifo(bad / "index.jsonl")
    answer = call(api.client, "compare", None, 400, a=str(ref), b=str(bad), home=str(home))
    assert answer["code"] == "unreadable" and "a FIFO" in answer["error"], answer

    async def scenario(tool: Any, client: Any) -> None:
        error = await tool.error("compare", a=str(ref), b=str(bad), home=str(home))
        assert error["code"] == "unreadable" and "a FIFO" in error["error"]
        # arguments of the wrong type: the SDK's validation, said with mldbg's code (it
        # was pydantic's text and a URL, no code)
        for arguments, name in (
            ({"shards": ["x"]}, "shards"),
            ({"map": 5}, "map"),
            ({"layout": "XYZ"}, "layout"),
            ({"limit": -1}, "limit"),
        ):
            wrong = await tool.error("compare", a=str(ref), b=str(port), **arguments)
            assert wrong["code"] == "bad_argument" and wrong["argument"] == name, wrong
            assert "pydantic.dev" not in wrong["error"]

    run_mcp(config_dir, tmp_path, scenario)


# -- files compare writes: --html, --propose-map ------------------------------------------------


def test_a_report_replaces_only_an_earlier_report(
    captures: tuple[Path, Path], home: Path, tmp_path: Path, api: Api
) -> None:
    """The report was renamed over whatever the path named: as root ``--html /dev/full``
    turned the device into a file, a FIFO was removed, and a typo replaced any file; a
    missing directory answered ``internal`` over REST, after the whole comparison."""
    ref, port = captures
    fifo = tmp_path / "fifo.html"
    os.mkfifo(fifo)
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    for target, why in (
        (fifo, "not a regular file"),
        (notes, "not written by mldbg"),
        (tmp_path / "no-such-dir" / "r.html", "directory does not exist"),
    ):
        code, answer = _compare(home, str(ref), str(port), "--html", str(target))
        assert code == 2 and answer["code"] == "bad_argument" and why in answer["error"], answer
        refused = call(
            api.client,
            "compare",
            None,
            400,
            a=str(ref),
            b=str(port),
            html=str(target),
            home=str(home),
        )
        assert refused["code"] == "bad_argument" and why in refused["error"], refused
    assert fifo.is_fifo() and notes.read_text() == "my notes\n"
    report = tmp_path / "report.html"
    for _ in range(2):  # a second report replaces the first
        code, _answer = _compare(home, str(ref), str(port), "--html", str(report))
        assert code == 0 and report.read_text().startswith("<!DOCTYPE html>")
    assert report.stat().st_mode & 0o077 == 0  # it holds tensor values: private, as captures


def test_a_proposed_map_is_not_written_into_a_fifo(
    captures: tuple[Path, Path], home: Path, tmp_path: Path
) -> None:
    """``--propose-map FIFO`` blocked forever opening the FIFO to write."""
    ref, _ = captures

    class Renamed(torch.nn.Module):  # the same model, its layers named otherwise
        def __init__(self) -> None:
            super().__init__()
            self.up = torch.nn.Linear(8, 16)
            self.gelu = torch.nn.GELU()
            self.down = torch.nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.down(self.gelu(self.up(x)))

    current_run.reset()
    model = Renamed()
    with torch.no_grad(), mldbg.capture(model, "renamed") as cap:
        model(torch.randn(3, 8))
    written = tmp_path / "proposed.json"
    code, answer = _compare(home, str(ref), str(cap.path), "--propose-map", str(written))
    assert json.loads(written.read_text()), answer  # a map was proposed, and written
    fifo = tmp_path / "map.json"
    os.mkfifo(fifo)
    code, answer = _compare(home, str(ref), str(cap.path), "--propose-map", str(fifo))
    assert code == 2 and answer["code"] == "bad_argument" and fifo.is_fifo(), answer
    assert "not a regular file" in answer["error"]


def test_the_narrow_hint_is_a_command_a_shell_runs_as_written(home: Path) -> None:
    """The culprit ``<root>`` was written unquoted: ``--capture-within <root>`` is a shell
    redirection from a file named ``root``; a module path from an index is quoted too."""
    import shlex

    class Scaled(MLP):  # the model's own inline work (a scale) is what the port got wrong
        def __init__(self, scale: float) -> None:
            super().__init__()
            self.scale = scale

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * self.scale

    def coarse(name: str, bug: bool) -> None:
        current_run.reset()
        torch.manual_seed(0)
        model = Scaled(3.0 if bug else 1.0)
        with torch.no_grad(), mldbg.capture(model, name, mode="summary"):
            model(torch.randn(3, 8))

    coarse("coarse-ref", bug=False)
    coarse("coarse-bug", bug=True)
    result = mldbg.compare("coarse-ref", "coarse-bug", home=home).result
    assert result["first_divergence"]["module"] == "<root>"
    from mldbg import verbs

    command = verbs.word(result["narrow"]["calls"][0], "cli")
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)  # "<" as a shell reads it
    lexer.whitespace_split = True
    words = list(lexer)
    assert words[words.index("--capture-within") + 1] == "<root>", command


@pytest.mark.parametrize("framework", ["torch", "mlx"])
def test_captured_tensor_checks_the_file_before_the_framework_reads_it(
    captures: tuple[Path, Path], tmp_path: Path, framework: str
) -> None:
    """torch's ``safe_open`` and ``mx.load`` blocked forever on a FIFO, and answered in
    their own words for a file that holds another tensor than the index says."""
    pytest.importorskip(framework if framework == "torch" else "mlx.core")
    _, port = captures
    fifo = _copy(port, tmp_path / "fifo")
    target = _tensor_file(fifo)
    target.unlink()
    os.mkfifo(target)
    liar = _copy(port, tmp_path / "liar")
    records = _index(liar)
    line = next(r for r in records if r.get("event") == "return" and r.get("tensors"))
    for info in line["tensors"].values():
        info.update({"shape": [3, 8], "dtype": "F64"})  # the same bytes, told otherwise
    _write_index(liar, records)
    code = (
        "import sys, mldbg\n"
        "try:\n"
        f"    mldbg.captured_tensor(sys.argv[1], 'fc1#0.out', to={framework!r})\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    for capture, expected in ((fifo, "NotARegularFile"), (liar, "CorruptTensorFile")):
        result = subprocess.run(
            [sys.executable, "-c", code, str(capture)], capture_output=True, text=True, timeout=120
        )
        assert result.stdout.startswith(expected), result.stdout + result.stderr[-2000:]


def test_nonfinite_reads_a_summary_capture_by_its_statistics(home: Path) -> None:
    """A summary's file holds a sketch, in which NaN/Inf were taken as 0: ``nonfinite`` on
    a summary capture answered ``first: null`` whatever the model computed."""

    class Sqrt(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.sqrt(x)  # NaN for every negative input

    class Net(MLP):
        def __init__(self) -> None:
            super().__init__()
            self.root = Sqrt()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.root(self.fc1(x)))

    for mode in ("full", "summary"):
        current_run.reset()
        torch.manual_seed(0)
        model = Net()
        with torch.no_grad(), mldbg.capture(model, f"nan-{mode}", mode=mode):
            model(torch.randn(3, 8))
        found = mldbg.first_nonfinite(f"nan-{mode}", home=home)
        assert found["first"] is not None and found["first"]["module"] == "root", (mode, found)
        assert found["first"]["entries"][0]["nan"] > 0


def test_nonfinite_answers_compare_codes_for_a_lying_file(
    captures: tuple[Path, Path], home: Path, tmp_path: Path, api: Api
) -> None:
    _, port = captures
    liar = _copy(port, tmp_path / "liar")
    records = _index(liar)
    line = next(r for r in records if r.get("event") == "return" and r.get("tensors"))
    for info in line["tensors"].values():
        info["shape"] = [10**12]
    _write_index(liar, records)
    answer = call(api.client, "nonfinite", None, 400, source=str(liar), home=str(home))
    assert answer["code"] == "corrupt_file", answer


@pytest.mark.parametrize(
    "lie, code",
    [
        ({"norm": 1e400}, "corrupt_capture"),  # inf: printed as non-JSON, a traceback
        ({"rms": "x"}, "corrupt_capture"),  # was "nothing comparable"
        ({"norm": -1.0}, "corrupt_capture"),  # was compared as if it were a norm
        ({"numel": 10**30}, "corrupt_capture"),  # another tensor's statistics
        ({"sketch": 5}, "corrupt_file"),  # the file holds a sketch of another length
    ],
)
def test_a_summary_whose_statistics_lie_is_corrupt(
    home: Path, tmp_path: Path, lie: dict[str, Any], code: str
) -> None:
    ref = _capture("summary-ref", mode="summary")
    port = _copy(_capture("summary-port", mode="summary"), tmp_path / "summary-liar")
    records = _index(port)
    for record in records:
        for info in (record.get("tensors") or {}).values():
            if "sketch" in lie:
                info.update(lie)
            else:
                info["stats"].update(lie)
    (port / "index.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in records).replace("Infinity", "1e400")
    )
    for a, b in ((ref, port), (port, ref)):
        exit_code, answer = _compare(home, str(a), str(b))
        assert exit_code == 2 and answer["code"] == code, answer


def test_a_capture_whose_budget_wrote_nothing_says_so(
    captures: tuple[Path, Path], home: Path
) -> None:
    """``budget=0`` (or one the first call used up) writes no tensor: compare said only
    "has no tensors to compare", as of an empty capture."""
    ref, _ = captures
    empty = _capture("nothing", budget="0")
    code, answer = _compare(home, str(empty), str(ref))
    assert code == 2 and answer["code"] == "nothing_paired", answer
    assert "not written" in answer["error"] and "over the byte budget" in answer["error"]
    partial = _capture("partial", budget=200)  # the first call's inputs fit, no more
    code, answer = _compare(home, str(ref), str(partial))
    assert any("not written" in w and "byte budget" in w for w in answer["warnings"]), answer


def test_names_from_a_capture_cannot_drive_the_terminal(
    captures: tuple[Path, Path], home: Path, tmp_path: Path, cli: Any
) -> None:
    """A capture directory (or an index's entry name) holding a newline or an ESC
    sequence was printed raw: the row broke in two and the terminal took the sequence."""
    ref, port = captures
    hostile = "evil\n\x1b[2J\x07"
    shutil.copytree(port, ref.parent / hostile)
    (ref.parent / hostile / "capture.json").unlink()  # named by its directory
    shown = cli("captures", "--home", str(home)).stdout
    assert "\x1b" not in shown and "\x07" not in shown
    assert "evil\\n\\x1b[2J\\x07" in shown
    renamed = _copy(port, tmp_path / "renamed-entry")
    records = _index(renamed)
    for record in records:
        record["tensors"] = {
            (k.replace("fc1", hostile) if k.startswith("fc1") else k): v
            for k, v in (record.get("tensors") or {}).items()
        }
    _write_index(renamed, records)
    result = subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", str(ref), str(renamed)],
        env={**os.environ, "MLDBG_HOME": str(home), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "evil\\n" in result.stdout and "\x1b" not in result.stdout + result.stderr


def test_a_capture_answers_to_its_directorys_name_not_its_claim(
    captures: tuple[Path, Path], home: Path
) -> None:
    """``compare ref`` took the newest capture whose capture.json *said* "ref": a copied
    capture, or one claiming the name with a later ``created``, answered instead."""
    ref, port = captures
    impostor = _copy(port, ref.parent / "impostor")
    meta = json.loads((impostor / "capture.json").read_text())
    meta.update(name="ref", created=meta["created"] + 1e6)
    (impostor / "capture.json").write_text(json.dumps(meta))
    found = mldbg.compare("ref", "port", home=home)
    assert found.result["a"]["path"] == str(ref)
    from mldbg.compare.read.sources import find_captures

    assert "impostor" in {c["name"] for c in find_captures(home)}


def test_a_directory_too_large_to_be_tensors_is_refused(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compare ~ ~`` walked the whole tree; past the limit it is refused, not walked."""
    from safetensors.torch import save_file

    from mldbg.compare.read import sources

    tree = tmp_path / "tree"
    for i in range(6):
        (tree / f"d{i}").mkdir(parents=True)
        save_file({"x": torch.zeros(2)}, str(tree / f"d{i}" / "t.safetensors"))
    assert mldbg.compare(str(tree), str(tree), home=home).ok
    monkeypatch.setattr(sources, "MAX_DIRECTORY_ENTRIES", 10)
    with pytest.raises(CompareInputError, match="more than 10 files") as refused:
        mldbg.compare(str(tree), str(tree), home=home)
    assert refused.value.code == "too_large"


@pytest.mark.parametrize("compression", ["stored", "deflated"])
def test_an_npz_member_whose_header_claims_a_huge_shape_is_corrupt(
    tmp_path: Path, home: Path, compression: str
) -> None:
    """Its element count overflowed int64 (np.prod): a ValueError traceback from reshape
    or ``np.empty`` instead of a corrupt file."""
    import io
    import zipfile

    import numpy as np

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": (2**62, 4)}
    )
    path = tmp_path / "huge.npz"
    method = zipfile.ZIP_STORED if compression == "stored" else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w", compression=method) as archive:
        archive.writestr("x.npy", header.getvalue() + b"\0" * 64)
    code, answer = _compare(home, str(path), str(path))
    assert code == 2 and answer["code"] == "corrupt_file" and "huge.npz:x" in answer["error"]


def test_an_ops_pattern_that_matches_no_module_is_said(home: Path) -> None:
    """``ops="fc9"`` (a typo) recorded no operation and said nothing."""
    with pytest.warns(RuntimeWarning, match=r"ops 'fc9' match\(es\) no module"):
        path = _capture("typo", ops=["fc9", "fc1"])
    meta = json.loads((path / "capture.json").read_text())
    assert meta["ops_unmatched"] == ["fc9"]
