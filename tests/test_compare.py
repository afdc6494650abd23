"""mldbg compare on directories, files and captures: pairing, exit codes, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import mldbg
from mldbg.store import current_run


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MLDBG_HOME": str(cwd / "store"), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "mldbg", "compare", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def as_json(result: subprocess.CompletedProcess[str]) -> dict:
    try:
        return json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"not JSON: {result.stdout!r} {result.stderr!r}") from None


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for i in range(12):
        value = rng.standard_normal((4, 5)).astype(np.float32)
        np.save(a / f"step{i}.npy", value)
        np.save(b / f"step{i}.npy", value + np.float32(1e-7) * (i % 2))
    return a, b


def test_directories_that_agree_exit_0(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    result = run_cli(tmp_path, str(dirs[0]), str(dirs[1]), "--json", "--all")
    assert result.returncode == 0, result.stdout + result.stderr
    data = as_json(result)
    assert data["ok"] and data["first_divergence"] is None
    # natural order: step2 comes before step10
    names = [e["name"] for e in data["entries"]]
    assert names[:3] == ["step0", "step1", "step2"] and names[-1] == "step11"
    entry = data["entries"][1]
    assert entry["dtype_a"] == "F32" and entry["rtol"] == pytest.approx(1.3e-6)
    for key in ("shape_a", "shape_b", "max_abs", "mean_abs", "max_rel", "cosine", "ok"):
        assert key in entry


def test_first_diverging_entry_and_unpaired(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    a, b = dirs
    np.save(b / "step7.npy", np.load(a / "step7.npy") * 1.01)
    np.save(b / "step9.npy", np.load(a / "step9.npy") + 1)
    np.save(b / "extra.npy", np.zeros(3, np.float32))
    (a / "step11.npy").rename(a / "only_a.npy")
    result = run_cli(tmp_path, str(a), str(b), "--json", "--all")
    assert result.returncode == 1, result.stdout + result.stderr
    data = as_json(result)
    assert not data["ok"]
    assert data["first_divergence"]["name"] == "step7"
    assert data["unpaired_a"] == ["only_a"] and sorted(data["unpaired_b"]) == ["extra", "step11"]
    bad = {e["name"] for e in data["entries"] if not e["ok"]}
    assert bad == {"step7", "step9"}
    step9 = next(e for e in data["entries"] if e["name"] == "step9")
    assert step9["max_abs"] == pytest.approx(1.0, rel=1e-6)
    assert step9["min_atol"] == pytest.approx(1.0, rel=1e-3)
    # A loose tolerance makes the 1% difference pass but not the +1.
    loose = as_json(run_cli(tmp_path, str(a), str(b), "--json", "--rtol", "0.02", "--atol", "0"))
    assert loose["first_divergence"]["name"] == "step9"
    human = run_cli(tmp_path, str(a), str(b))
    assert human.returncode == 1
    assert "first divergence: step7" in human.stdout and "only in B" in human.stdout


def test_two_single_tensors_pair_whatever_their_names(tmp_path: Path) -> None:
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.save(tmp_path / "ours.npy", x)
    np.save(tmp_path / "theirs.npy", x)
    result = run_cli(tmp_path, "ours.npy", "theirs.npy", "--json", "--all")
    assert result.returncode == 0, result.stdout + result.stderr
    assert as_json(result)["entries"][0]["name_b"] == "theirs"


def test_channels_last_is_compared_after_the_transpose(tmp_path: Path) -> None:
    nchw = np.random.default_rng(1).standard_normal((2, 3, 5, 7)).astype(np.float32)
    np.save(tmp_path / "torch.npy", nchw)
    np.save(tmp_path / "mlx.npy", nchw.transpose(0, 2, 3, 1).copy())
    data = as_json(run_cli(tmp_path, "torch.npy", "mlx.npy", "--json", "--all"))
    (entry,) = data["entries"]
    assert data["ok"] and entry["layout"] == "NHWC→NCHW" and entry["transpose"] == [0, 3, 1, 2]
    assert entry["max_abs"] == 0.0


def test_mismatched_shapes_with_nothing_else_is_bad_input(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((3, 4), np.float32))
    np.save(tmp_path / "y.npy", np.zeros((3, 5), np.float32))
    result = run_cli(tmp_path, "x.npy", "y.npy")
    assert result.returncode == 2
    assert "shapes differ: [3, 4] vs [3, 5]" in result.stdout + result.stderr


def test_shape_mismatch_among_others_is_a_divergence(
    tmp_path: Path, dirs: tuple[Path, Path]
) -> None:
    a, b = dirs
    np.save(b / "step3.npy", np.zeros((4, 6), np.float32))
    data = as_json(run_cli(tmp_path, str(a), str(b), "--json", "--all"))
    assert data["first_divergence"]["name"] == "step3"
    step3 = next(e for e in data["entries"] if e["name"] == "step3")
    assert step3["error"].startswith("shapes differ") and step3["max_abs"] is None


def test_bf16_from_torch_and_mlx_tensor_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlx.core as mx

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / "store"))
    values = torch.randn(64, 8).to(torch.bfloat16)
    mldbg.debug_save(values, "h")
    port = tmp_path / "port"
    port.mkdir()
    mx.save_safetensors(
        str(port / "h.safetensors"),
        {"tensor": mx.array(values.float().numpy()).astype(mx.bfloat16)},
    )
    data = as_json(
        run_cli(tmp_path, str(tmp_path / "store" / "tensors"), str(port), "--json", "--all")
    )
    (entry,) = data["entries"]
    assert data["ok"] and entry["dtype_a"] == entry["dtype_b"] == "BF16"
    assert entry["max_abs"] == 0.0 and entry["rtol"] == pytest.approx(1.6e-2)


def test_missing_capture_lists_the_known_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / "store"))
    current_run.reset()
    net = torch.nn.Linear(2, 2)
    with mldbg.capture(net, "reference"):
        net(torch.ones(1, 2))
    current_run.reset()
    result = run_cli(tmp_path, "reference", "nonesuch", "--json")
    assert result.returncode == 2
    error = as_json(result)
    assert "nonesuch" in error["error"] and "reference" in error["error"]
    assert error["code"] == "unknown_source"
    human = run_cli(tmp_path, "referenc", "reference")
    assert human.returncode == 2 and "captures under" in human.stdout + human.stderr


def test_a_missing_capture_among_many_lists_the_closest_and_says_how_many_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline run makes NAME, NAME.2, ... NAME.5 per script: the listing was the first
    20 names in alphabetical order (other runs' captures, not ``port.5``) and never said
    that more were left out."""
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / "store"))
    current_run.reset()
    net = torch.nn.Linear(2, 2)
    for name in [f"aa{i}" for i in range(30)] + ["port", "port.2", "port.5"]:
        with mldbg.capture(net, name):
            net(torch.ones(1, 2))
    current_run.reset()
    with pytest.raises(mldbg.CompareInputError) as raised:
        mldbg.compare("port.6", "port")
    error = raised.value.to_json()
    assert error["captures"][:3] == ["port.5", "port.2", "port"]
    assert error["captures_total"] == 33
    assert "closest first: port.5, port.2, port," in str(error["error"])
    assert "and 13 more (mldbg captures)" in str(error["error"])


