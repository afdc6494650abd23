"""What a step is waiting for, in a few fields (the way ``bdb`` keeps it small)."""

from __future__ import annotations

from dataclasses import dataclass
from types import CodeType, FrameType

from .paths import canonical_code_file, is_library_file


def frame_depth(frame: FrameType | None) -> int:
    depth = 0
    while frame is not None:
        depth += 1
        frame = frame.f_back
    return depth


@dataclass
class StepRequest:
    """A pending stop that is not a breakpoint.

    kind: ``entry`` (first line of ``entry_code``), ``into`` (next line anywhere on this
    thread), ``over`` (next line in this frame or a caller), ``out`` (next line in a
    caller).  ``depth`` is the stack depth of the frame the step began in; comparing
    depths handles returns, exceptions and generators without tracking every frame.
    Just-my-code skips library frames, unless the step began in one: someone stepping
    inside transformers is debugging transformers.
    """

    kind: str
    thread: int
    frame: FrameType | None = None
    depth: int = 0
    into_libraries: bool = False
    entry_code: CodeType | None = None

    @property
    def reason(self) -> str:
        return "entry" if self.kind == "entry" else "step"

    @classmethod
    def from_frame(
        cls, kind: str, thread: int, frame: FrameType, into_libraries: bool
    ) -> StepRequest:
        started_in_library = is_library_file(canonical_code_file(frame.f_code.co_filename))
        return cls(kind, thread, frame, frame_depth(frame), into_libraries or started_in_library)

    def wants_code(self, code: CodeType, file: str) -> bool:
        """Whether a new frame running ``code`` needs line events for this step."""
        if self.kind == "entry":
            return code is self.entry_code
        if self.kind == "into":
            return self.into_libraries or not is_library_file(file)
        return False

    def should_stop(self, frame: FrameType, file: str, thread: int) -> bool:
        if thread != self.thread:
            return False
        if self.kind == "entry":
            return frame.f_code is self.entry_code
        if not self.into_libraries and is_library_file(file):
            return False
        if self.kind == "into":
            return True
        if self.kind == "over" and frame is self.frame:
            return True
        return frame_depth(frame) < self.depth
