"""From raw counts to answers: which files matter, what they are, which variant ran.

Everything here reads only the counts and the source files on disk (parsed, never
imported), so it works for any interpreter the script ran in.
"""

from __future__ import annotations

import ast
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from .collect import PACKAGE_DIR, RawProfile

# Ordered: the first rule whose pattern matches a file's path (inside its package) wins.
COMPONENT_RULES: tuple[tuple[str, str], ...] = (
    ("attention", r"attention|attn|sdpa|flash|rope|rotary"),
    ("scheduler", r"schedul|sampler|sampling|solver"),
    ("vae", r"vae|autoencoder|vq_?model|vqgan"),
    ("text encoder", r"text_?encoder|text_?model|tokeniz|clip|(^|/)(u?m?t5|siglip|bert|roberta)"),
    ("pipeline", r"pipeline"),
    ("loaders", r"load|checkpoint|safetensors|serializ|hub|download|weights|convert|quantiz"),
    ("utils", r"util|helper|logging|import|generic|deprecat|config|doc|hooks|registry"),
    (
        "transformer/DiT",
        r"transformer|dit|unet|mmdit|modeling|model|layer|block|resnet|embedding|norm|mlp|nn/",
    ),
)
COMPONENTS = tuple(name for name, _ in COMPONENT_RULES) + ("other",)
_COMPILED = tuple((name, re.compile(pattern)) for name, pattern in COMPONENT_RULES)

# Words that name a role a module plays; groups of look-alikes are formed only around these,
# so "get_config"/"set_config" never count as rival implementations.
ROLE_WORDS = frozenset(
    [
        "attention",
        "attn",
        "processor",
        "forward",
        "norm",
        "layernorm",
        "rmsnorm",
        "groupnorm",
        "mlp",
        "ffn",
        "feedforward",
        "rope",
        "rotary",
        "embedding",
        "embeddings",
        "embed",
        "conv",
        "block",
        "layer",
        "decoder",
        "encoder",
        "scheduler",
        "sampler",
        "kernel",
        "upsample",
        "downsample",
        "resnet",
        "activation",
        "gelu",
        "silu",
        "softmax",
        "linear",
        "quant",
        "matmul",
        "transformer",
        "pipeline",
        "vae",
        "unet",
    ]
)
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z]|\d|\b)|[A-Z]?[a-z]+|[A-Z]+|\d+")
SKIPPED_NAMES = ("<module>", "<genexpr>", "<listcomp>", "<dictcomp>", "<setcomp>", "<lambda>")
MAX_PARSED_FILES = 2000
MAX_PARSED_BYTES = 3_000_000


@dataclass
class FileStats:
    path: str
    package: str
    component: str
    calls: int = 0  # while the script ran, outside imports
    import_calls: int = 0
    imported: bool = False
    functions: dict[tuple[str, int], int] = field(default_factory=dict)  # (qualname, line) -> n

    @property
    def functions_run(self) -> int:
        return sum(1 for (name, _line) in self.functions if not _skipped(name))


@dataclass
class Member:
    name: str
    file: str
    line: int
    calls: int


@dataclass
class VariantGroup:
    kind: str  # "class" | "function" | "file"
    pattern: str
    members: list[Member]

    @property
    def ran(self) -> list[Member]:
        return [m for m in self.members if m.calls > 0]


def _skipped(qualname: str) -> bool:
    return qualname.rsplit(".", 1)[-1] in SKIPPED_NAMES


def component_of(relative: str) -> str:
    """The component a file's path (inside its package, '/'-separated) suggests."""
    text = relative.lower()
    for name, pattern in _COMPILED:
        if pattern.search(text):
            return name
    return "other"


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip(os.sep) + os.sep)


