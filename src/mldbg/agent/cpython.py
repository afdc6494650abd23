"""The two things the 3.10/3.11 backend needs that pure Python cannot do, through ctypes.

1. **Turn tracing on in another thread.**  ``sys.settrace`` only affects the calling
   thread and ``threading.settrace`` only threads started later; 3.12 added
   ``threading.settrace_all_threads``.  Its implementation is a loop over thread states
   calling ``_PyEval_SetTrace(tstate, trampoline, callable)``, a function CPython exports
   since 3.9.  The trampoline is the C function ``sys.settrace`` installs (it calls the
   Python callable for "call" and ``frame.f_trace`` for the other events); it is static,
   so it is read back from this thread's state right after a ``sys.settrace``: the only
   layout fact used is that ``c_tracefunc`` sits two pointers before ``c_traceobj``,
   true of 3.10 and 3.11 and checked here before anything is trusted.
2. **Replace one constant of a code object.**  A frame that is already running (the
   script's module body, stopped at its first line; a function that defines closures)
   creates its nested functions from ``co_consts``; putting an instrumented code object
   in that tuple's slot is the only way such a frame creates instrumented functions.

Anything unexpected raises :class:`InterpreterUnsupported` at construction, and the debugger then
uses the plain ``settrace`` backend instead: a wrong guess here must never crash the
script or miss a breakpoint.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any

from ..errors import InterpreterUnsupported

_PTR = ctypes.sizeof(ctypes.c_void_p)
_SCAN_WORDS = 64  # the trace fields sit well inside the first 64 pointers of PyThreadState

# sys.settrace's function: (frame, event, the event's argument) -> the frame's local function
TraceFunction = Callable[[FrameType, str, Any], "TraceFunction | None"]


@contextlib.contextmanager
def _no_thread_switch() -> Iterator[None]:
    """Keep the GIL for a few microseconds of pure bookkeeping (no I/O, no blocking)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def _probe(frame: FrameType, event: str, arg: object) -> None:
    return None


def _probe2(frame: FrameType, event: str, arg: object) -> None:
    return None