def test_corrupt_files_are_named(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    a, b = dirs
    (b / "step4.npy").write_bytes(b"not numpy at all")
    result = run_cli(tmp_path, str(a), str(b))
    assert result.returncode == 2
    assert "step4.npy" in result.stdout + result.stderr
    good = tmp_path / "good.safetensors"
    from safetensors.numpy import save_file

    save_file({"w": np.ones((100, 100), np.float32)}, str(good))
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:5000])
    result = run_cli(tmp_path, str(good), str(cut), "--json")
    assert result.returncode == 2
    assert "cut.safetensors" in as_json(result)["error"]


def test_a_header_that_lies_is_bad_input_not_a_divergence(tmp_path: Path) -> None:
    """A header whose shape does not match its bytes, or whose dtype the format does not
    define, is a corrupt file (exit 2), not "shapes differ" (exit 1)."""
    import struct

    def write(name: str, y: dict) -> Path:
        header = {"x": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, "y": y}
        raw = json.dumps(header).encode()
        path = tmp_path / name
        data = np.arange(12, dtype=np.float32).tobytes()
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
        return path

    good = write("good.safetensors", {"dtype": "F32", "shape": [2, 3], "data_offsets": [24, 48]})
    liar = write("liar.safetensors", {"dtype": "F32", "shape": [4, 3], "data_offsets": [24, 48]})
    alien = write("alien.safetensors", {"dtype": "Q7", "shape": [2, 3], "data_offsets": [24, 48]})
    assert run_cli(tmp_path, str(good), str(good)).returncode == 0
    for bad, said in ((liar, "not the 48"), (alien, "unknown dtype")):
        result = run_cli(tmp_path, str(good), str(bad), "--json")
        assert result.returncode == 2, result.stdout + result.stderr
        assert said in as_json(result)["error"] and bad.name in as_json(result)["error"]


