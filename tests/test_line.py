"""``mldbg line``: from compare's verdict to the first wrong line of the port.

Unmodified scripts are captured by ``start --capture`` (zero-edit), compared, and then
the line step runs each once more recording only the culprit's scope; no test sets a
breakpoint.  References are real transformers / diffusers models from tiny configs,
ports hand-written MLX or mlx-lm.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("mlx.core")

import mldbg  # noqa: E402
from conftest import Api, Session, line_of, wait_until  # noqa: E402

SCRIPTS = Path(__file__).parent / "zero_edit_scripts"
# each test runs two scripts under capture, then each once more: minutes on a loaded CPU
pytestmark = pytest.mark.timeout(600)


def run_captured(session: Session, script: str, *args: str, **capture: Any) -> dict[str, Any]:
    """Run ``script`` to its end under the debugger with ``capture`` options."""
    session.start(script, *args, stop_on_entry=False, **capture)

    def ended() -> dict[str, Any] | None:
        state: dict[str, Any] = session.wait(10.0)
        return None if state["state"] in ("starting", "running", "paused") else state

    state = wait_until(ended, timeout=300, what=f"{script} to end")
    assert state.get("exit_code") == 0, (state, session.output())
    return state


def line_step(api: Api, a: str, b: str, home: Path, **extra: Any) -> dict[str, Any]:
    """The line verb over REST, its ``next`` call made again while it runs."""
    body: dict[str, Any] = {"a": a, "b": b, "home": str(home), "wait": 20, **extra}
    answer: dict[str, Any] = api.post("/v1/line", body)
    for _ in range(60):
        if answer.get("state") != "running":
            return answer
        again = answer["next"]
        assert again["verb"] == "line"
        answer = api.post("/v1/line", {**again["args"], "home": str(home), "wait": 20})
    pytest.fail(f"the line step did not end: {answer}")


@pytest.mark.slow
def test_llama_rope_base_named_at_the_rope_line_of_mlx_lm(api: Api, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("mlx_lm")
    for name in ("hf_llama_reference.py", "mlx_lm_llama_port.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    home = tmp_path / ".mldbg"
    sessions = [Session(api, f"ln{i}", tmp_path) for i in range(2)]
    try:
        run_captured(sessions[0], "hf_llama_reference.py", capture="ref")
        run_captured(sessions[1], "mlx_lm_llama_port.py", "1000000", capture="bug")
    finally:
        for s in sessions:
            api.http.post(f"{s.base}/terminate")
    verdict = mldbg.compare("ref", "bug", home=home)
    assert verdict.first_divergence is not None
    assert verdict.first_divergence["module"] == "model.layers.0.self_attn"
    assert verdict.result["line"] == {"verb": "line", "args": {"a": "ref", "b": "bug"}}

    answer = line_step(api, "ref", "bug", home)
    first = answer["first_wrong"]
    assert first is not None, answer
    assert first["b"]["file"].endswith("mlx_lm/models/llama.py"), first
    assert "self.rope(queries" in first["b"]["text"], first
    near = first["nearest"][0]  # transformers' apply_rotary_pos_emb
    assert near["a"]["text"] == "q_embed = (q * cos) + (rotate_half(q) * sin)", near
    assert near["rel_rms"] > 100 * answer["bound"]
    last = answer["last_agreeing"]  # the queries it rotated still agreed
    assert last is not None and last["ok"] is True
    assert last["b"]["text"].startswith("queries = queries.reshape("), last
    assert last["nearest"][0]["a"]["name"] == "query_states"


LLAMA_BUGS = {
    # bug: (the port's line that computes it, the reference line nearest its value or
    # None where several are as near: a wrong value is near nothing in particular)
    "rotate": ("x1, x2 = x[..., ::2], x[..., 1::2]", "x"),  # its x1 = x[..., :half] or x2
    "heads": ("q = q.reshape(b, HEADS, n, HEAD_DIM)", None),
    "axis": ("probs = mx.softmax(scores, axis=", "attn_weights = nn.functional.softmax("),
    # the scale is a single number, which a reference keeps where it likes: the line
    # that applies it is the first whose value contradicts the reference's
    "scale": ("scores = (q @ k.transpose(0, 1, 3, 2)) * scale", "attn_weights = torch.matmul("),
    # the reference's mask is an argument of its attention (finfo.min where the port
    # writes -1e9: both mask values, compared as such)
    "mask": ("mask = mx.triu(mx.full((n, n), -1e9), k=", "(arguments of "),
}


class Runs:
    """Scripts captured in one directory, each port the first time a test asks for it."""

    def __init__(self, api: Api, where: Path, reference: str, port: str, **options: Any) -> None:
        self.api, self.dir, self.port_script, self.options = api, where, port, options
        self.home = where / ".mldbg"
        self.done: set[str] = set()
        self._capture(reference, "ref")

    def _capture(self, script: str, name: str, *args: str) -> None:
        session = Session(self.api, f"capture-{self.dir.name}", self.dir)
        try:
            run_captured(session, script, *args, capture=name, replace=True, **self.options)
        finally:
            self.api.http.post(f"{session.base}/terminate")

    def port(self, bug: str) -> str:
        """The capture of the port with ``bug`` planted (``clean``: none)."""
        if bug not in self.done:
            self._capture(self.port_script, bug, *([] if bug == "clean" else [bug]))
            self.done.add(bug)
        return bug


@pytest.fixture(scope="module")
def llama_runs(api: Api, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """transformers' Llama and a hand-written MLX port of it, captured unmodified."""
    pytest.importorskip("transformers")
    where = tmp_path_factory.mktemp("llama")
    for name in ("hf_llama_reference.py", "mlx_llama_port.py"):
        shutil.copy(SCRIPTS / name, where / name)
    return Runs(api, where, "hf_llama_reference.py", "mlx_llama_port.py")