class CPython:
    """Per-thread trace functions and code-constant replacement for CPython 3.10 / 3.11."""

    def __init__(self) -> None:
        if sys.implementation.name != "cpython" or not (3, 10) <= sys.version_info[:2] < (3, 12):
            raise InterpreterUnsupported(
                f"needs CPython 3.10 or 3.11, not {sys.version.split()[0]}"
            )
        try:
            api = ctypes.pythonapi
            self._set_trace = api._PyEval_SetTrace
            # (tstate, C trace function, trace object): the object as a raw address, so
            # that None can be passed as NULL; the function takes its own reference.
            self._set_trace.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            self._set_trace.restype = ctypes.c_int
            get = api.PyThreadState_Get
            get.restype = ctypes.c_void_p
            self._this_tstate = get
            interp = api.PyThreadState_GetInterpreter
            interp.argtypes = [ctypes.c_void_p]
            interp.restype = ctypes.c_void_p
            head = api.PyInterpreterState_ThreadHead
            head.argtypes = [ctypes.c_void_p]
            head.restype = ctypes.c_void_p
            nxt = api.PyThreadState_Next
            nxt.argtypes = [ctypes.c_void_p]
            nxt.restype = ctypes.c_void_p
            frame = api.PyThreadState_GetFrame
            frame.argtypes = [ctypes.c_void_p]
            frame.restype = ctypes.c_void_p  # a new reference: released with Py_DecRef
            self._incref = api.Py_IncRef
            self._incref.argtypes = [ctypes.c_void_p]
            self._decref = api.Py_DecRef
            self._decref.argtypes = [ctypes.c_void_p]
        except AttributeError as exc:
            raise InterpreterUnsupported(f"this Python does not export {exc}") from None
        self._interp_of, self._head, self._next, self._frame_of = interp, head, nxt, frame
        self._lock = threading.Lock()
        self._trampoline = self._find_trampoline()

    # -- discovery ----------------------------------------------------------------------------

    def _find_trampoline(self) -> int:
        previous = sys.gettrace()
        tstate = self._this_tstate()
        try:
            sys.settrace(None)
            before = list((ctypes.c_void_p * _SCAN_WORDS).from_address(tstate))
            sys.settrace(_probe)
            during = list((ctypes.c_void_p * _SCAN_WORDS).from_address(tstate))
            sys.settrace(_probe2)
            during2 = list((ctypes.c_void_p * _SCAN_WORDS).from_address(tstate))
        finally:
            sys.settrace(previous)
        slots = [i for i, word in enumerate(during) if word == id(_probe)]
        if len(slots) != 1 or slots[0] < 2:
            raise InterpreterUnsupported("could not find the trace object in the thread state")
        obj = slots[0]
        func = obj - 2
        if not (
            during2[obj] == id(_probe2)
            and before[obj] is None
            and before[func] is None
            and during[func]
            and during[func] == during2[func]
        ):
            raise InterpreterUnsupported("the thread state does not have the expected trace fields")
        return int(during[func])

    def _tstates(self) -> dict[int, int]:
        """Thread ident -> thread state address, matched through each thread's top frame.

        ``sys._current_frames()`` and ``PyThreadState_GetFrame`` both return the innermost
        complete frame of a thread, so the frame object's address names the thread; no
        field of the thread state is read.
        """
        tops = {id(frame): ident for ident, frame in sys._current_frames().items()}
        found: dict[int, int] = {}
        tstate = self._head(self._interp_of(self._this_tstate()))
        while tstate:
            frame = self._frame_of(tstate)
            if frame:
                ident = tops.get(frame)
                self._decref(frame)
                if ident is not None:
                    found[ident] = tstate
            tstate = self._next(tstate)
        return found

    # -- what the backend uses ---------------------------------------------------------------

    def set_thread_trace(self, idents: list[int], func: TraceFunction | None) -> list[int]:
        """Install ``func`` (``None``: remove) as the trace function of these threads.

        The current thread uses ``sys.settrace``.  Returns the idents that were set;
        a thread that ended meanwhile is simply absent.
        """
        me = threading.get_ident()
        done = []
        with self._lock, _no_thread_switch():
            # Threads are matched to thread states by their top frame, so no other thread
            # may run (and call or return) between the two readings.
            states = self._tstates() if any(ident != me for ident in idents) else {}
            for _ in range(3):  # a thread that moved between the two readings: read again
                if all(ident == me or ident in states for ident in idents):
                    break
                alive = sys._current_frames()
                if all(ident == me or ident in states or ident not in alive for ident in idents):
                    break
                states.update(self._tstates())
            for ident in idents:
                if ident == me:
                    sys.settrace(func)
                    done.append(ident)
                    continue
                tstate = states.get(ident)
                if tstate is None:
                    continue
                if func is None:
                    rc = self._set_trace(tstate, None, None)
                else:
                    rc = self._set_trace(tstate, self._trampoline, id(func))
                if rc == 0:
                    done.append(ident)
        return done

    def replace_const(self, code: CodeType, index: int, value: object) -> object:
        """Put ``value`` in ``code.co_consts[index]``; returns what was there (see below)."""
        return replace_const(code, index, value)


def replace_const(code: CodeType, index: int, value: object) -> object:
    """Put ``value`` in ``code.co_consts[index]``; returns what was there.

    Any CPython version: a tuple's items follow its header (``tuple.__basicsize__``), and
    the old item's address is checked before anything is written.  The caller keeps the
    old value alive (it restores it later), so dropping the tuple's reference is safe.
    """
    if sys.implementation.name != "cpython":
        raise InterpreterUnsupported("constants can only be replaced in CPython")
    consts = code.co_consts
    if not 0 <= index < len(consts):
        raise IndexError(index)
    slot = ctypes.c_void_p.from_address(id(consts) + tuple.__basicsize__ + index * _PTR)
    old = consts[index]
    if slot.value != id(old):
        raise InterpreterUnsupported("co_consts does not have the expected layout")
    incref, decref = ctypes.pythonapi.Py_IncRef, ctypes.pythonapi.Py_DecRef
    incref.argtypes = decref.argtypes = [ctypes.c_void_p]  # as CPython() sets them: addresses
    incref(id(value))
    slot.value = id(value)
    decref(id(old))
    return old