def test_map_files_rename_and_bad_maps_are_bad_input(
    tmp_path: Path, dirs: tuple[Path, Path]
) -> None:
    a, b = dirs
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for file in b.iterdir():
        (renamed / file.name.replace("step", "iter_")).write_bytes(file.read_bytes())
    no_map = run_cli(tmp_path, str(a), str(renamed))
    assert no_map.returncode == 2 and "--map" in no_map.stdout + no_map.stderr
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"regex": [["^iter_", "step"]], "ignore": ["step1?"]}))
    data = as_json(
        run_cli(tmp_path, str(a), str(renamed), "--map", str(mapping), "--json", "--all")
    )
    assert data["ok"] and len(data["entries"]) == 10 and data["entries"][0]["name_b"] == "iter_0"
    for bad in (
        '{"regex": [["(", "x"]]}',
        '{"regex": [["^(iter)_", "\\\\9"]]}',  # a group the pattern lacks: found on use
        '{"regex": 5}',
        '{"ignore": 5}',
        '{"rename": 3}',
        "[1, 2",
        "[]",
        '{"colour": {}}',
    ):
        mapping.write_text(bad)
        result = run_cli(tmp_path, str(a), str(renamed), "--map", str(mapping))
        assert result.returncode == 2, bad
        assert "map" in (result.stdout + result.stderr).lower()
    assert run_cli(tmp_path, str(a), str(b), "--map", "missing.json").returncode == 2
    assert run_cli(tmp_path, str(a), str(b), "--rtol", "-1").returncode == 2
    infinite = run_cli(tmp_path, str(a), str(b), "--atol", "inf", "--json")
    assert infinite.returncode == 2 and as_json(infinite)["code"] == "bad_tolerance"
    assert run_cli(tmp_path, str(a)).returncode == 2  # argparse: B missing


def test_a_dtype_without_metrics_is_an_entry_error_not_a_crash(
    tmp_path: Path, dirs: tuple[Path, Path]
) -> None:
    a, b = dirs
    for side in (a, b):
        np.save(side / "spectrum.npy", np.ones(3, np.complex64))
    data = as_json(run_cli(tmp_path, str(a), str(b), "--json", "--all"))
    entry = next(e for e in data["entries"] if e["name"] == "spectrum")
    assert entry["ok"] is False and "complex" in entry["error"]
    assert sum(1 for e in data["entries"] if e["ok"]) == 12
    only = tmp_path / "only"
    only.mkdir()
    np.save(only / "spectrum.npy", np.ones(3, np.complex64))
    result = run_cli(tmp_path, str(only), str(only), "--json")
    assert result.returncode == 2 and "complex" in as_json(result)["error"]


def test_a_map_that_merges_two_names_is_refused(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    """Two of B's tensors mapped onto one name would hide one of them: bad input, named."""
    a, b = dirs
    np.save(b / "extra.npy", np.zeros((4, 5), np.float32))
    with pytest.raises(mldbg.CompareInputError, match="'extra'.*'step0'|'step0'.*'extra'") as err:
        mldbg.compare(a, b, map={"regex": [["^extra$", "step0"]]})
    assert err.value.code == "bad_map"


def test_only_inputs_differing_is_said_plainly(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / "store"))
    current_run.reset()

    class Gate(torch.nn.Module):
        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return x * 2  # the mask is ignored: outputs agree whatever it holds

    gate = Gate()
    with mldbg.capture(gate, "one"):
        gate(torch.ones(3), mask=torch.zeros(3))
    with mldbg.capture(gate, "two"):
        gate(torch.ones(3), mask=torch.ones(3))
    current_run.reset()
    comparison = mldbg.compare("one", "two")
    assert not comparison.ok
    culprit = comparison.first_divergence
    assert culprit["name"] == "<root>#0.in.mask"
    assert culprit["reason"].startswith("outputs agree, only inputs differ")


