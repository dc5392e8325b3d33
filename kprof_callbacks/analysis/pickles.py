"""A restricted, streaming reader of the pickles ``torch.cuda.memory._dump_snapshot`` writes: nothing but builtin
values (dicts, lists, tuples, strings, numbers), read from a memory map, a snapshot's history handed on one entry
at a time instead of built as a list.

``pickle.load`` would run any code a pickle names (a logdir may hold files from anywhere) and build the whole object
graph: a 1 GB snapshot becomes several GB of dicts and takes seconds per 100 MB. This reader runs the pickle
machine itself on the opcodes that build plain values and refuses every other (globals, reduce, build, persistent
ids, extensions: `PickleError`). The lists under the top-level ``device_traces`` key go to a callback entry by
entry; once one entry has been read, the rest that are laid out like it (the same keys in the same order, numbers,
strings and frame lists already seen) are matched by one regular expression each, in C, and their frame lists are
kept as byte ranges of the file, decoded only for the entries the caller asks about (`frames`).
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .pickle_ops import FLOAT, HANDLERS, TRACES_KEY, Lazy, Outer, PickleError, Sink, pop_mark

__all__ = ["TRACES_KEY", "Lazy", "PickleError", "Reader", "read"]

_REF = rb"h.|j...."
_INT = rb"K.|M..|J....|" + b"|".join(rb"\x8a" + bytes([n]) + b"." * n for n in range(1, 9))
_VALUE = {
    int: _INT,
    str: _REF,
    type(None): rb"N",
    float: rb"G........",
    bool: rb"\x88|\x89",
    list: _REF + rb"|\]\x94(?:\((?:(?:j....)++|(?:h.)++)++e)*+(?:(?:" + _REF + rb")a)?",  # runs: faster
}
_TOKENS = re.compile(rb"h(.)|j(....)|[(ea]", re.S)
_INT_CODE, _LIST_CODE, _FLOAT_CODE, _OTHER_CODE, _ABSENT = range(5)
_CODES = {
    int: _INT_CODE,
    list: _LIST_CODE,
    float: _FLOAT_CODE,
    str: _OTHER_CODE,
    type(None): _OTHER_CODE,
    bool: _OTHER_CODE,
}


def _ref(index: int) -> bytes:
    return b"h" + bytes([index]) if index < 256 else b"j" + index.to_bytes(4, "little")


class Reader:
    """Run the pickle in ``data``; ``on_entry(device, values)`` gets each history entry as the values of ``fields``
    (a list among them may be a `Lazy`)."""

    def __init__(
        self,
        data: bytes | mmap.mmap,
        on_entry: Callable[[int, tuple], None],
        fields: tuple[str, ...],
    ) -> None:
        self.data, self.on_entry, self.fields = data, on_entry, fields
        self.lists: list[int] = []  # the template's groups that hold lists
        self.picks: list[tuple[int, int]] = []  # per field asked for: how to read it, its group
        self.memo: list[Any] = []
        self.strings: dict[str, int] = {}  # memoized strings -> their memo index (keys are matched as references)
        self.template: re.Pattern | None = None  # an entry, after an optional end of batch and start of the next
        self.learned = False
        self.protocol = 0
        self.outer: Outer | None = None
        self.fast = 0  # entries read by the template

    # -- the fast path ----------------------------------------------------------------------------------------
    def _learn(self, entry: dict[str, Any]) -> None:
        """A pattern for entries laid out as ``entry``: its keys (memoized strings) in order, values of its types
        (numbers, strings read before, lists of values read before)."""
        self.learned = True
        if self.protocol < 4:  # its memo opcodes carry their index: read by the opcodes
            return
        parts, fields = [rb"\}\x94\("], {}
        for k, (key, value) in enumerate(entry.items(), 1):
            kind = list if isinstance(value, Lazy) else type(value)
            if key not in self.strings or kind not in _VALUE:
                return
            parts.append(re.escape(_ref(self.strings[key])) + b"(" + _VALUE[kind] + b")")
            fields[key] = (_CODES[kind], k)
        self.lists = [k for code, k in fields.values() if code == _LIST_CODE]
        self.picks = [fields.get(name, (_ABSENT, 0)) for name in self.fields]
        self.template = re.compile(rb"(?:e\()?(?:\x95.{8})?" + b"".join(parts) + rb"u", re.S)

    def _match(self, pos: int) -> tuple[int, tuple | None]:
        """Read the entry at ``pos`` with the template: the position after it and the entry, or (-1, None) when it
        does not match."""
        m = self.template.match(self.data, pos)
        return (-1, None) if m is None else (m.end(), self._entry(m))

    def _stream(self, pos: int, sink: Sink) -> int:
        """Hand on the entries of a batch (and of the batches after it) from ``pos`` while the template matches them
        one after the other; the position of the first that it does not."""
        add, device, entry, match, data = sink.add, sink.device, self._entry, self.template.match, self.data
        m = match(data, pos)
        while m is not None:
            add(device, entry(m))
            pos = m.end()
            m = match(data, pos)
        return pos

    def _entry(self, m: re.Match) -> tuple:
        """The fields asked for of the entry the template matched; its memoized values (itself, new lists) counted."""
        memo = self.memo
        memo.append(None)  # the entry itself: torch's snapshots never refer to a history's entry again
        groups = m.groups()
        new: dict[int, Lazy] = {}
        for k in self.lists:  # a new list of references: kept as their byte range
            if groups[k - 1][0] == 0x5D:
                new[k] = Lazy(m.start(k) + 2, m.end(k))
                memo.append(new[k])
        self.fast += 1
        out = []
        for code, k in self.picks:
            raw = groups[k - 1] if k else None
            if code == _INT_CODE:
                op = raw[0]
                out.append(
                    raw[1] if op == 0x4B else int.from_bytes(raw[2 if op == 0x8A else 1 :], "little", signed=op != 0x4D)
                )
            elif code == _ABSENT:
                out.append(None)
            elif k in new:
                out.append(new[k])
            else:
                out.append(self._value(code, raw))
        return tuple(out)

    def _value(self, code: int, raw: bytes) -> Any:
        """A field's value other than a number or a new list, from the bytes the template matched."""
        op = raw[0]
        if op == 0x68 or op == 0x6A:  # a reference: a string, or a list read before
            return self.memo[raw[1] if op == 0x68 else int.from_bytes(raw[1:5], "little")]
        if code == _FLOAT_CODE:
            return FLOAT.unpack(raw[1:])[0]
        return None if op == 0x4E else op == 0x88

    def resolve(self, frames: Any) -> list:
        """A frame list: as it is, or a `Lazy` one decoded (its items are memoized values)."""
        if not isinstance(frames, Lazy):
            return frames if isinstance(frames, list) else []
        out = []
        for m in _TOKENS.finditer(self.data, frames.lo, frames.hi):
            if m.group(1) is not None:
                out.append(self.memo[m.group(1)[0]])
            elif m.group(2) is not None:
                out.append(self.memo[int.from_bytes(m.group(2), "little")])
        return out

    # -- the machine ------------------------------------------------------------------------------------------
    def run(self) -> Any:
        """The pickled value (with each device's history replaced by its `Sink`)."""
        data, n = self.data, len(self.data)
        stack: list[Any] = []
        marks: list[int] = []
        pos = 0
        while pos < n:
            op = data[pos]
            pos += 1
            if op == 0x7D and self.template is not None:  # EMPTY_DICT: an entry of a device's history?
                sink = self._batch_of(stack, marks)
                if sink is not None:  # in a batch: what the batch holds so far goes first, then the stream
                    self._append(sink, pop_mark(stack, marks))
                    marks.append(len(stack))
                    end = self._stream(pos - 1, sink)
                elif stack and isinstance(stack[-1], Sink):  # a batch of one (APPEND): the entry goes on the stack
                    end, entry = self._match(pos - 1)
                    if end >= 0:
                        stack.append(entry)
                else:
                    end = -1
                if end >= pos:
                    pos = end
                    continue
            if op == 0x2E:  # STOP
                if len(stack) != 1:
                    raise PickleError("the pickle ended with a broken stack")
                return stack[0]
            pos = self._op(op, pos, stack, marks)
        raise PickleError("the pickle is cut short (no STOP)")

    @staticmethod
    def _batch_of(stack: list, marks: list) -> Sink | None:
        """The device history whose batch (MARK ... APPENDS) is being read, if any."""
        if marks and marks[-1] > 0 and isinstance(stack[marks[-1] - 1], Sink):
            return stack[marks[-1] - 1]
        return None

    def _append(self, target: Any, items: list) -> None:
        if isinstance(target, Sink):
            for item in items:
                if item is None:  # a reference to an entry read by the template: not kept
                    continue
                if isinstance(item, dict):
                    if not self.learned:
                        self._learn(item)
                    item = tuple(item.get(f) for f in self.fields)
                target.add(target.device, item)
            return
        if isinstance(target, Outer):
            for item in items:
                if not isinstance(item, list | Sink):
                    raise PickleError(f"{TRACES_KEY} holds a {type(item).__name__}, not a list per device")
        if not isinstance(target, list):
            raise PickleError(f"APPEND to a {type(target).__name__}")
        target.extend([] if isinstance(x, Sink) else x for x in items)

    def _op(self, op: int, pos: int, stack: list, marks: list) -> int:
        """Run the opcode ``op`` whose argument starts at ``pos``; the position after it."""
        handler = HANDLERS.get(op)
        if handler is None:
            raise PickleError(f"opcode {bytes([op])!r} at byte {pos - 1} builds something other than plain values")
        try:
            return handler(self, pos, stack, marks)
        except (IndexError, KeyError, struct.error, UnicodeDecodeError) as exc:
            raise PickleError(f"a broken pickle at byte {pos - 1} ({type(exc).__name__}: {exc})") from None


def read(path: Path, on_entry: Callable[[int, tuple], None], fields: tuple[str, ...]) -> tuple[Any, Reader]:
    """Run the pickle at ``path`` (memory-mapped), each history entry to ``on_entry`` as the tuple of its
    ``fields`` (None where absent); the value and the reader (whose `Reader.resolve` decodes the frame lists kept
    as byte ranges). PickleError for anything but a pickle of plain values."""
    with path.open("rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise PickleError("empty file") from None
    if data[:1] != b"\x80":
        raise PickleError("not a pickle (no PROTO opcode at its start)")
    reader = Reader(data, on_entry, fields)
    return reader.run(), reader
