"""The tensor store: exact round trips between PyTorch, MLX and numpy, and its guards."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from mldbg import debug_load, debug_save
from mldbg.store.tensors import TensorStoreFull, list_tensors, read_header

torch = pytest.importorskip("torch")
mx = pytest.importorskip("mlx.core")


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLDBG_HOME", str(tmp_path / ".mldbg"))
    return tmp_path / ".mldbg"


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits, so NaN payloads and signed zeros compare exactly."""
    return t.contiguous().view(torch.uint8)


def test_bf16_round_trip_torch_mlx_torch_is_bit_exact() -> None:
    original = torch.randn(17, 33).to(torch.bfloat16)
    original[0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-40])
    debug_save(original, "act")
    as_mlx = debug_load("act", to="mlx")
    assert as_mlx.dtype == mx.bfloat16 and as_mlx.shape == (17, 33)
    debug_save(as_mlx, "act.from_mlx")
    back = debug_load("act.from_mlx", to="torch")
    assert back.dtype == torch.bfloat16 and torch.equal(bits(back), bits(original))
    as_numpy = debug_load("act", to="numpy")
    assert str(as_numpy.dtype) == "bfloat16"
    assert np.array_equal(
        as_numpy.view(np.uint16), original.view(torch.int16).numpy().view(np.uint16)
    )


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    ],
)
def test_dtypes_survive_every_framework(dtype: torch.dtype) -> None:
    source = (torch.randn(5, 6) * 50).to(dtype)
    debug_save(source, "t")
    assert torch.equal(debug_load("t", to="torch"), source)
    if dtype != torch.float64:  # MLX has no float64 on its default device
        via_mlx = debug_load("t", to="mlx")
        debug_save(via_mlx, "t2")
        back = debug_load("t2", to="torch")
        assert back.dtype == dtype and torch.equal(back, source)
    via_numpy = debug_load("t", to="numpy")
    debug_save(via_numpy, "t3")
    assert torch.equal(debug_load("t3", to="torch"), source)


def test_metadata_records_where_and_when() -> None:
    path = debug_save(torch.zeros(2, 3, dtype=torch.float16), "meta_check")
    header = read_header(path)
    assert header["dtype"] == "F16" and header["shape"] == [2, 3]
    meta = header["metadata"]
    assert (
        meta["framework"] == "torch"
        and meta["caller_function"] == "test_metadata_records_where_and_when"
    )
    assert meta["caller_file"] == __file__ and meta["saved_at"]
    assert [t["name"] for t in list_tensors()] == ["meta_check"]


def test_missing_and_bad_names() -> None:
    debug_save(torch.ones(1), "layer0.attn_out")
    with pytest.raises(FileNotFoundError, match="closest stored names: layer0.attn_out"):
        debug_load("layer0.attn_output")
    for bad in ("../escape", "a/b", "", ".hidden", "a..b"):
        with pytest.raises(ValueError, match="bad tensor name"):
            debug_save(torch.ones(1), bad)
    with pytest.raises(TypeError, match="not list"):
        debug_save([1, 2], "plain")
    with pytest.raises(ValueError, match="use 'torch', 'mlx' or 'numpy'"):
        debug_load("layer0.attn_out", to="jax")


