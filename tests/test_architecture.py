"""The house rules of docs/architecture.md, checked against the code.

* one error tree: every exception class mldbg defines is an ``MldbgError`` (the evaluation
  and deadline interrupts, which must get past the ``except Exception`` of the code they
  interrupt, aside);
* no import loop among mldbg's modules, and no import that runs upward through the layers
  the architecture document's table lists.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

import mldbg
from mldbg.agent.interrupt import EvalInterrupt
from mldbg.deadline import DeadlineInterrupt
from mldbg.errors import MldbgError

SRC = Path(mldbg.__file__).parent
ARCHITECTURE = Path(__file__).parent.parent / "docs" / "architecture.md"


def module_names() -> list[str]:
    names = ["mldbg"]
    for info in pkgutil.walk_packages([str(SRC)], prefix="mldbg."):
        if info.name.rsplit(".", 1)[-1] == "__main__" or ".examples." in info.name + ".":
            continue
        names.append(info.name)
    return names


def test_every_exception_class_is_under_mldbg_error() -> None:
    outside = []
    for name in module_names():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or not issubclass(cls, BaseException):
                continue
            if not issubclass(cls, MldbgError | EvalInterrupt | DeadlineInterrupt):
                outside.append(f"{name}.{cls.__name__}")
    assert outside == [], "define these in errors.py, under MldbgError"


def module_of(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    path = SRC.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def runtime_nodes(tree: ast.AST, types_too: bool = False) -> list[ast.AST]:
    """Every node of the code that can run: ``if TYPE_CHECKING:`` blocks left out (kept
    with ``types_too``)."""
    found: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        checking = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        if checking and not types_too:
            todo.extend(node.orelse)
            continue
        found.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return found


def imported_by(path: Path, node: ast.ImportFrom) -> set[str]:
    """The modules one ``from ... import`` of ``path`` loads: ``from package import
    submodule`` loads the submodule, any other name the module it comes from."""
    if node.level:
        module = module_of(path)
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        base = package.split(".")
        base = base[: len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    submodules = {f"{target}.{a.name}" for a in node.names}
    modules = {name for name in submodules if is_module(name)}
    return modules | ({target} if len(modules) < len(submodules) else set())


def imports_of(path: Path, types_too: bool = False) -> set[str]:
    """The mldbg modules a file imports, at any depth of its code (lazy imports count;
    ``from package import submodule`` imports the submodule, not the package's face;
    ``types_too``: the type checker's imports as well)."""
    found: set[str] = set()
    for node in runtime_nodes(ast.parse(path.read_text(encoding="utf-8")), types_too):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= imported_by(path, node)
    module = module_of(path)
    return {name for name in found if name.startswith("mldbg") and name != module}


def graph(types_too: bool = False) -> dict[str, set[str]]:
    files = {module_of(p): p for p in SRC.rglob("*.py") if "examples" not in p.parts}
    return {
        name: {t for t in imports_of(path, types_too) if t in files} for name, path in files.items()
    }


def test_no_import_loop() -> None:
    """Not even through the type checker's imports (``if TYPE_CHECKING:``): a loop there
    is the same tangle for a reader, only hidden from the interpreter."""
    edges = graph(types_too=True)
    # Tarjan's strongly connected components; a component of two or more is a loop
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                loops.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert loops == []


def table_under(heading: str) -> list[list[str]]:
    """The first table after ``heading`` in docs/architecture.md, in its order: each row's
    module patterns (the backquoted paths of its second column)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert heading in text, f"docs/architecture.md lost its heading {heading!r}"
    rows: list[list[str]] = []
    for line in text[text.index(heading) :].splitlines()[1:]:
        match = re.match(r"\| (\w[\w -]*?) \| (`.*?) \|", line)
        if match:
            rows.append(re.findall(r"`([\w./]+)`", match[2]))
        elif rows and not line.startswith("|"):
            break  # the table ended
    assert rows, f"docs/architecture.md lost the table under {heading!r}"
    return rows


def layers() -> list[list[str]]:
    """The layer table of docs/architecture.md, top first: each row's module patterns."""
    return table_under("## Layers")


def layer_of(module: str, table: list[list[str]]) -> int | None:
    path = module.replace(".", "/").removeprefix("mldbg/")
    best: tuple[int, int] | None = None  # (length of the pattern, row)
    for row, patterns in enumerate(table):
        for pattern in patterns:
            stem = pattern.removesuffix(".py").removesuffix("/__init__").rstrip("/")
            covers = path == stem or path.startswith(stem + "/")
            if covers and (best is None or len(stem) > best[0]):
                best = (len(stem), row)
    return None if best is None else best[1]


def test_every_module_is_in_a_layer_and_imports_only_downward() -> None:
    table = layers()
    edges = graph()
    unplaced = sorted(m for m in edges if m != "mldbg" and layer_of(m, table) is None)
    assert unplaced == [], "add these to the layer table of docs/architecture.md"
    upward = []
    for module, targets in edges.items():
        here = layer_of(module, table)
        for target in targets:
            there = layer_of(target, table)
            if here is not None and there is not None and there < here:
                upward.append(f"{module} -> {target}")
    assert sorted(upward) == []


def test_compare_stages_import_only_the_stages_before_them() -> None:
    """compare/ reads as its pipeline: a stage (reading, pairing, judging, naming the
    culprit, reporting, ...) imports only stages listed above it in the architecture
    document's stage table, never a later one, and no module of compare/ is outside it."""
    stages = table_under("## Parity")  # first row: the shapes every stage reads
    edges = graph()
    inside = [m for m in edges if m.startswith("mldbg.compare")]
    unplaced = sorted(m for m in inside if layer_of(m, stages) is None)
    assert unplaced == [], "add these to the compare stage table of docs/architecture.md"
    later = []
    for module in inside:
        here = layer_of(module, stages)
        assert here is not None
        for target in edges[module]:
            there = layer_of(target, stages) if target.startswith("mldbg.compare") else None
            if there is not None and there > here:
                later.append(f"{module} -> {target}")
    assert sorted(later) == []


def test_no_module_imports_another_modules_private_names() -> None:
    """A leading underscore means "this module's own": a name another module needs is
    public where it is defined (aliases of public names, ``x as _x``, are fine)."""
    private = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            ours = isinstance(node, ast.ImportFrom) and (
                node.level > 0 or (node.module or "").startswith("mldbg")
            )
            if ours:
                private += [
                    f"{module_of(path)}: {a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert sorted(private) == []


def top_level_imports(path: Path) -> set[str]:
    """What a file imports when it is imported: module-level statements (and their ``if``/
    ``try`` blocks), ``if TYPE_CHECKING:`` blocks left out; functions' own imports not."""
    found: set[str] = set()
    todo: list[ast.stmt] = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If):
            if "TYPE_CHECKING" not in ast.unparse(node.test):
                todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                todo += handler.body
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= imported_by(path, node)
    return found


# loaded by the agent only for a capture or replay the user asked for (start --capture),
# in a script that has torch or MLX, and numpy, already
ON_REQUEST = ("mldbg.capture", "mldbg.compare")


def test_what_the_agent_imports_at_start_is_standard_library_only() -> None:
    """The debuggee's interpreter may have nothing but the standard library: every mldbg
    module the agent may load (its imports followed, lazy ones too) imports only the
    standard library and mldbg when it is imported; torch, MLX or numpy only inside the
    functions that run when the script already has them."""
    files = {module_of(p): p for p in SRC.rglob("*.py")}
    seen: set[str] = set()
    todo = ["mldbg.agent.runner", "mldbg.agent.__main__"]
    foreign = []
    while todo:
        module = todo.pop()
        if module in seen or module not in files or module.startswith(ON_REQUEST):
            continue
        seen.add(module)
        todo += imports_of(files[module])  # every mldbg module it may load, lazily too
        for name in top_level_imports(files[module]):
            top = name.split(".")[0]
            if top != "mldbg" and top not in sys.stdlib_module_names and top != "__future__":
                foreign.append(f"{module} imports {name}")
    assert "mldbg.errors" in seen and foreign == []


# callables whose positional argument at this index is an error code
CODE_POSITION = {"CommandError": 1, "BreakpointError": 1, "EvalError": 2, "reply": 5, "respond": 4}


def literal_codes(tree: ast.AST) -> list[ast.Constant]:
    """String literals where an error code goes: ``code=``, a refusal's code argument, a
    ``"code":`` entry, a class's ``code =``."""

    def literal(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    found: list[ast.Constant] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found += [k.value for k in node.keywords if k.arg == "code" and literal(k.value)]  # type: ignore[misc]
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            index = CODE_POSITION.get(name or "")
            if index is not None and len(node.args) > index and literal(node.args[index]):
                found.append(node.args[index])  # type: ignore[arg-type]
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if literal(key) and key.value == "code" and literal(value):  # type: ignore[union-attr]
                    found.append(value)  # type: ignore[arg-type]
        elif (
            isinstance(node, ast.Assign)
            and literal(node.value)
            and [getattr(t, "id", None) for t in node.targets] == ["code"]
        ):
            found.append(node.value)  # type: ignore[arg-type]
    return found


def test_error_codes_are_named_constants_the_verb_table_documents() -> None:
    import mldbg.errors as E
    from mldbg import verbs

    defined = {v for k, v in vars(E).items() if k.isupper() and isinstance(v, str)}
    literals = []
    for path in SRC.rglob("*.py"):
        if path.name == "errors.py":
            continue
        for node in literal_codes(ast.parse(path.read_text(encoding="utf-8"))):
            literals.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value!r}")
    assert literals == [], "raise with the constants of errors.py"
    for verb in verbs.VERBS:
        unknown = set(verb.all_errors) - defined
        assert not unknown, f"{verb.name} documents codes errors.py does not define: {unknown}"


def test_a_session_holds_its_process_half_which_knows_nothing_of_it() -> None:
    """Sessions by composition: ``SessionProcess`` is held, not inherited; it imports and
    names no session, family or manager, and reaches its session only through the
    ``ProcessObserver`` callbacks, each of which ``Session`` implements with the same
    parameters."""
    from mldbg.server import session_process, sessions

    path = SRC / "server" / "session_process.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {
        node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)  # TYPE_CHECKING blocks included
    }
    assert not imported & {"sessions", "children", "manager"}, imported
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not named & {"Session", "ChildSession", "Family", "SessionManager"}, named
    assert session_process.SessionProcess not in sessions.Session.__mro__

    observer = session_process.ProcessObserver
    callbacks = [n for n, f in vars(observer).items() if inspect.isfunction(f) and n[0] != "_"]
    assert {"on_exit", "on_connected", "on_connection"} <= set(callbacks)
    for name in callbacks:
        wanted = inspect.signature(getattr(observer, name))
        implemented = inspect.signature(getattr(sessions.Session, name))
        assert list(implemented.parameters) == list(wanted.parameters), name
