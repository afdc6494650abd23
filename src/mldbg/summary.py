"""One bounded, fast summary of any value, tensor-aware.

This module is imported inside the debugged process by the standard-library-only agent,
so it imports only the standard library.  A torch tensor can only exist if the script
imported torch, so a framework is taken from ``sys.modules`` once the value's class says it
belongs to one; nothing here ever imports torch, MLX or numpy.

Tensor statistics are computed on the tensor's own device, chunk by chunk, and merged in
double precision on the host (Chan et al.'s parallel update).  Only scalars and the
first few values ever reach the host, and a chunk-sized buffer is the most memory a dtype
conversion or a non-finite filter needs, so a 1e8-element tensor summarizes quickly and
as briefly as a small one.

Statistics conventions, shared by torch, MLX and numpy:

* ``min``/``max``/``mean``/``std`` cover the finite values only; NaNs and infinities are
  counted in ``nan`` and ``inf``.  With no finite value the four are ``None``.
* ``std`` is the sample standard deviation (Bessel's correction, torch's default
  ``correction=1``; MLX and numpy default to the population one), and ``0.0`` for a
  single value.
* 16-bit and 8-bit floats are computed in float32, integers in float64 (min/max exactly,
  as ints), booleans on 0/1 (min/max as bools), complex values on their absolute value.
"""

from __future__ import annotations

import array
import collections
import contextlib
import math
import numbers
import re
import reprlib
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, TypeVar

if TYPE_CHECKING:
    from typing import Self

PREVIEW = 8
"""Values shown from the start of a tensor, in row-major order."""
REPR_LIMIT = 1000
"""Characters of repr kept in a non-tensor summary."""
CHUNK = 1 << 20
"""Elements reduced at a time on the CPU (and by MLX): conversion and filter buffers stay
at a few MB, which the allocator reuses instead of growing the heap; no slower than larger
chunks, as each still fills a reduction's threads."""
ACCELERATOR_CHUNK = 1 << 24
"""Elements at a time on accelerators, where each chunk costs kernel launches and a sync."""
_MLX_ROW = 64
"""Width of each level of MLX's tree sums (see ``_mlx_sum``)."""

_TENSOR_TYPES = {"torch": "torch.Tensor", "mlx": "mlx.core.array", "numpy": "numpy.ndarray"}
_FRAMEWORKS = {
    "torch": ("torch", "Tensor"),
    "mlx": ("mlx.core", "array"),
    "numpy": ("numpy", "ndarray"),
}

# A value JSON holds as it is (a preview element, a plain scalar's ``value``).
JsonScalar = bool | int | float | str | None


class Stats(TypedDict):
    """A tensor's statistics (see the module docstring); ints and bools count as floats."""

    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    inf: int


class Summary(TypedDict, total=False):
    """What :func:`summarize` says of a value: ``type`` always; tensors have ``shape`` to
    ``stats``, anything else ``repr`` and, where they apply, ``value``/``len``/``parameters``."""

    type: str
    shape: list[int]
    dtype: str
    device: str
    numel: int
    preview: list[JsonScalar]
    stats: Stats | None
    requires_grad: bool  # torch
    evaluated: bool  # MLX: False for a lazy array (or a tracer) left unevaluated
    note: str  # what could not be read, and why
    repr: str
    value: JsonScalar
    len: int
    parameters: int


class _Sliceable(Protocol):
    """What chunking and the preview need of a tensor (torch, MLX and numpy all have it)."""

    @property
    def shape(self) -> Sequence[int]: ...

    def reshape(self, *shape: int) -> Self: ...

    def __getitem__(self, index: int | slice | tuple[int | slice, ...], /) -> Self: ...


_Array = TypeVar("_Array", bound=_Sliceable)


# -- what a value is ------------------------------------------------------------------------


def _framework(value: object) -> str | None:
    """``"torch"``, ``"mlx"`` or ``"numpy"`` when ``value`` is one of their tensors.

    Only classes whose own module (or a base's, for user subclasses) belongs to a framework
    are checked, against a framework that is already imported; ``issubclass`` on the real
    type, so a proxy lying about ``__class__`` is not taken for a tensor.
    """
    cls = type(value)
    for base in cls.__mro__:
        module = getattr(base, "__module__", None)
        if not isinstance(module, str):
            continue
        root = module.partition(".")[0]
        if root not in _FRAMEWORKS:
            continue
        module_name, class_name = _FRAMEWORKS[root]
        framework = sys.modules.get(module_name)
        if framework is not None and issubclass(cls, getattr(framework, class_name)):
            return root
    return None


def _safe_framework(value: object) -> str | None:
    try:
        return _framework(value)
    except Exception:
        return None