def test_npz_members_are_mapped_and_compressed_ones_read(tmp_path: Path) -> None:
    from mldbg.compare.read import arrays

    big = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    np.savez(tmp_path / "plain.npz", x=big, f=np.asfortranarray(big), empty=np.zeros((0, 2)))
    np.savez_compressed(tmp_path / "packed.npz", x=big, f=np.asfortranarray(big))
    headers = arrays.npz_headers(tmp_path / "plain.npz")
    assert headers["x"] == {"shape": [3, 4, 5], "dtype": "F32"}
    assert isinstance(arrays.map_npz(tmp_path / "plain.npz", "x"), np.memmap)
    for name in ("plain.npz", "packed.npz"):
        for key in ("x", "f"):
            np.testing.assert_array_equal(arrays.map_npz(tmp_path / name, key), big)
    result = mldbg.compare(tmp_path / "plain.npz", tmp_path / "packed.npz").result
    assert result["ok"] and {e["name"] for e in result["entries"]} == {"x", "f"}
    (tmp_path / "broken.npz").write_bytes((tmp_path / "plain.npz").read_bytes()[:300])
    with pytest.raises(mldbg.CompareInputError, match="broken.npz") as err:
        mldbg.compare(tmp_path / "plain.npz", tmp_path / "broken.npz")
    assert err.value.code == "corrupt_file"