def test_size_guard_warns_then_refuses(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    import mldbg.store.tensors as store

    monkeypatch.setattr(store, "_warned", False)
    monkeypatch.setenv("MLDBG_TENSORS_WARN_GB", "0.000001")  # 1 KB
    monkeypatch.setenv("MLDBG_TENSORS_MAX_GB", "0.00001")  # 10 KB
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        debug_save(torch.zeros(1000), "a")  # 4 KB: past the warning
    assert any("mldbg tensors clear" in str(w.message) for w in caught)
    with pytest.raises(TensorStoreFull) as refused:
        debug_save(torch.zeros(2000), "b")  # 8 KB more: past the limit
    message = str(refused.value)
    assert "holds 0.00 GB" in message and "mldbg tensors clear --yes" in message
    assert not (home / "tensors" / "b.safetensors").exists()
    assert debug_load("a").shape == (1000,)  # nothing lost


def test_exit_after_ends_the_script_cleanly(tmp_path: Path, home: Path) -> None:
    script = tmp_path / "ref.py"
    script.write_text(
        "import torch\nfrom mldbg import debug_save\n"
        "x = torch.arange(4.0)\ndebug_save(x, 'x', exit_after=True)\nprint('not reached')\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)],
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "not reached" not in result.stdout
    assert torch.equal(debug_load("x"), torch.arange(4.0))


def test_cli_lists_shows_and_clears(cli) -> None:
    debug_save(torch.ones(2, 2, dtype=torch.bfloat16), "keep")
    debug_save(torch.ones(3), "drop")
    listed = cli("tensors", "list", json_out=True)
    assert [t["name"] for t in listed["tensors"]] == ["drop", "keep"]
    assert cli("tensors", "info", "keep", json_out=True)["dtype"] == "BF16"
    assert "keep" in cli("tensors", "list").stdout
    error = cli("tensors", "info", "nope", json_out=True, expect=1)
    assert "no tensor named 'nope'" in error["error"]
    refused = cli("tensors", "clear", expect=2)
    assert "mldbg tensors clear --yes" in refused.stderr and len(list_tensors()) == 2
    assert cli("tensors", "clear", "--name", "drop", json_out=True)["removed"] == ["drop"]
    assert cli("tensors", "clear", "--yes", json_out=True)["removed"] == ["keep"]
    assert list_tensors() == []


def _run(tmp_path: Path, source: str, home: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(source.lstrip())
    return subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "MLDBG_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_load_without_to_follows_the_callers_framework(tmp_path: Path, home: Path) -> None:
    debug_save(torch.arange(6, dtype=torch.float32).reshape(2, 3).to(torch.bfloat16), "h")
    mlx_script = _run(
        tmp_path,
        """
import mlx.core as mx
from mldbg import debug_load
h = debug_load("h")
print(type(h).__module__, h.dtype, h.shape)
""",
        home,
    )
    assert mlx_script.returncode == 0, mlx_script.stderr
    assert mlx_script.stdout.split() == ["mlx.core", "mlx.core.bfloat16", "(2,", "3)"]
    # No framework imported at all, and torch not even importable: numpy, bits intact.
    plain = _run(
        tmp_path,
        """
import sys
sys.modules["torch"] = None          # `import torch` now raises ImportError
sys.modules["safetensors"] = None
from mldbg import debug_load
h = debug_load("h")
print(type(h).__module__, h.dtype, h.shape, h.astype("float32").ravel().tolist())
""",
        home,
    )
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.split()[:4] == ["numpy", "bfloat16", "(2,", "3)"]
    assert "[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]" in plain.stdout
    from torch import nn  # noqa: F401  (this module imports both: the saving framework wins)

    assert isinstance(debug_load("h"), torch.Tensor)


def test_show_all_and_clear_need_confirmation(capsys: pytest.CaptureFixture[str]) -> None:
    from mldbg import debug_clear, debug_show_all

    debug_save(torch.ones(2, 3), "one")
    debug_save(mx.zeros((4,), dtype=mx.float16), "two")
    listed = debug_show_all()
    assert [(t["name"], t["dtype"], t["shape"]) for t in listed] == [
        ("one", "F32", [2, 3]),
        ("two", "F16", [4]),
    ]
    printed = capsys.readouterr().out
    assert "one" in printed and "two" in printed and "mlx" in printed
    with pytest.raises(ValueError, match="no terminal to ask"):
        debug_clear()  # no terminal here (pytest's stdin): it cannot ask, so it refuses
    assert len(list_tensors()) == 2  # refused: nothing lost
    assert debug_clear("one") == ["one"]
    assert debug_clear(confirm=True) == ["two"] and list_tensors() == []
    # the spelling of the tool mldbg replaces: confirm=False means "do not ask"
    debug_save(torch.ones(1), "three")
    assert debug_clear(confirm=False) == ["three"] and list_tensors() == []


@pytest.mark.parametrize(("answer", "left"), [("y", []), ("n", ["kept"])])
def test_clear_without_arguments_asks_on_a_terminal(
    home: Path, answer: str, left: list[str]
) -> None:
    import pty

    debug_save(torch.ones(2), "kept")
    leader, follower = pty.openpty()
    code = "from mldbg import debug_clear; print('removed', debug_clear())"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=follower,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "MLDBG_HOME": str(home)},
    )
    os.close(follower)
    os.write(leader, f"{answer}\n".encode())
    out, _ = proc.communicate(timeout=60)
    os.close(leader)
    assert proc.returncode == 0 and "delete all 1 tensor(s)" in out, out
    assert [t["name"] for t in list_tensors()] == left


def test_guard_counts_the_whole_home(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    import mldbg.store.tensors as store
    from mldbg.store import size as store_size

    monkeypatch.setattr(store, "_warned", False)
    monkeypatch.setenv("MLDBG_STORE_WARN_GB", "0.000001")  # 1 KB
    monkeypatch.setenv("MLDBG_STORE_MAX_GB", "0.00002")  # 20 KB
    assert store_size.warning(home) is None
    capture = home / "runs" / "r-1" / "captures" / "ref"
    capture.mkdir(parents=True)
    (capture / "000001.out.safetensors").write_bytes(b"\0" * 15_000)
    text = store_size.warning(home)
    assert text is not None and "mldbg clean --keep" in text and "tensors clear --yes" in text
    usage = store_size.usage(home)
    assert usage["runs_bytes"] == 15_000 and usage["tensors_bytes"] == 0
    with pytest.raises(TensorStoreFull) as refused:  # 15 KB of captures + 8 KB > 20 KB
        debug_save(torch.zeros(2000), "big")
    assert refused.value.code == "store_full" and "mldbg clean" in str(refused.value)
    assert not (home / "tensors" / "big.safetensors").exists()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        debug_save(torch.zeros(10), "small")  # fits, but the home is past the warning size
    assert any("mldbg clean" in str(w.message) for w in caught)
    monkeypatch.setenv("MLDBG_STORE_MAX_GB", "lots")
    with pytest.raises(store_size.MldbgError, match="not a number"):
        store_size.usage(home)


def test_start_is_refused_past_the_limit(cli, write, home: Path) -> None:
    """The guard holds at the door: a store past its limit takes no new run."""
    write("prog.py", "print('ran')\n")
    old = home / "runs" / "old-1"
    old.mkdir(parents=True)
    (old / "output.log").write_bytes(b"x" * 30_000)
    limit = ["--env", "MLDBG_STORE_MAX_GB=0.00002"]  # 20 KB, the client's limit
    refused = cli("start", "-s", "full", *limit, "prog.py", json_out=True, expect=1)
    assert refused["code"] == "store_full" and "mldbg clean" in refused["error"], refused
    assert [p.name for p in (home / "runs").iterdir()] == ["old-1"]  # nothing was made
    state = cli("start", "-s", "full", "--run", "prog.py", json_out=True)  # the default 10 GB
    assert state["state"] in ("exited", "running", "paused"), state


def test_two_repositories_share_one_store(tmp_path: Path) -> None:
    """Without MLDBG_HOME, debug_save in the reference's checkout and debug_load in the
    port's (a subdirectory of it, even) meet in the user's store; MLDBG_HOME still wins."""
    user = tmp_path / "user"
    reference, port = tmp_path / "reference", tmp_path / "port" / "src" / "deep"
    for directory in (user, reference, port):
        directory.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "MLDBG_HOME"} | {"HOME": str(user)}

    def run(cwd: Path, code: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code],
            cwd=cwd,
            env=env | extra,
            capture_output=True,
            text=True,
            timeout=120,
        )

    saved = run(
        reference,
        "import torch; from mldbg import debug_save; "
        "debug_save(torch.arange(6, dtype=torch.bfloat16), 'ref.h')",
    )
    assert saved.returncode == 0, saved.stderr
    assert (user / ".mldbg" / "tensors" / "ref.h.safetensors").is_file()
    assert not (reference / ".mldbg").exists()
    loaded = run(
        port,
        "import mlx.core as mx; from mldbg import debug_load; "
        "h = debug_load('ref.h'); print(h.dtype, h.astype(mx.float32).tolist())",
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == [
        "mlx.core.bfloat16",
        "[0.0,",
        "1.0,",
        "2.0,",
        "3.0,",
        "4.0,",
        "5.0]",
    ]

    missing = run(port, "from mldbg import debug_load; debug_load('ref.g')")
    assert "closest stored names: ref.h" in missing.stderr and "MLDBG_HOME" in missing.stderr
    own = run(port, "from mldbg import debug_load; debug_load('ref.h')", MLDBG_HOME="proj")
    assert "no tensor named 'ref.h'" in own.stderr and "MLDBG_HOME=proj" in own.stderr
    # a tensor left in ./.mldbg/tensors (the per-project store of earlier versions) is named
    old = run(
        reference,
        "import torch; from mldbg import debug_save; debug_save(torch.ones(2), 'old')",
        MLDBG_HOME=".mldbg",
    )
    assert old.returncode == 0, old.stderr
    moved = run(reference, "from mldbg import debug_load; debug_load('old')")
    assert f"MLDBG_HOME={reference / '.mldbg'} reads that store" in moved.stderr, moved.stderr


def test_doctor_says_where_the_tensor_store_is(cli, home: Path) -> None:
    debug_save(torch.ones(4), "seen")
    report = cli("doctor", json_out=True)["store"]
    assert report["tensor_store"] == str(home / "tensors")
    assert report["tensor_store_bytes"] > 0
    assert "tensor store" in cli("doctor").stdout