def is_tensor(value: object) -> bool:
    """True for torch.Tensor (nn.Parameter included), mlx.core.array and numpy.ndarray.

    numpy scalars (``np.float32(1.0)``) are not tensors: they print well on their own.
    """
    return _safe_framework(value) is not None


def type_name(value: object) -> str:
    """Qualified type name, bare for builtins: ``int``, ``torch.Tensor``, ``mymodule.MyClass``.

    Every torch tensor (parameters and subclasses too) reads ``torch.Tensor``, since
    ``torch.nn.parameter.Parameter`` says less to a reader than the summary beside it.
    """
    try:
        if _safe_framework(value) == "torch":
            return "torch.Tensor"
        kind = type(value)
        module = getattr(kind, "__module__", None)
        qualname = getattr(kind, "__qualname__", None) or kind.__name__
        if not module or module == "builtins":
            return str(qualname)
        return f"{module}.{qualname}"
    except Exception:
        return "object"


# -- bounded text ---------------------------------------------------------------------------


def _bounded_repr() -> reprlib.Repr:
    """reprlib elides inside containers, so a million-element list costs what twenty do."""
    r = reprlib.Repr()
    r.maxlevel = 4
    r.maxlist = r.maxtuple = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 32
    r.maxdict = 24
    r.maxstring = r.maxlong = r.maxother = 400
    return r


_REPR = _bounded_repr()
_REPR_METHODS: tuple[tuple[type, str], ...] = (
    (list, "repr_list"),
    (tuple, "repr_tuple"),
    (dict, "repr_dict"),
    (set, "repr_set"),
    (frozenset, "repr_frozenset"),
    (collections.deque, "repr_deque"),
    (array.array, "repr_array"),
)


