"""A pipeline is one verdict: every model two zero-edit runs captured, compared in order.

``start --capture NAME`` on a pipeline makes one capture per model, in the order of
their first calls: the text encoder ``NAME``, the denoiser ``NAME.2``, the VAE
``NAME.3``.  ``mldbg compare ref port`` compared the first of them only, said "match",
and left the user to compare model by model and work out where a difference entered (a
latent unscale skipped before the VAE took three compares and a map).

When both sources are the first model of such a run, :func:`compare_pipeline` compares
each model with its counterpart (the k-th capture of each run; each later model bounded
by what the models before it rounded, ``judge/upstream.py``), and names the first
divergence across the pipeline: the first model, in call order, whose comparison is not
clean, with its own culprit (model, step, module), or, when its very first inputs differ
while every model before it agrees, the glue code between the two models with both
call sites.  Each model's verdict is one line of ``pipeline.models``; the answer's
entries are those of the model that decides.

One model alone: ``NAME.k`` for the k-th (``ref.2 port.2``), ``NAME.1`` for the first
(``read/sources.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import MldbgError
from .judge.upstream import MAX_UPSTREAM, later_models
from .read.sources import Call, CompareInputError, Source, open_capture
from .records import Culprit, Document, PipelineModel, Site

Compare = Callable[[Source, Source, Source | None, Source | None], Document]
# Beside both runs: a replay capture and a better run of the reference (each optional).
Beside = tuple[Source | None, Source | None]


def is_pipeline(a: Source, b: Source) -> bool:
    """Both sources are the first model of a zero-edit run that captured several (and
    hold tensors: a fine pass inside a later model keeps the first on the index only,
    and comparing it says which capture to compare instead)."""
    if a.one_model or b.one_model or _index_only(a) or _index_only(b):
        return False
    return bool(later_models(a)) and bool(later_models(b))


def _index_only(source: Source) -> bool:
    return bool(source.meta.get("index_only"))


def compare_pipeline(a: Source, b: Source, beside: Beside, compare_one: Compare) -> Document:
    """Every model of the two runs compared in order (each beside the same model of the
    replay capture and of the better run, when given); the document of the model that
    decides, with ``pipeline``: each model's verdict, and which one decides."""
    problems: list[str] = []
    models_a, models_b = _models(a, problems), _models(b, problems)
    replays, betters = (_models(s, problems) if s is not None else [] for s in beside)
    lines: list[PipelineModel] = []
    documents: list[Document | None] = []
    for k in range(max(len(models_a), len(models_b))):
        beside = (_at(replays, k), _at(betters, k))
        document, line = _one(k, _at(models_a, k), _at(models_b, k), beside, compare_one)
        documents.append(document)
        lines.append(line)
    deciding = next((k for k, line in enumerate(lines) if not line["ok"]), None)
    if deciding is not None:
        _glue_between_models(deciding, documents, models_a, models_b)
    document = _answer(deciding, documents, lines)
    document["warnings"] = [*document.get("warnings", []), *problems]
    return document


def _at(models: list[Source], k: int) -> Source | None:
    return models[k] if k < len(models) else None


def _models(first: Source, problems: list[str]) -> list[Source]:
    """``first`` and the later models of its run, in the order they were first called
    (one that cannot be opened is said in ``problems``)."""
    found = [first]
    for name in later_models(first)[: MAX_UPSTREAM - 1]:
        try:
            found.append(open_capture(name, first.path.parent / name))
        except MldbgError as exc:
            problems.append(f"{name}: {exc.message}")
    return found


def _one(
    k: int,
    a: Source | None,
    b: Source | None,
    beside: Beside,
    compare_one: Compare,
) -> tuple[Document | None, PipelineModel]:
    """One model's comparison and its line (None: it could not be compared)."""
    line: PipelineModel = {
        "position": k + 1,
        "a": _name(a),
        "b": _name(b),
        "class_a": None if a is None else a.meta.get("model_class"),
        "class_b": None if b is None else b.meta.get("model_class"),
        "ok": False,
        "decided_by": None,
        "first_divergence": None,
        "counts": None,
        "error": None,
    }
    if a is None or b is None:
        have, lack = ("A", "B") if b is None else ("B", "A")
        line["error"] = (
            f"model {k + 1} of {have}'s run ({_name(a) or _name(b)}) has no counterpart in "
            f"{lack}'s run: the runs did not call as many models"
        )
        return None, line
    if _index_only(a) or _index_only(b):  # a fine pass inside another model: no tensors
        line["ok"] = True
        line["decided_by"] = "index-only"
        return None, line
    try:
        document = compare_one(a, b, *beside)
    except CompareInputError as exc:
        line["error"] = exc.message
        line["code"] = exc.code
        return None, line
    document.pop("other_models", None)  # the other models are compared here
    culprit = document.get("first_divergence")
    line["ok"] = bool(document["ok"])
    line["decided_by"] = document.get("decided_by")
    line["counts"] = document.get("counts")
    if culprit is not None:
        line["first_divergence"] = {"name": culprit["name"], "reason": culprit["reason"]}
    elif document.get("undecided"):
        line["error"] = str(document["undecided"])
    return document, line