def test_a_clean_hand_written_port_gets_no_line(api: Api, llama_runs: Runs) -> None:
    clean = llama_runs.port("clean")
    assert mldbg.compare("ref", clean, home=llama_runs.home).ok
    with pytest.raises(AssertionError, match="bad_compare_input"):  # no verdict: nothing to do
        line_step(api, "ref", clean, llama_runs.home)


@pytest.mark.parametrize(
    "bug", [b if b == "rotate" else pytest.param(b, marks=pytest.mark.slow) for b in LLAMA_BUGS]
)
def test_each_planted_attention_bug_is_named_at_its_line(
    api: Api, llama_runs: Runs, bug: str
) -> None:
    script = llama_runs.dir / "mlx_llama_port.py"
    port = llama_runs.port(bug)
    verdict = mldbg.compare("ref", port, home=llama_runs.home)
    assert verdict.first_divergence["module"] == "model.layers.0.self_attn", verdict
    answer = line_step(api, "ref", port, llama_runs.home)
    port_text, ref_text = LLAMA_BUGS[bug]
    first = answer["first_wrong"]
    assert first is not None, answer["reason"]
    assert first["b"]["file"] == str(script) and first["b"]["text"].startswith(port_text), answer[
        "reason"
    ]
    assert first["b"]["line"] == line_of(script, port_text)
    assert first["nearest"], first
    if ref_text is not None:
        assert first["nearest"][0]["a"]["text"].startswith(ref_text), first
    assert answer["last_agreeing"] is not None and answer["last_agreeing"]["ok"] is True


LINE_SCRIPTS = Path(__file__).parent / "line_scripts"
ZOO = Path(__file__).parent / "parity_zoo"


def flux_scripts(where: Path) -> None:
    for name in ("flux_setup.py", "flux_reference.py", "flux_port.py"):
        shutil.copy(LINE_SCRIPTS / name, where / name)
    shutil.copy(ZOO / "dit_mlx.py", where / "dit_mlx.py")


