"""A restricted, streaming reader of the pickles ``torch.cuda.memory._dump_snapshot`` writes: nothing but builtin
values (dicts, lists, tuples, strings, numbers), read from a memory map, a snapshot's history streamed instead of
built as a list.

``pickle.load`` would run any code a pickle names (a logdir may hold files from anywhere) and build the whole object
graph: a 1 GB snapshot becomes several GB of dicts and takes seconds per 100 MB. This reader runs the pickle
machine itself on the opcodes that build plain values and refuses every other (globals, reduce, build, persistent
ids, extensions: `PickleError`). The lists under the top-level ``device_traces`` key go to a callback; once one
entry has been read, the rest that are laid out like it (the same keys in the same order, numbers, strings and frame
lists already seen) are matched by one regular expression each, in C, and handed on as runs of entries in columns
(`Run`: their numbers decoded by numpy, no object per entry); their frame lists stay in the file, found again and
decoded only for the entries the caller asks about (`Reader.list_at`, `Reader.resolve`).
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .pickle_ops import HANDLERS, TRACES_KEY, Coded, Lazy, Outer, PickleError, Reached, Run, Sink, pop_mark

__all__ = ["TRACES_KEY", "Coded", "Lazy", "PickleError", "Reader", "Run", "read", "read_head"]

_REF = rb"h.|j...."
_INT = rb"K.|M..|J....|" + b"|".join(rb"\x8a" + bytes([n]) + b"." * n for n in range(1, 9))
_ITEMS = rb"\x94(?:\((?:(?:j....)++|(?:h.)++)++e)*+(?:(?:" + _REF + rb")a)?"  # a new list's items: runs, faster
_VALUE = {int: _INT, str: _REF, type(None): rb"N", float: rb"G........", bool: rb"\x88|\x89"}
_TOKENS = re.compile(rb"h(.)|j(....)|[(ea]", re.S)
_INT_CODE, _LIST_CODE, _FLOAT_CODE, _OTHER_CODE, _ABSENT = range(5)
_CODES = {int: _INT_CODE, float: _FLOAT_CODE, str: _OTHER_CODE, type(None): _OTHER_CODE, bool: _OTHER_CODE}
_CHUNK = 1 << 16  # entries per `Run`: what a run's raw fields hold in memory at once stays small
_WIDE = 10  # bytes of the widest field a template captures (an 8-byte LONG1 with its opcode and length)


def _ref(index: int) -> bytes:
    return b"h" + bytes([index]) if index < 256 else b"j" + index.to_bytes(4, "little")


def _ints(raw: np.ndarray) -> np.ndarray:
    """The numbers of the integer opcodes in ``raw`` (rows of _WIDE bytes, zero-padded): BININT1/2, BININT, LONG1."""
    op, out = raw[:, 0], np.zeros(len(raw), np.int64)
    b = raw.astype(np.int64)
    out = np.where(op == 0x4B, b[:, 1], out)
    out = np.where(op == 0x4D, b[:, 1] | b[:, 2] << 8, out)
    out = np.where(op == 0x4A, np.ascontiguousarray(raw[:, 1:5]).view("<i4")[:, 0], out)
    n = b[:, 1]
    long1 = np.ascontiguousarray(raw[:, 2:10]).view("<i8")[:, 0]  # zero-extended: negative when n < 8 is fixed
    top = np.take_along_axis(b, np.minimum(n + 1, _WIDE - 1)[:, None], 1)[:, 0]
    long1 = long1 - np.where((n < 8) & (top >= 0x80), np.left_shift(1, 8 * np.minimum(n, 7)), 0)
    return np.where(op == 0x8A, long1, out)


class Reader:
    """Run the pickle in ``data``; ``on_entry(device, values)`` gets each history entry as the values of ``fields``
    (a list among them may be a `Lazy`), or a `Run` of entries read by the template."""

    def __init__(
        self,
        data: bytes | mmap.mmap,
        on_entry: Callable[[int, tuple | Run], None],
        fields: tuple[str, ...],
    ) -> None:
        self.data, self.on_entry, self.fields = data, on_entry, fields
        self.lists: list[tuple[str, int]] = []  # the template's list fields: key, the group of its new-list mark
        self.picks: list[tuple[int, int]] = []  # per field asked for: how to read it, its group
        self.memo: list[Any] = []
        self.strings: dict[str, int] = {}  # memoized strings -> their memo index (keys are matched as references)
        self.template: re.Pattern | None = None  # an entry, after an optional end of batch and start of the next
        self.located: re.Pattern | None = None  # the same, its new lists' items captured (`list_at`)
        self.made: list[tuple[np.ndarray, np.ndarray, str]] = []  # per run: new lists' memo indexes, starts, key
        self.learned = False
        self.protocol = 0
        self.outer: Outer | None = None
        self.fast = 0  # entries read by the template
        self.head_only = False  # stop at ``device_traces`` (`head`)

    # -- the fast path ----------------------------------------------------------------------------------------
    def _learn(self, entry: dict[str, Any]) -> None:
        """A pattern for entries laid out as ``entry``: its keys (memoized strings) in order, values of its types
        (numbers, strings read before, lists of values read before)."""
        self.learned = True
        if self.protocol < 4:  # its memo opcodes carry their index: read by the opcodes
            return
        parts, located, fields, lists = [rb"\}\x94\("], [rb"\}\x94\("], {}, []
        for key, value in entry.items():
            kind = list if isinstance(value, Lazy) else type(value)
            if key not in self.strings or (kind not in _VALUE and kind is not list):
                return
            head = re.escape(_ref(self.strings[key]))
            if kind is list:  # a reference to a list read before, or a new list: the memo counts it (its mark)
                parts.append(head + b"(?:" + _REF + rb"|(\])" + _ITEMS + b")")
                located.append(head + b"(?:(" + _REF + rb")|\](" + _ITEMS + b"))")
                lists.append((key, len(fields) + 1))
            else:  # captured only when asked for
                parts.append(head + (b"(" if key in self.fields else b"(?:") + _VALUE[kind] + b")")
                located.append(head + b"(?:" + _VALUE[kind] + b")")
            if kind is list or key in self.fields:
                fields[key] = (_LIST_CODE if kind is list else _CODES[kind], len(fields) + 1)
        self.lists = lists
        self.picks = [fields.get(name, (_ABSENT, 0)) for name in self.fields]
        prefix = rb"(?:e\()?(?:\x95.{8})?"
        self.template = re.compile(prefix + b"".join(parts) + rb"u", re.S)
        self.located = re.compile(prefix + b"".join(located) + rb"u", re.S)

    def _stream(self, pos: int, sink: Sink) -> int:
        """Hand on the entries of a batch (and of the batches after it) from ``pos`` while the template matches them
        one after the other, as `Run`s; the position of the first that it does not."""
        match, data = self.template.match, self.data
        m = match(data, pos)
        while m is not None:
            starts, rows = [], []
            while m is not None and len(rows) < _CHUNK:
                starts.append(pos)
                rows.append(m.groups())
                pos = m.end()
                m = match(data, pos)
            sink.add(sink.device, self._run(starts, rows))
        return pos

    def _run(self, starts: list[int], rows: list[tuple]) -> Run:
        """The entries the template matched at ``starts`` (their captured fields: ``rows``) as columns; the memo
        grows by each entry and each new list, as the pickle machine's would."""
        raw = np.array(rows, dtype=f"S{_WIDE}").view(np.uint8).reshape(len(rows), -1, _WIDE)
        at = np.array(starts, np.int64)
        slots = np.ones(len(rows), np.int64)
        new = []
        for _, group in self.lists:
            new.append(raw[:, group - 1, 0] == 0x5D)
            slots += new[-1]
        index = len(self.memo) + np.cumsum(slots) - slots  # each entry's own memo index
        offset = np.ones(len(rows), np.int64)
        for (name, _), fresh in zip(self.lists, new):
            self.made.append((index[fresh] + offset[fresh], at[fresh], name))
            offset += fresh
        self.memo.extend([None] * int(slots.sum()))  # the entries (never referred to again) and their lists
        self.fast += len(rows)
        columns: dict[str, Any] = {}
        for name, (code, group) in zip(self.fields, self.picks):
            if code == _INT_CODE:
                columns[name] = _ints(raw[:, group - 1])
            elif code in (_FLOAT_CODE, _OTHER_CODE):
                columns[name] = self._coded(code, raw[:, group - 1])
        return Run(at, columns, tuple(name for name, _ in self.lists if name in self.fields))

    def _coded(self, code: int, raw: np.ndarray) -> Coded:
        """A column of values other than numbers: its distinct values and the index of each entry's."""
        if code == _FLOAT_CODE:  # told apart by their bits (numpy's unique would take -0.0 for 0.0)
            bits = np.ascontiguousarray(raw[:, 1:9]).view(">u8")[:, 0]
            distinct, index = np.unique(bits, return_inverse=True)
            return Coded(distinct.astype(">u8").view(">f8").tolist(), index.reshape(-1))
        word = np.ascontiguousarray(raw[:, 1:5]).view("<u4")[:, 0].astype(np.int64)
        keys = raw[:, 0].astype(np.int64) << 32 | word
        distinct, index = np.unique(keys, return_inverse=True)
        values = []
        for key in distinct.tolist():
            op = key >> 32
            values.append(self.recall(key & 0xFFFFFFFF) if op in (0x68, 0x6A) else None if op == 0x4E else op == 0x88)
        return Coded(values, index.reshape(-1))

    def recall(self, index: int) -> Any:
        """The memo's value at ``index``; a list the template read, as a `Lazy`."""
        value = self.memo[index]
        if value is None and self.made:
            for indexes, at, name in self.made:
                k = int(np.searchsorted(indexes, index))
                if k < indexes.size and indexes[k] == index:
                    return self.list_at(int(at[k]), name)
        return value

    def list_at(self, start: int, name: str) -> Any:
        """The list under key ``name`` of the entry the template read at byte ``start``: a `Lazy` when the entry made
        it, else the list it refers to."""
        m = self.located.match(self.data, start)
        k = 2 * [key for key, _ in self.lists].index(name) + 1
        if m.group(k) is None:
            return Lazy(m.start(k + 1) + 1, m.end(k + 1))
        ref = m.group(k)
        return self.recall(ref[1] if ref[0] == 0x68 else int.from_bytes(ref[1:], "little"))

    def resolve(self, frames: Any) -> list:
        """A frame list: as it is, or a `Lazy` one decoded (its items are memoized values)."""
        if not isinstance(frames, Lazy):
            return frames if isinstance(frames, list) else []
        out = []
        for m in _TOKENS.finditer(self.data, frames.lo, frames.hi):
            if m.group(1) is not None:
                out.append(self.recall(m.group(1)[0]))
            elif m.group(2) is not None:
                out.append(self.recall(int.from_bytes(m.group(2), "little")))
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
                    m = self.template.match(self.data, pos - 1)
                    end = -1 if m is None else m.end()
                    if m is not None:
                        stack.append(self._run([pos - 1], [m.groups()]))
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

    def head(self) -> Any:
        """The top-level dict's items pickled before its ``device_traces``, the history itself not read (the whole
        value when there is none)."""
        self.head_only = True
        try:
            return self.run()
        except Reached as reached:
            stack, marks = reached.args
        items = stack[marks[0] : -1] if marks else []
        top = stack[0] if stack and isinstance(stack[0], dict) else {}
        return {**top, **dict(zip(items[::2], items[1::2]))}

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


def _mapped(path: Path) -> mmap.mmap:
    """The file at ``path`` memory-mapped; PickleError when it is empty or no pickle."""
    with path.open("rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise PickleError("empty file") from None
    if data[:1] != b"\x80":
        raise PickleError("not a pickle (no PROTO opcode at its start)")
    return data


def read(path: Path, on_entry: Callable[[int, tuple | Run], None], fields: tuple[str, ...]) -> tuple[Any, Reader]:
    """Run the pickle at ``path`` (memory-mapped), each history entry to ``on_entry`` as the tuple of its
    ``fields`` (None where absent); the value and the reader (whose `Reader.resolve` decodes the frame lists kept
    as byte ranges). PickleError for anything but a pickle of plain values."""
    reader = Reader(_mapped(path), on_entry, fields)
    return reader.run(), reader


def read_head(path: Path) -> Any:
    """What the pickle at ``path`` holds before its ``device_traces`` (`Reader.head`): torch writes a snapshot's
    ``segments`` first, so its end state is read without its history. PickleError as `read`."""
    return Reader(_mapped(path), lambda device, values: None, ()).head()