def _name(source: Source | None) -> str | None:
    return None if source is None else str(source.meta.get("name") or source.path.name)


def _glue_between_models(
    k: int, documents: list[Document | None], models_a: list[Source], models_b: list[Source]
) -> None:
    """The deciding model's first call's inputs differ while every model before it
    agrees: the difference enters in the code between the previous model's last call
    and this one.  Say so, with both call sites of both calls."""
    document = documents[k]
    culprit: Culprit | None = None if document is None else document.get("first_divergence")
    glue = None if culprit is None else culprit.get("glue")
    if culprit is None or glue is None or glue["after"] is not None or k == 0:
        return
    previous = _last_call_before(models_a[k])
    if previous is None:
        return
    capture, call = previous
    after_b = _site_of(models_b[k - 1] if k - 1 < len(models_b) else None, capture, call)
    here = f"{_name(models_a[k])}'s {culprit['name']}"
    there = f"{capture}'s {call.module}#{call.call}"
    culprit["reason"] = (
        f"the inputs of {culprit['name']}, the first call of {_name(models_a[k])}, differ "
        f"while the models before it agree: the difference enters between {there} and "
        f"{here}, in the code between the two models (glue code)"
    )
    after: Site = {
        "call": f"{capture}:{call.module}#{call.call}",
        "site_a": call.site,
        "site_b": after_b,
    }
    glue["after"] = after


def _last_call_before(source: Source) -> tuple[str, Call] | None:
    """The previous model's last top-level call that had ended when ``source`` opened:
    the capture that opened last before it (its ``upstream``), read back."""
    listed = source.meta.get("upstream")
    if not isinstance(listed, list) or not listed or not isinstance(listed[-1], dict):
        return None
    name, ended = listed[-1].get("capture"), listed[-1].get("ended")
    if not isinstance(name, str) or not isinstance(ended, int):
        return None
    try:
        earlier = open_capture(name, source.path.parent / name)
    except MldbgError:
        return None
    tops = [
        c
        for c in earlier.calls.values()
        if c.parent is None and c.end is not None and c.end < ended
    ]
    return (name, max(tops, key=lambda c: c.end or 0)) if tops else None


def _site_of(source: Source | None, capture: str, call: Call) -> str | None:
    """Where B's run made its counterpart of ``call`` (the same module and call index)."""
    if source is None:
        return None
    found = source.calls.get((call.module, call.call))
    return None if found is None else found.site


def _answer(
    deciding: int | None, documents: list[Document | None], lines: list[PipelineModel]
) -> Document:
    """The deciding model's document (the first model's when all agree), its culprit
    named with its capture, and every model's line under ``pipeline``."""
    shown = deciding if deciding is not None and documents[deciding] is not None else None
    if shown is None:
        shown = next((k for k, d in enumerate(documents) if d is not None), None)
    if shown is None:  # no model could be compared: the first one's error, as one model's
        raise CompareInputError(str(lines[0]["error"]), code=lines[0].get("code"))
    document = documents[shown]
    assert document is not None
    culprit = document.get("first_divergence")
    if culprit is not None:
        culprit["capture"] = lines[shown]["a"]
    if deciding is not None and documents[deciding] is None:  # a model not compared
        document["first_divergence"] = None
        document["decided_by"] = "pipeline"
        document["undecided"] = (
            f"model {deciding + 1} could not be compared: {lines[deciding]['error']}"
        )
    document["ok"] = deciding is None
    document["pipeline"] = {
        "models": lines,
        "deciding": None if deciding is None else deciding + 1,
        "shown": shown + 1,
        "note": (
            f"{len(lines)} models compared in the order of their first calls; "
            + (
                "all agree"
                if deciding is None
                else f"the first that does not agree is model {deciding + 1} ({lines[deciding]['a']})"
            )
            + f"; entries are model {shown + 1}'s ({lines[shown]['a']}); one model alone: "
            "NAME.k (NAME.1 for the first)"
        ),
    }
    return document