@pytest.mark.slow
def test_flux_rotary_pairing_named_in_the_helper_the_attention_calls(
    api: Api, tmp_path: Path
) -> None:
    """diffusers' Flux against the zoo's MLX port whose ``apply_rope`` rotates halves."""
    pytest.importorskip("diffusers")
    flux_scripts(tmp_path)
    home = tmp_path / ".mldbg"
    session = Session(api, "flux-capture", tmp_path)
    try:
        run_captured(session, "flux_reference.py", "tiny", capture="ref")
        run_captured(session, "flux_port.py", "tiny", "rope", capture="port", replace=True)
    finally:
        api.http.post(f"{session.base}/terminate")
    verdict = mldbg.compare("ref", "port", home=home)
    assert verdict.first_divergence["module"] == "transformer_blocks.0.attn", verdict
    answer = line_step(api, "ref", "port", home)
    first = answer["first_wrong"]
    helper = tmp_path / "dit_mlx.py"
    assert first is not None, answer["reason"]
    assert first["b"]["file"] == str(helper) and first["b"]["function"] == "apply_rope", first
    assert first["b"]["line"] == line_of(helper, "rotated = mx.concatenate([-x[..., d:]")
    near = first["nearest"][0]["a"]
    assert near["file"].endswith("diffusers/models/embeddings.py"), near  # apply_rotary_emb
    assert "x_rotated" in near["text"] or "out =" in near["text"], near


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_flux_width_block_pair_reaches_the_line_under_a_50_mb_budget(
    api: Api, tmp_path: Path
) -> None:
    """FLUX.1's width (hidden 3,072, 24 heads of 128, 1,024 image and 256 text tokens, one
    double block, bfloat16): a coarse pass of summaries under 50 MB names the attention,
    and the line step reaches the port's line under the same budget (values sketched)."""
    pytest.importorskip("diffusers")
    flux_scripts(tmp_path)
    shutil.copy(LINE_SCRIPTS / "flux_port_torch.py", tmp_path / "flux_port_torch.py")
    home = tmp_path / ".mldbg"
    coarse = {
        "capture_mode": "summary",
        "capture_budget": "50MB",
        "capture_no_sensitivity": True,
    }
    session = Session(api, "flux-width", tmp_path)
    try:
        run_captured(session, "flux_reference.py", "flux", capture="ref", **coarse)
        run_captured(
            session, "flux_port_torch.py", "flux", "rope", capture="port", replace=True, **coarse
        )
    finally:
        api.http.post(f"{session.base}/terminate")
    verdict = mldbg.compare("ref", "port", home=home)
    assert verdict.first_divergence["module"] == "transformer_blocks.0.attn", verdict
    answer = line_step(api, "ref", "port", home)
    first = answer["first_wrong"]
    port = tmp_path / "flux_port_torch.py"
    assert first is not None, answer["reason"]
    assert first["b"]["file"] == str(port), first
    assert first["b"]["line"] == line_of(port, "rotated = torch.cat([-x[..., half:]")
    assert first["b"]["shape"] == [1, 1280, 24, 128]
    for run in answer["runs"].values():  # each side's records, under the coarse budget
        scope = json.loads((home / "runs" / run / "lines" / "scope.json").read_text())
        assert scope["skipped"] == 0 and scope["bytes"] <= 50_000_000, scope