def test_a_dtype_numpy_lacks_is_an_entry_error(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    """A well-formed safetensors file in a dtype numpy cannot map (F4, two elements a
    byte) is not corrupt: that entry says so, the others compare."""
    a, b = dirs
    header = json.dumps({"scale": {"dtype": "F4", "shape": [8], "data_offsets": [0, 4]}})
    blob = len(header).to_bytes(8, "little") + header.encode() + bytes([127, 127, 128, 126])
    for side in (a, b):
        (side / "scale.safetensors").write_bytes(blob)
    result = mldbg.compare(a, b).result
    entry = next(e for e in result["entries"] if e["name"] == "scale")
    assert not entry["ok"] and "F4" in entry["error"]
    assert result["counts"]["passed"] == 12


def test_an_ml_dtypes_format_compares(tmp_path: Path, dirs: tuple[Path, Path]) -> None:
    """F8_E8M0 (MX scales) has no numpy dtype but ml_dtypes has: it compares."""
    a, b = dirs
    header = json.dumps({"scale": {"dtype": "F8_E8M0", "shape": [4], "data_offsets": [0, 4]}})
    blob = len(header).to_bytes(8, "little") + header.encode() + bytes([127, 127, 128, 126])
    for side in (a, b):
        (side / "scale.safetensors").write_bytes(blob)
    result = mldbg.compare(a, b).result
    entry = next(e for e in result["entries"] if e["name"] == "scale")
    assert entry["ok"] and not entry["error"] and entry["dtype_a"] == "F8_E8M0"
    assert result["counts"]["passed"] == 13


def test_a_folder_named_like_a_capture_does_not_hide_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / "store"))
    monkeypatch.chdir(tmp_path)
    current_run.reset()
    net = torch.nn.Linear(2, 2)
    with mldbg.capture(net, "ref"):
        net(torch.ones(1, 2))
    current_run.reset()
    (tmp_path / "ref").mkdir()  # e.g. the reference repository's checkout
    result = run_cli(tmp_path, "ref", "ref", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert any("compared the capture 'ref'" in w for w in as_json(result)["warnings"])
    listed = subprocess.run(
        [sys.executable, "-m", "mldbg", "captures"],
        cwd=tmp_path,
        env={**os.environ, "MLDBG_HOME": str(tmp_path / "store")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    run_id = next(iter(mldbg.compare("ref", "ref").result["a"]["label"].split("run ")[1:]))
    assert run_id.rstrip(")") in listed.stdout  # piped: the whole run id, copyable


def test_a_nan_only_divergence_is_shown_as_such(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    np.save(a / "h.npy", np.array([1.0, 2.0, 3.0], np.float32))
    np.save(b / "h.npy", np.array([1.0, np.nan, 3.0], np.float32))
    np.save(a / "k.npy", np.ones(2, np.float32))
    np.save(b / "k.npy", np.ones(2, np.float32))
    report = tmp_path / "r.html"
    human = run_cli(tmp_path, str(a), str(b), "--html", str(report))
    assert human.returncode == 1
    assert "1/3 (1 NaN/Inf)" in human.stdout
    data = as_json(run_cli(tmp_path, str(a), str(b), "--json"))
    entry = data["entries"][0]
    assert entry["nonfinite_mismatched"] == 1 and entry["min_atol"] is None
    assert data["first_divergence"]["name"] == "h"
    assert "1 NaN/Inf" in report.read_text()


def test_the_compare_answer_bounds_every_list_an_agent_receives() -> None:
    """REST/MCP compare answers: a port that moves the residual out of 300 blocks has 300
    boundary differences; the answer carries the first ones and the count, and cut
    warnings, never the whole lists."""
    from mldbg.compare.report.answer import LISTS_SHOWN, bounded

    boundaries = [{"name": f"blocks.{i}#0", "note": "x2.000"} for i in range(300)]
    result = {
        "ok": True,
        "entries": [],
        "boundary_differences": boundaries,
        "warnings": ["w" * 100_000] * 40,
        "unpaired_a": [],
        "unpaired_b": [],
    }
    answer = bounded(result, passing=False, inputs=False, offset=0, limit=20)
    assert len(answer["boundary_differences"]) == LISTS_SHOWN["boundary_differences"]
    assert answer["boundary_differences_count"] == 300 and answer["truncated"]
    assert answer["warnings_count"] == 40
    assert len(json.dumps(answer)) < 100_000
    small = bounded(
        {**result, "boundary_differences": boundaries[:3], "warnings": []},
        passing=False,
        inputs=False,
        offset=0,
        limit=20,
    )
    assert len(small["boundary_differences"]) == 3 and "boundary_differences_count" not in small


def test_the_compare_answer_bounds_notes_and_the_entries_each_lists() -> None:
    """Compounded 4-bit noise over a deep model is one note covering every failing entry
    (thousands on a 7B port): the answer carries the first ones and the count."""
    from mldbg.compare.report.answer import LISTS_SHOWN, NOTE_ENTRIES_SHOWN, bounded

    names = [f"model.layers.{i}.mlp#0.out" for i in range(5000)]
    notes = [{"name": names[0], "entries": names, "note": "quantization noise"}] + [
        {"name": f"m{i}#0", "entries": [f"m{i}#0.out"], "note": "dwarfed"} for i in range(100)
    ]
    result = {"ok": True, "entries": [], "notes": notes, "unpaired_a": [], "unpaired_b": []}
    answer = bounded(result, passing=False, inputs=False, offset=0, limit=20)
    assert len(answer["notes"]) == LISTS_SHOWN["notes"] and answer["notes_count"] == 101
    assert len(answer["notes"][0]["entries"]) == NOTE_ENTRIES_SHOWN
    assert answer["notes"][0]["entries_count"] == 5000 and answer["truncated"]
    assert len(json.dumps(answer)) < 20_000


def test_home_names_the_run_store_compare_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--home`` means what it means for every run-store verb (it was refused)."""
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / "other"))
    current_run.reset()
    net = torch.nn.Linear(2, 2)
    with mldbg.capture(net, "ref"):
        net(torch.ones(1, 2))
    current_run.reset()
    found = run_cli(tmp_path, "ref", "ref", "--home", "other", "--json")
    assert found.returncode == 0, found.stdout + found.stderr
    assert as_json(found)["ok"]
    missing = run_cli(tmp_path, "ref", "ref", "--json")  # $MLDBG_HOME: ./store, empty
    assert missing.returncode == 2 and as_json(missing)["code"] == "unknown_source"


def test_session_names_the_run_store_compare_reads(
    session, config_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--session`` reads that session's store, as every run-store verb does (it was
    silently ignored: compare read the store of the directory it ran in)."""
    script = tmp_path / "idle.py"
    script.write_text("x = 1\n")
    session.start(script)  # its store: tmp_path/.mldbg
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / ".mldbg"))
    current_run.reset()
    net = torch.nn.Linear(2, 2)
    with mldbg.capture(net, "ref"):
        net(torch.ones(1, 2))
    current_run.reset()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("MLDBG_CONFIG_DIR", str(config_dir))  # the test daemon
    found = run_cli(elsewhere, "-s", session.name, "ref", "ref", "--json")
    assert found.returncode == 0, found.stdout + found.stderr
    assert Path(as_json(found)["a"]["path"]).is_relative_to(tmp_path / ".mldbg")
    unknown = run_cli(elsewhere, "--session", "nobody-here", "ref", "ref", "--json")
    assert unknown.returncode == 2 and as_json(unknown)["code"] == "unknown_session"