def _describe_exception(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:
        message = "?"
    return f"{type(exc).__name__}: {message}"


def _truncate(text: str, max_chars: int, total: int | None = None) -> str:
    """Cut ``text`` to ``max_chars``, ending in ``… (N chars)`` (N: the full length)."""
    total = len(text) if total is None else total
    if len(text) <= max_chars and total <= len(text):
        return text
    suffix = f"… ({total} chars)"
    if max_chars > 2 * len(suffix):
        return text[: max_chars - len(suffix)] + suffix
    return text[: max_chars - 1] + "…" if max_chars > 0 else ""


def _bounded_text(value: Any, max_chars: int) -> tuple[str, int | None] | None:
    """reprlib for builtin containers, a prefix for long strings, or None for ``repr``.

    Types are read with ``type()``: ``isinstance`` would consult a ``__class__`` property.
    """
    kind = type(value)
    if issubclass(kind, str | bytes | bytearray) and len(value) > max_chars:
        # Rendering a 100 MB string only to cut it would cost more than the pause itself.
        return repr(value[:max_chars]), len(value)
    for base, method in _REPR_METHODS:
        if issubclass(kind, base) and kind.__repr__ is base.__repr__:
            return getattr(_REPR, method)(value, _REPR.maxlevel), None
    return None


def _repr_text(value: object, max_chars: int) -> tuple[str, int | None]:
    """The repr and, where only a prefix was rendered, the full length; never raises.

    A bounded rendering that fails (a list subclass whose ``__len__`` raises) falls back
    to the object's own repr; a failing repr reads ``<repr failed: ExcType: message>``.
    """
    with contextlib.suppress(Exception):
        bounded = _bounded_text(value, max_chars)
        if bounded is not None:
            return bounded
    try:
        text = repr(value)
        if not isinstance(text, str):
            raise TypeError(f"__repr__ returned {type(text).__name__}")
        return text, None
    except Exception as exc:
        return f"<repr failed: {_describe_exception(exc)}>", None


def safe_repr(value: object, max_chars: int = 4096) -> str:
    """``repr`` that never raises and never grows past ``max_chars``.

    Builtin containers go through reprlib (elided inside, so cost stays bounded); strings
    are cut before being rendered; other objects choose their own repr, cut here.  A cut
    text ends in ``… (N chars)``, N being the full length (a string's own length when only
    its start was rendered).  A failing repr reads ``<repr failed: ExcType: message>``.
    """
    text, total = _repr_text(value, max_chars)
    return _truncate(text, max_chars, total)


def repr_within(value: object, limit: int) -> tuple[str, bool]:
    """``safe_repr`` in at most ``limit`` bytes of UTF-8, and whether it was cut.  A cut
    one still ends in ``… (N chars)``: a byte cap applied after ``safe_repr`` cut that
    off, and a 100 MB string read "…[98 bytes cut]…"."""
    text, total = _repr_text(value, limit)
    chars = limit
    while True:
        shown = _truncate(text, chars, total)
        size = len(shown.encode("utf-8", "surrogatepass"))
        if size <= limit or chars <= 64:
            return shown, total is not None or shown != text
        chars = max(64, chars * limit // size - 1)  # wide characters: fewer of them


def _json_number(x: float | int | bool) -> float | int | bool | str:
    """Strict JSON has no NaN or infinity: they travel as ``"nan"``, ``"inf"``, ``"-inf"``."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def _json_value(x: object) -> JsonScalar:
    """A preview element as JSON: numbers as numbers, anything else as bounded text.

    Complex values read ``"3+4j"``; numbers tolist leaves as objects (numpy's longdouble)
    become Python ones.
    """
    if isinstance(x, bool | int | float):
        return _json_number(x)
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        return _json_number(float(x))
    if isinstance(x, numbers.Complex):
        z = complex(x)
        return f"{z.real:g}{z.imag:+g}j"
    return safe_repr(x, 100)


def _finite_or_none(x: float) -> float | None:
    """A mean or std that overflowed its precision is unknown, not infinite."""
    return x if math.isfinite(x) else None


# -- statistics shared by every framework ---------------------------------------------------


class _Moments:
    """Count, mean and sum of squared deviations of the finite values, merged chunk by chunk.

    Chan, Golub and LeVeque's pairwise update keeps the merge exact in double precision
    whatever precision each chunk was reduced in.
    """

    __slots__ = ("count", "mean", "m2", "low", "high", "nan", "inf")

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.low: float | None = None
        self.high: float | None = None
        self.nan = 0
        self.inf = 0

    def add(self, count: int, mean: float, m2: float, low: float, high: float) -> None:
        if count == 0:
            return
        total = self.count + count
        delta = mean - self.mean
        self.mean += delta * count / total
        self.m2 += m2 + delta * delta * self.count * count / total
        self.count = total
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)

    def stats(self) -> Stats:
        if self.count == 0:
            return {
                "min": None,
                "max": None,
                "mean": None,
                "std": None,
                "nan": self.nan,
                "inf": self.inf,
            }
        std = math.sqrt(max(self.m2, 0.0) / (self.count - 1)) if self.count > 1 else 0.0
        return {
            "min": self.low,
            "max": self.high,
            "mean": _finite_or_none(self.mean),
            "std": _finite_or_none(std),
            "nan": self.nan,
            "inf": self.inf,
        }


def _bool_stats(count: int, true: int) -> Stats:
    """Booleans as 0/1, from the count of true values alone (no converted copy)."""
    var = true * (count - true) / (count * (count - 1)) if count > 1 else 0.0
    return {
        "min": true == count,
        "max": true > 0,
        "mean": true / count,
        "std": math.sqrt(var),
        "nan": 0,
        "inf": 0,
    }


def _chunks(x: _Array, limit: int) -> Iterator[_Array]:
    """Views of at most ``limit`` elements, sliced along the leading axes; never a copy."""
    shape = tuple(x.shape)
    count = math.prod(shape)
    if count <= limit or not shape:
        yield x
        return
    row = count // shape[0]
    if row > limit:
        for i in range(shape[0]):
            yield from _chunks(x[i], limit)
    else:
        step = limit // row
        for start in range(0, shape[0], step):
            yield x[start : start + step]


def _head(x: _Array, count: int) -> _Array:
    """The first values in row-major order, gathered from a slice of under 2*PREVIEW values.

    Flattening a whole non-contiguous tensor would copy it; instead index zeros into the
    leading axes until the rest holds enough values, and flatten only that small slice.
    """
    wanted = min(PREVIEW, count)
    if count <= 2 * PREVIEW:
        return x.reshape(-1)[:wanted]
    shape = tuple(x.shape)
    inner = 1  # values per step along ``axis``
    axis = 0
    for axis in range(len(shape) - 1, -1, -1):
        if inner * shape[axis] >= wanted:
            break
        inner *= shape[axis]
    rows = -(-wanted // inner)
    return x[(0,) * axis + (slice(0, rows),)].reshape(-1)[:wanted]


def _header(kind: str, shape: Iterable[int], dtype: str, device: str, count: int) -> Summary:
    """The keys every tensor summary has; preview and stats are filled in when there are values."""
    return {
        "type": _TENSOR_TYPES[kind],
        "shape": [int(n) for n in shape],
        "dtype": dtype,
        "device": device,
        "numel": int(count),
        "preview": [],
        "stats": None,
    }


def _fill(
    out: Summary, preview: Callable[[], Iterable[object]], stats: Callable[[], Stats | None]
) -> None:
    """Preview then stats; whichever fails keeps its default and says why in ``note``."""
    try:
        out["preview"] = [_json_value(v) for v in preview()]
    except Exception as exc:
        out["note"] = f"preview failed: {_describe_exception(exc)}"
        return
    try:
        out["stats"] = stats()
    except Exception as exc:
        out["note"] = f"statistics failed: {_describe_exception(exc)}"


# -- torch ----------------------------------------------------------------------------------


def _torch_summary(t: Any) -> Summary:
    torch = sys.modules["torch"]
    with torch.no_grad():
        out = _header(
            "torch", t.shape, str(t.dtype).removeprefix("torch."), str(t.device), t.numel()
        )
        out["requires_grad"] = bool(t.requires_grad)
        note = _torch_unsupported(t, torch)
        if note is not None:
            out["note"] = note
            if t.is_quantized and out["numel"]:
                with contextlib.suppress(Exception):
                    head = _head(t, out["numel"]).dequantize()
                    out["preview"] = [_json_value(v) for v in _torch_values(head)]
        elif out["numel"]:
            plain = _torch_plain(t, torch)
            _fill(
                out,
                lambda: _torch_values(_head(plain, plain.numel())),
                lambda: _torch_stats(plain, torch),
            )
    return out


def _torch_plain(t: Any, torch: ModuleType) -> Any:
    """A detached plain ``torch.Tensor`` view: no autograd, no subclass ``__torch_function__``."""
    if type(t) is not torch.Tensor:
        t = t.as_subclass(torch.Tensor)
    return t.detach()


def _torch_unsupported(t: Any, torch: ModuleType) -> str | None:
    """Why this tensor's values are not read, or None when they can be."""
    if t.is_meta:
        return None if t.numel() == 0 else "meta tensor: no values"
    if t.layout != torch.strided:
        return f"{str(t.layout).removeprefix('torch.')} tensor: statistics not computed"
    if t.is_quantized:
        return "quantized tensor: statistics not computed (preview dequantized)"
    if type(t).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        # FakeTensor, DTensor and other wrappers: reading them may trace, or run collectives.
        return f"{type(t).__name__} tensor subclass: statistics not computed"
    return None


def _torch_values(head: Any) -> list[Any]:
    head = head.cpu()
    if head.is_floating_point():
        head = head.double()  # float8 and friends have no tolist
    return head.tolist()


def _torch_memory_order(t: Any) -> Any:
    """The same values with axes in memory order: a transposed tensor reads contiguously."""
    if not t.is_contiguous() and t.dim() > 1:
        order = sorted(range(t.dim()), key=lambda d: t.stride(d), reverse=True)
        t = t.permute(order)
    return t.view(-1) if t.is_contiguous() else t


def _torch_stats(t: Any, torch: ModuleType) -> Stats:
    values = _torch_memory_order(t)
    limit = CHUNK if t.device.type == "cpu" else ACCELERATOR_CHUNK
    if t.dtype == torch.bool:
        true = sum(int(torch.count_nonzero(c)) for c in _chunks(values, limit))
        return _bool_stats(t.numel(), true)
    moments = _Moments()
    if t.is_floating_point() or t.is_complex():
        work = torch.float64 if t.dtype in (torch.float64, torch.complex128) else torch.float32
        for chunk in _chunks(values, limit):
            real = chunk.abs() if chunk.is_complex() else chunk
            _torch_float_chunk(real.to(work), torch, moments)
    else:
        # MPS has no float64; everywhere else integers are averaged in double.
        work = torch.float32 if t.device.type == "mps" else torch.float64
        for chunk in _chunks(values, limit):
            _torch_int_chunk(chunk, work, torch, moments)
    return moments.stats()


def _torch_float_chunk(c: Any, torch: ModuleType, moments: _Moments) -> None:
    """One chunk: two host syncs and no temporary in the common, all-finite case.

    aminmax propagates NaN and infinity, so finite extremes prove the chunk finite without
    a mask (an ``isfinite`` pass costs more than all the statistics on CPU).
    """
    n = c.numel()
    low, high = torch.stack(torch.aminmax(c)).tolist()
    if math.isfinite(low) and math.isfinite(high):
        mean, var = torch.stack([c.mean(), c.var(correction=0)]).tolist()
        moments.add(n, mean, var * n, low, high)
        return
    finite = c.abs() < math.inf  # NaN compares false; twice as fast as isfinite on CPU
    count = int(torch.count_nonzero(finite))
    nan = int(torch.count_nonzero(torch.isnan(c)))
    moments.nan += nan
    moments.inf += n - count - nan
    if count == 0:
        return
    # Masked reductions: a boolean-indexed copy is slow on CPU and unbounded on devices.
    mean = float(torch.where(finite, c, 0.0).sum()) / count
    low = torch.where(finite, c, math.inf).min()
    high = torch.where(finite, c, -math.inf).max()
    # Non-finite slots take the mean, where they add nothing to the squared deviations.
    var = torch.where(finite, c, mean).var(correction=0)
    low, high, var = torch.stack([low, high, var]).tolist()
    moments.add(count, mean, var * n, low, high)


def _torch_int_chunk(c: Any, work: Any, torch: ModuleType, moments: _Moments) -> None:
    low, high = _torch_int_extremes(c, torch)
    n = c.numel()
    f = c.to(work)
    mean, var = torch.stack([f.mean(), f.var(correction=0)]).tolist()
    moments.add(n, mean, var * n, low, high)


def _torch_int_extremes(c: Any, torch: ModuleType) -> tuple[int, int]:
    """Exact integer extremes; torch lacks min/max for uint16/32/64 on CPU."""
    if c.dtype == torch.uint64:
        # Flipping the sign bit maps unsigned order onto signed order, exactly.
        signed = torch.bitwise_xor(c.view(torch.int64), -(1 << 63))
        low, high = torch.aminmax(signed)
        return int(low) + (1 << 63), int(high) + (1 << 63)
    if c.dtype in (torch.uint16, torch.uint32):
        c = c.to(torch.int64)
    low, high = torch.aminmax(c)
    return int(low), int(high)


# -- MLX ------------------------------------------------------------------------------------


NOT_EVALUATED = "not evaluated (a lazy MLX array): eval computes it, mx.eval(x) in the script"
TRACER = (
    "a tracer inside mx.compile / vmap / grad: its values exist only when the transformed "
    "function runs (break outside it, or mx.disable_compile())"
)
EVALUATED_NOW = "was lazy: evaluated now, as asked"


def _mlx_summary(a: Any, force: bool = False) -> Summary:
    """Shape and dtype always; values and statistics only for an evaluated array, unless
    ``force`` (``eval``: the user asked for the value), which evaluates it and says so.

    A summary must not change what the script does: evaluating a lazy array allocates it
    (a 64 MB array for a variable listing), runs its graph early and splits the graph MLX
    would have fused.  Inside ``mx.compile`` arrays are tracers and cannot be evaluated at all.
    """
    mx = sys.modules["mlx.core"]
    dtype = str(a.dtype).removeprefix("mlx.core.")
    out = _header("mlx", a.shape, dtype, _mlx_device(mx), a.size)
    lazy = _mlx_lazy(a, mx)
    if lazy:
        if not force:
            out["evaluated"] = False
            out["note"] = NOT_EVALUATED
            return out
        try:
            mx.eval(a)
        except Exception as exc:
            out["evaluated"] = False
            out["note"] = TRACER if _is_transform_error(exc) else _describe_exception(exc)
            return out
        out["note"] = EVALUATED_NOW
    if out["numel"]:
        _fill(out, lambda: _head(a, a.size).tolist(), lambda: _mlx_stats(a, mx))
        if _is_transform_error_text(out.get("note", "")):  # a compile tracer's input
            out["evaluated"] = False
            out["note"] = TRACER
    return out


def _mlx_lazy(a: Any, mx: ModuleType) -> bool | None:
    """Whether ``a`` still holds an unevaluated graph, found without evaluating it.

    MLX has no public flag for it; ``export_to_dot`` writes "the unevaluated inputs of the
    outputs", so an operation node (an edge, ``->``) in its output means a graph still to
    run, and an evaluated array (or a constant) writes a lone node.  None: cannot tell
    (an MLX without ``export_to_dot``), and the caller treats it as evaluated.
    """
    export = getattr(mx, "export_to_dot", None)
    if export is None:
        return None
    sink = _DotSink()
    export(sink, a)
    return "->" in sink.text


class _DotSink:
    """A file-like object ``export_to_dot`` writes to."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)


def _is_transform_error(exc: BaseException) -> bool:
    return _is_transform_error_text(str(exc))


def _is_transform_error_text(text: str) -> bool:
    return "function transformations" in text or "during compile" in text


def _mlx_device(mx: ModuleType) -> str:
    """``Device(gpu, 0)`` reads ``gpu``: MLX arrays have no device, computations do."""
    device = str(mx.default_device())
    return device.removeprefix("Device(").removesuffix(")").split(",")[0].strip()


def _mlx_stats(a: Any, mx: ModuleType) -> Stats:
    if a.dtype == mx.bool_:
        true = sum(int(mx.sum(c).item()) for c in _chunks(a, CHUNK))
        return _bool_stats(a.size, true)
    integer = mx.issubdtype(a.dtype, mx.integer)
    work = mx.float64 if integer or a.dtype == mx.float64 else mx.float32
    moments = _Moments()
    # float64 exists on MLX's CPU only; with unified memory the CPU reads the same buffer.
    with mx.stream(mx.cpu) if work == mx.float64 else contextlib.nullcontext():
        for chunk in _chunks(a, CHUNK):
            flat = chunk.reshape(-1)
            known: tuple[int, int] | None = None
            if integer:
                low_a, high_a = mx.min(flat), mx.max(flat)
                mx.eval(low_a, high_a)
                known = int(low_a.item()), int(high_a.item())
            elif mx.issubdtype(flat.dtype, mx.complexfloating):
                flat = mx.abs(flat)
            _mlx_chunk(flat.astype(work), mx, moments, known)
    return moments.stats()


def _mlx_sum(v: Any, mx: ModuleType) -> Any:
    """Partial sums of a flat array: a small lazy array, added up in double on the host.

    MLX's CPU reductions accumulate float32 in sequence: the mean of 1e6 equal values comes
    out 1% off, the std of 1e8 normal values 15% off.  Summing rows of _MLX_ROW values,
    level by level, keeps every float32 accumulation short.
    """
    while v.size > _MLX_ROW:
        rows = v.size // _MLX_ROW
        head = v[: rows * _MLX_ROW].reshape(rows, _MLX_ROW).sum(axis=1)
        tail = v[rows * _MLX_ROW :]
        v = head if tail.size == 0 else mx.concatenate([head, tail.sum(keepdims=True)])
    return v


def _fsum(partials: list[float]) -> float:
    """Exact sum of partial sums; NaN when any is non-finite (fsum rejects inf - inf)."""
    return math.fsum(partials) if all(map(math.isfinite, partials)) else math.nan


def _mlx_chunk(v: Any, mx: ModuleType, moments: _Moments, known: tuple[int, int] | None) -> None:
    """One flat chunk, in two passes (Chan, Golub and LeVeque's corrected two-pass).

    The first pass sums the values: a finite sum proves every value finite (NaN and
    infinities propagate through sums), and gives a first mean.  The second sums the
    deviations from that mean and their squares: the first correcting the mean for the
    float32 error of the first pass, the second giving the variance.  ``known``: the exact
    extremes when already known (integers).
    """
    n = v.size
    extremes = [mx.min(v), mx.max(v)] if known is None else []
    partials = _mlx_sum(v, mx)
    mx.eval(partials, *extremes)
    total, count = _fsum(partials.tolist()), n
    if not math.isfinite(total):
        finite = mx.isfinite(v)
        count = int(mx.sum(finite).item())
        nan = int(mx.sum(mx.isnan(v)).item())
        moments.nan += nan
        moments.inf += n - count - nan
        if count == 0:
            return
        total = _fsum(_mlx_sum(mx.where(finite, v, 0.0), mx).tolist())
        if known is None:
            extremes = [
                mx.min(mx.where(finite, v, math.inf)),
                mx.max(mx.where(finite, v, -math.inf)),
            ]
        shift = mx.array(total / count, dtype=v.dtype)
        v = mx.where(finite, v, shift)  # no deviation from the shift, no weight in the sums
    else:
        shift = mx.array(total / count, dtype=v.dtype)
    deviations = v - shift
    first, second = _mlx_sum(deviations, mx), _mlx_sum(mx.square(deviations), mx)
    mx.eval(first, second, *extremes)
    correction = _fsum(first.tolist())
    mean = float(shift.item()) + correction / count
    m2 = max(_fsum(second.tolist()) - correction * correction / count, 0.0)
    if known is None:
        low, high = float(extremes[0].item()), float(extremes[1].item())
    else:
        low, high = known
    moments.add(count, mean, m2, low, high)


# -- numpy ----------------------------------------------------------------------------------


def _numpy_summary(a: Any) -> Summary:
    np = sys.modules["numpy"]
    if type(a) is not np.ndarray:  # np.matrix never drops to 1-D; masked arrays: raw data
        a = a.view(np.ndarray)
    out = _header("numpy", a.shape, str(a.dtype), "cpu", a.size)
    if out["numel"]:
        _fill(out, lambda: _head(a, a.size).tolist(), lambda: _numpy_stats(a, np))
        if out["stats"] is None and "note" not in out:
            out["note"] = f"no statistics for dtype {a.dtype}"
    return out


def _numpy_work(dtype: Any, np: ModuleType) -> tuple[str, Any] | None:
    """(kind, dtype to reduce in) for numeric dtypes, None for text, objects, dates, records."""
    if dtype.type.__module__.startswith("ml_dtypes"):  # bfloat16, float8_*, int4, ...
        if dtype.name.startswith(("int", "uint")):
            return "i", np.int64
        return "f", np.float32
    if dtype.kind in "biu":
        return dtype.kind, None
    if dtype.kind in "fc":
        return "f", None  # float16 is summed in float64 below, without a converted copy
    return None


def _numpy_memory_order(a: Any, np: ModuleType) -> Any:
    """The same values with axes in memory order, flat when that is a view."""
    if not a.flags.c_contiguous and a.ndim > 1:
        order = sorted(range(a.ndim), key=lambda d: abs(a.strides[d]), reverse=True)
        a = np.transpose(a, order)
    return a.reshape(-1) if a.flags.c_contiguous else a


def _numpy_stats(a: Any, np: ModuleType) -> Stats | None:
    work = _numpy_work(a.dtype, np)
    if work is None:
        return None
    kind, convert = work
    values = _numpy_memory_order(a, np)
    if kind == "b":
        true = sum(int(np.count_nonzero(c)) for c in _chunks(values, CHUNK))
        return _bool_stats(a.size, true)
    moments = _Moments()
    for chunk in _chunks(values, CHUNK):
        v = np.abs(chunk) if chunk.dtype.kind == "c" else chunk
        _numpy_chunk(v if convert is None else v.astype(convert), kind, np, moments)
    return moments.stats()


def _numpy_chunk(v: Any, kind: str, np: ModuleType, moments: _Moments) -> None:
    """Sums in float64 (buffered casts, no full copy); a finite sum proves the chunk finite."""
    n = int(v.size)
    total, count = float(np.sum(v, dtype=np.float64)), n
    if kind == "f" and not math.isfinite(total):
        finite = np.isfinite(v)
        count = int(np.count_nonzero(finite))
        nan = int(np.count_nonzero(np.isnan(v)))
        moments.nan += nan
        moments.inf += n - count - nan
        if count == 0:
            return
        v = v[finite]
        total = float(np.sum(v, dtype=np.float64))
    mean = total / count
    deviations = np.ravel(np.subtract(v, mean, dtype=np.float64))
    m2 = float(np.dot(deviations, deviations))
    cast = int if kind in "iu" else float
    moments.add(count, mean, m2, cast(v.min()), cast(v.max()))


# -- everything else ------------------------------------------------------------------------

_TENSOR_SUMMARIES: dict[str, Callable[[object], Summary]] = {
    "torch": _torch_summary,
    "mlx": _mlx_summary,
    "numpy": _numpy_summary,
}
_FORCED_SUMMARIES: dict[str, Callable[[object], Summary]] = {
    **_TENSOR_SUMMARIES,
    "mlx": lambda a: _mlx_summary(a, force=True),
}
_SIZED = (list, tuple, dict, set, frozenset, str, bytes, bytearray, collections.deque, range)


def _scalar_value(value: Any) -> tuple[bool, JsonScalar]:
    """(True, JSON value) for None, bools, ints, floats, short strings and numpy scalars.

    Subclasses (IntEnum, numpy.float64) are reduced to the plain builtin value.
    """
    kind = type(value)
    if value is None or kind is bool:
        return True, value
    if issubclass(kind, int):
        plain = int.__index__(value)
        return plain.bit_length() <= 3000, plain  # huge ints neither print nor parse
    if issubclass(kind, float):
        return True, _json_number(float.__float__(value))
    if issubclass(kind, str):
        text = str.__str__(value)
        return len(text) <= REPR_LIMIT, text
    numpy = sys.modules.get("numpy")
    if numpy is not None and issubclass(kind, numpy.number | numpy.bool_):
        item = value.item()
        if isinstance(item, bool | int | float):
            return _scalar_value(item)
    return False, None


def _parameter_count(value: Any) -> int | None:
    """Parameters of a torch or MLX module; None for anything else."""
    nn = sys.modules.get("torch.nn")
    if nn is not None and issubclass(type(value), nn.Module):
        return sum(p.numel() for p in value.parameters())
    mlx_nn, utils = sys.modules.get("mlx.nn"), sys.modules.get("mlx.utils")
    if mlx_nn is not None and utils is not None and issubclass(type(value), mlx_nn.Module):
        return sum(v.size for _, v in utils.tree_flatten(value.parameters()))
    return None


def _plain_summary(value: Any) -> Summary:
    """Type and bounded repr; an optional key is left out when computing it fails."""
    out: Summary = {"type": type_name(value), "repr": safe_repr(value, REPR_LIMIT)}
    with contextlib.suppress(Exception):
        known, scalar = _scalar_value(value)
        if known:
            out["value"] = scalar
    with contextlib.suppress(Exception):
        if issubclass(type(value), _SIZED):
            out["len"] = int(len(value))
    with contextlib.suppress(Exception):
        count = _parameter_count(value)
        if count is not None:
            out["parameters"] = int(count)
    return out


def summarize(value: object, force: bool = False) -> Summary:
    """A JSON-ready (strict: no NaN) description of ``value``; never raises.

    A lazy MLX array is described by shape and dtype with ``"evaluated": false`` and a
    ``note``, never evaluated, unless ``force`` (``eval``'s result: the user asked for the
    value), which evaluates it and says so in ``note``.

    Tensors: ``type``, ``shape``, ``dtype``, ``device``, ``numel``, ``preview`` (the first
    values in row-major order) and ``stats`` (``min``, ``max``, ``mean``, ``std``, ``nan``,
    ``inf``, see the module docstring, or None when there are no values), plus
    ``requires_grad`` for torch and ``note`` when something could not be read.  Anything
    else: ``type`` and a bounded ``repr``, plus ``len`` for builtin containers, ``value``
    for plain JSON scalars and ``parameters`` for torch and MLX modules.
    """
    try:
        framework = _safe_framework(value)
        if framework is None:
            return _plain_summary(value)
        try:
            return (_FORCED_SUMMARIES if force else _TENSOR_SUMMARIES)[framework](value)
        except Exception as exc:  # an exotic tensor must not break the session
            return {
                "type": _TENSOR_TYPES[framework],
                "repr": safe_repr(value, REPR_LIMIT),
                "note": f"summary failed: {_describe_exception(exc)}",
            }
    except Exception as exc:
        return {"type": "object", "repr": "<unavailable>", "note": _describe_exception(exc)}


def one_line(value: object, max_chars: int = 200, force: bool = False) -> str:
    """One line for variable lists and eval results; never raises, never over ``max_chars``.

    Tensors: ``torch.Tensor float32[2, 3] cpu min=-1.2 max=3.4 mean=0.5 std=1.1 [0.1, …]``
    (4 significant digits; ``nan=``/``inf=`` only when non-zero).  Anything else: its repr
    with line breaks folded into spaces.
    """
    try:
        if _safe_framework(value) is None:
            text, total = _repr_text(value, max_chars)
            clipped = text[: 4 * max_chars + 100]  # folding never needs more
            if total is None and len(clipped) < len(text):
                total = len(text)
            return _truncate(_fold(clipped), max_chars, total)
        return _truncate(_tensor_line(summarize(value, force)), max_chars)
    except Exception as exc:
        return _truncate(f"<summary failed: {_describe_exception(exc)}>", max_chars)


def one_line_from_summary(described: Summary, max_chars: int = 200) -> str:
    """The one line of a tensor whose ``summarize`` result is at hand: stats computed once."""
    try:
        return _truncate(_tensor_line(described), max_chars)
    except Exception as exc:
        return _truncate(f"<summary failed: {_describe_exception(exc)}>", max_chars)


def _fold(text: str) -> str:
    """Multi-line reprs (modules, data frames) on one line: breaks and indents become a space."""
    return re.sub(r"\s*\n\s*", " ", text)


def _tensor_line(s: Summary) -> str:
    if "shape" not in s:
        return f"{s['type']} <{s.get('note', 'no summary')}>"
    shape = ", ".join(str(n) for n in s["shape"])
    parts = [f"{s['type']} {s['dtype']}[{shape}] {s['device']}"]
    stats: Mapping[str, object] = s.get("stats") or {}
    for key in ("min", "max", "mean", "std"):
        if stats.get(key) is not None:
            parts.append(f"{key}={_short(stats[key])}")
    parts += [f"{key}={stats[key]}" for key in ("nan", "inf") if stats.get(key)]
    if s["preview"]:
        more = ", …" if s["numel"] > len(s["preview"]) else ""
        parts.append("[" + ", ".join(_short(v) for v in s["preview"]) + more + "]")
    if "note" in s and (not stats or s["note"] == EVALUATED_NOW):
        parts.append(f"({s['note']})")
    return " ".join(parts)


def _short(x: object) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def relative(difference: float, reference: float) -> float | None:
    """``|difference|`` on the reference's scale: how every relative error mldbg reports
    is measured (``compare``'s ``rel_rms`` against A, ``eval --against`` and
    ``compare-checkpoints`` against the session or run set against).  0 for no difference;
    None (unbounded) for a difference from an exact zero."""
    if difference == 0:
        return 0.0
    return abs(difference) / abs(reference) if reference else None