class Scope:
    """Which files the report is about: ``--include`` packages/dirs, else all but stdlib."""

    def __init__(self, raw: RawProfile, include: list[str] | None, cwd: str) -> None:
        self.raw = raw
        self.unmatched: list[str] = []
        self.roots: list[str] = []
        for item in include or []:
            roots = self._resolve(item, cwd)
            if not roots:
                self.unmatched.append(item)
            self.roots.extend(roots)
        self.explicit = bool(include)
        self.excluded = [str(PACKAGE_DIR), *raw.stdlib]

    def _resolve(self, item: str, cwd: str) -> list[str]:
        """A directory or file, else the directories of an imported package (several for a
        namespace package such as ``mlx``, which has no ``__init__.py`` of its own)."""
        candidate = os.path.join(cwd, os.path.expanduser(item))
        if os.path.exists(candidate):
            return [os.path.realpath(candidate)]
        name = item.replace("-", "_")
        file = self.raw.modules.get(name)
        if file is not None:
            return [os.path.dirname(file) if os.path.basename(file) == "__init__.py" else file]
        roots: set[str] = set()
        depth = name.count(".") + 1
        for module, path in self.raw.modules.items():
            if not module.startswith(name + "."):
                continue
            parts = module.count(".") + 1
            up = parts - depth - (0 if os.path.basename(path) == "__init__.py" else 1)
            directory = os.path.dirname(path)
            for _ in range(up):
                directory = os.path.dirname(directory)
            roots.add(directory)
        return sorted(roots)

    def contains(self, path: str) -> bool:
        if not path or path.startswith("<"):
            return False
        if self.explicit:
            return any(_under(path, root) for root in self.roots)
        site = any(part in path for part in ("site-packages", "dist-packages"))
        return site or not any(_under(path, ex) for ex in self.excluded)


def _package_of(path: str, file_modules: dict[str, str], raw: RawProfile) -> tuple[str, str]:
    """(package, path inside the package) for a file."""
    module = file_modules.get(path)
    if path == os.path.realpath(raw.script):
        return "(script)", os.path.basename(path)
    if module and module != "__main__":
        top = module.split(".", 1)[0]
        top_file = raw.modules.get(top)
        if top_file and os.path.basename(top_file) == "__init__.py":
            root = os.path.dirname(os.path.dirname(top_file))
            return top, os.path.relpath(path, root)
        return top, os.path.basename(path)
    # Not imported by name: the package is the first directory under its sys.path entry.
    best = max((p for p in raw.sys_path if _under(path, p)), key=len, default=None)
    if best:
        relative = os.path.relpath(path, best)
        return relative.split(os.sep, 1)[0].removesuffix(".py"), relative
    return os.path.basename(os.path.dirname(path)) or "(other)", os.path.basename(path)


def file_stats(raw: RawProfile, scope: Scope) -> list[FileStats]:
    """Per file in scope: calls, functions that ran, imported or not; most calls first."""
    file_modules = {file: name for name, file in raw.modules.items()}
    files: dict[str, FileStats] = {}

    def entry(path: str) -> FileStats:
        stats = files.get(path)
        if stats is None:
            package, relative = _package_of(path, file_modules, raw)
            # The package's own name says nothing of the file's role ("transformers/...").
            inside = relative.split(os.sep, 1)[-1].replace(os.sep, "/")
            component = "(script)" if package == "(script)" else component_of(inside)
            stats = files[path] = FileStats(path, package, component)
        return stats

    for fn in raw.functions:
        if not scope.contains(fn.file) or not fn.file.endswith(".py"):
            continue
        stats = entry(fn.file)
        stats.calls += fn.calls
        stats.import_calls += fn.import_calls
        stats.imported = stats.imported or fn.import_calls > 0
        if fn.calls:
            key = (fn.qualname, fn.line)
            stats.functions[key] = stats.functions.get(key, 0) + fn.calls
    for path in raw.modules.values():
        if path.endswith(".py") and scope.contains(path):
            entry(path).imported = True
    return sorted(files.values(), key=lambda f: (-f.calls, f.path))


def hot_files(files: list[FileStats], share: float = 0.8, most: int = 10) -> set[str]:
    """The fewest files that together make ``share`` of all calls (at most ``most``)."""
    total = sum(f.calls for f in files)
    hot: set[str] = set()
    running = 0
    for f in files:
        if not f.calls or len(hot) >= most or (hot and running >= share * total):
            break
        if hot and f.calls < 0.01 * total:
            break
        hot.add(f.path)
        running += f.calls
    return hot


# -- look-alike implementations -----------------------------------------------------------------


@dataclass
class _Definition:
    kind: str
    name: str
    qualname: str
    file: str
    line: int