@pytest.fixture(scope="module")
def pipeline_runs(api: Api, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """A torch flow-matching pipeline (diffusers' scheduler, classifier-free guidance, a
    decoder after the loop) and its MLX port by hand, captured unmodified: the denoiser
    is each run's first model (``NAME``), the decoder its second (``NAME.2``)."""
    pytest.importorskip("diffusers")
    where = tmp_path_factory.mktemp("pipeline")
    for name in ("pipeline_setup.py", "pipeline_reference.py", "pipeline_port.py"):
        shutil.copy(LINE_SCRIPTS / name, where / name)
    return Runs(api, where, "pipeline_reference.py", "pipeline_port.py")


def test_clean_pipeline_port_agrees(pipeline_runs: Runs) -> None:
    clean = pipeline_runs.port("clean")
    assert mldbg.compare("ref", clean, home=pipeline_runs.home).ok
    assert mldbg.compare("ref.2", f"{clean}.2", home=pipeline_runs.home).ok


@pytest.mark.parametrize(
    ("bug", "models", "port_text"),
    [
        # a schedule computed before the loop: the line that made the differing input
        # (the lines before it, shift and sigma_min, single numbers, cannot be compared)
        ("schedule", ("ref", "schedule"), "sigmas = np.append(sigmas, 0.0)"),
        # a guidance mix in the loop body, between the denoiser's calls
        pytest.param(
            "cfg",
            ("ref", "cfg"),
            "velocity = v_cond + setup.GUIDANCE * (v_cond - v_uncond)",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_glue_in_the_loop_is_named_at_its_line(
    api: Api, pipeline_runs: Runs, bug: str, models: tuple[str, str], port_text: str
) -> None:
    home = pipeline_runs.home
    pipeline_runs.port(bug)
    verdict = mldbg.compare(*models, home=home)
    glue = verdict.first_divergence.get("glue")
    assert glue is not None, verdict.first_divergence
    answer = line_step(api, *models, home)
    assert answer["scope"]["kind"] == "glue"
    first = answer["first_wrong"]
    script = pipeline_runs.dir / "pipeline_port.py"
    assert first is not None, answer["reason"]
    assert first["b"]["file"] == str(script), answer["reason"]
    assert first["b"]["line"] == line_of(script, port_text), answer["reason"]


def test_a_latent_scale_skipped_between_two_models_is_said(api: Api, pipeline_runs: Runs) -> None:
    """The port hands its decoder the loop's latents, a value the reference has, just
    not there: the decoder's line is named, and the reference's scaling line is the one
    between that the port never computes."""
    home = pipeline_runs.home
    pipeline_runs.port("scale")
    verdict = mldbg.compare("ref.2", "scale.2", home=home)
    assert verdict.first_divergence.get("glue") is not None, verdict.first_divergence
    answer = line_step(api, "ref.2", "scale.2", home)
    first = answer["first_wrong"]
    script = pipeline_runs.dir / "pipeline_port.py"
    reference = pipeline_runs.dir / "pipeline_reference.py"
    assert first is not None, answer["reason"]
    assert first["b"]["line"] == line_of(script, "image = decoder(latents)"), answer["reason"]
    skipped = [(v["file"], v["line"]) for v in answer["skipped"]]
    assert (str(reference), line_of(reference, "latents = latents / setup.SCALE")) in skipped


def test_every_surface_gives_the_line(
    api: Api, cli: Any, config_dir: Path, llama_runs: Runs
) -> None:
    """REST (above), the CLI (human and --json, the finished job read back), MCP (the tool
    follows the running step itself) and Python, with compare's hint worded for each."""
    from pydantic import TypeAdapter

    from mldbg import results as R
    from mldbg.errors import MldbgError
    from test_mcp import Tools, run_mcp

    home = llama_runs.home
    script = llama_runs.dir / "mlx_llama_port.py"
    wrong = line_of(script, "probs = mx.softmax(scores, axis=")
    llama_runs.port("axis")
    answer = line_step(api, "ref", "axis", home)
    job = answer["job"]
    TypeAdapter(R.LineStep).validate_python(answer)

    text = cli("line", "ref", "axis", "--home", str(home), "--job", job).stdout
    assert f"first wrong line {script}:{wrong}" in text, text
    assert "nearest: transformers/models/llama/modeling_llama.py:" in text, text
    assert "last agreeing:" in text and "port [" in text and "ref  [" in text, text
    data = cli("line", "ref", "axis", "--home", str(home), "--job", job, json_out=True)
    TypeAdapter(R.LineStep).validate_python(data)
    assert data["first_wrong"]["b"]["line"] == wrong
    (ref,) = home.glob("runs/*/captures/ref")
    (port,) = home.glob("runs/*/captures/axis")
    hint = cli("compare", str(ref), str(port), expect=1).stdout  # this CLI reads MLDBG_HOME
    assert f"next: mldbg line {ref} {port}" in hint, hint

    async def scenario(tool: Tools, client: Any) -> None:
        found = await tool("line", a="ref", b="axis", home=str(home))
        assert found["state"] == "done" and found["first_wrong"]["b"]["line"] == wrong
        shown = await client.call_tool("compare", {"a": "ref", "b": "axis", "home": str(home)})
        assert 'next: line(a="ref", b="axis")' in shown.content[0].text

    run_mcp(config_dir, llama_runs.dir, scenario)

    with pytest.raises(MldbgError) as refused:  # nothing to look for: said, with its code
        mldbg.first_wrong_line("ref", llama_runs.port("clean"), home=home)
    assert refused.value.code == "bad_compare_input"


IN_SCRIPT = """
import copy
import torch
from torch import nn
import mldbg


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.act = nn.GELU()

    def forward(self, x):
        h = self.lin(x)
        return self.act(h)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


torch.manual_seed(0)
ref = Net()
port = copy.deepcopy(ref)
port.blocks[1].act = nn.ReLU()  # the port's choice of module: no line of its own
x = torch.randn(4, 8)
with torch.no_grad():
    with mldbg.capture(ref, "ref"):
        ref(x)
    with mldbg.capture(port, "port"):
        port(x)
"""


@pytest.mark.slow
def test_a_culprit_that_is_a_framework_module_names_no_line(
    api: Api, write: Any, tmp_path: Path
) -> None:
    """Captures the script makes itself (two models of one class, one after the other):
    each side's model is found again; the culprit runs only torch's own code."""
    write("parity.py", IN_SCRIPT)
    session = Session(api, "in-script", tmp_path)
    try:
        run_captured(session, "parity.py")
    finally:
        api.http.post(f"{session.base}/terminate")
    home = tmp_path / ".mldbg"
    assert mldbg.compare("ref", "port", home=home).first_divergence["module"] == "blocks.1.act"
    answer = line_step(api, "ref", "port", home)
    assert answer["first_wrong"] is None
    assert "no line of the port to name" in answer["reason"], answer["reason"]
    assert answer["records"]["b"] == 0 and answer["scope"]["model"] == 2