def _definitions(path: str) -> list[_Definition]:
    try:
        if os.path.getsize(path) > MAX_PARSED_BYTES:
            return []
        tree = ast.parse(Path(path).read_bytes(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return []
    found: list[_Definition] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append(_Definition("function", node.name, node.name, path, node.lineno))
        elif isinstance(node, ast.ClassDef) and _callable_class(node):
            found.append(_Definition("class", node.name, node.name, path, node.lineno))
    return found


# Methods that make a class an implementation of a computation (nn.Module, mlx.nn.Module,
# Keras layers, attention processors), not a data holder that happens to share a name.
CALL_METHODS = frozenset({"forward", "__call__", "call"})
ACCESSOR_PREFIXES = frozenset(
    [
        "get",
        "set",
        "is",
        "has",
        "make",
        "create",
        "build",
        "load",
        "save",
        "init",
        "check",
        "register",
        "validate",
        "to",
        "from",
        "add",
        "remove",
        "update",
        "reset",
        "apply",
    ]
)


def _callable_class(node: ast.ClassDef) -> bool:
    return any(
        isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name in CALL_METHODS
        for item in node.body
    )


def _role_of_class(name: str) -> str | None:
    words = _CAMEL.findall(name.strip("_"))
    words = [w for w in words if not w.isdigit()]
    if len(words) < 1:
        return None
    last = words[-1].lower()
    return last if last in ROLE_WORDS else None


def _key_of_function(name: str) -> str | None:
    tokens = [t for t in name.strip("_").lower().split("_") if t]
    if len(tokens) < 2 or tokens[0] in ACCESSOR_PREFIXES:
        return None
    key = "_".join(tokens[1:])
    return key if any(t in ROLE_WORDS for t in tokens[1:]) else None


def _file_key(stem: str) -> str | None:
    return _key_of_function(stem)


def variant_groups(
    files: list[FileStats], max_groups: int = 15, max_members: int = 12
) -> tuple[list[VariantGroup], int]:
    """Look-alike classes, functions and files in scope, and which of them really ran.

    Returns the most telling groups (some members ran and some did not, then the most
    calls) and how many groups there were in all.
    """
    by_path = {f.path: f for f in files}
    parsed = [f for f in files if f.imported or f.calls][:MAX_PARSED_FILES]
    calls_of: dict[tuple[str, str], int] = defaultdict(int)  # (file, qualname) -> calls
    class_calls: dict[tuple[str, str], int] = defaultdict(int)  # (file, class) -> calls
    for f in parsed:
        for (qualname, _line), n in f.functions.items():
            calls_of[(f.path, qualname)] += n
            head = qualname.split(".", 1)[0]
            if "." in qualname and not _skipped(qualname):
                class_calls[(f.path, head)] += n

    groups: dict[tuple[str, str], list[Member]] = defaultdict(list)
    for f in parsed:
        for d in _definitions(f.path):
            if d.kind == "class":
                role = _role_of_class(d.name)
                if role:
                    calls = class_calls.get((d.file, d.name), 0)
                    groups[("class", role)].append(Member(d.name, d.file, d.line, calls))
            else:
                key = _key_of_function(d.name)
                if key:
                    calls = calls_of.get((d.file, d.qualname), 0)
                    groups[("function", key)].append(Member(d.name, d.file, d.line, calls))
    directories = sorted({os.path.dirname(f.path) for f in parsed})
    for directory in directories:
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(".py"))
        except OSError:
            continue
        for name in names:
            key = _file_key(name[:-3])
            if key:
                path = os.path.join(directory, name)
                stats = by_path.get(path)
                calls = stats.calls if stats else 0
                groups[("file", f"{directory}/*_{key}.py")].append(Member(name, path, 1, calls))

    result = []
    for (kind, key), members in groups.items():
        unique = {(m.file, m.name): m for m in members}
        members = list(unique.values())
        if len(members) < 2 or not any(m.calls for m in members):
            continue
        pattern = {
            "class": f"*{key.capitalize()}",
            "function": f"*_{key}",
            "file": os.path.basename(key),
        }[kind]
        if kind == "class":
            pattern = f"*{_display_role(members, key)}"
        members.sort(key=lambda m: (-m.calls, m.name))
        result.append(VariantGroup(kind, pattern, members[:max_members]))

    def rank(group: VariantGroup) -> tuple[int, int, int]:
        ran = len(group.ran)
        mixed = 0 < ran < len(group.members)
        role_bonus = 1 if re.search(r"attn|attention|processor", group.pattern.lower()) else 0
        return (-int(mixed), -role_bonus, -sum(m.calls for m in group.members))

    result.sort(key=rank)
    return result[:max_groups], len(result)


def _display_role(members: list[Member], key: str) -> str:
    """The role word as the classes spell it (``MLP``, ``Attention``)."""
    for m in members:
        words = [w for w in _CAMEL.findall(m.name.strip("_")) if not w.isdigit()]
        if words and words[-1].lower() == key:
            return words[-1]
    return key.capitalize()
