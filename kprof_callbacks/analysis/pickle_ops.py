"""The pickle machine's opcodes that build plain values, for `pickles.Reader`: one handler per opcode, each taking
the reader, the position of its argument, the stack and the marks, and returning the position after it. Opcodes
that name code (globals, reduce, build, persistent ids, extensions) have no handler: the reader refuses them."""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .pickles import Reader

TRACES_KEY = "device_traces"
FLOAT = struct.Struct(">d")


class PickleError(ValueError):
    """A file that is not a pickle of plain values (or is cut short); the message says what was found."""


class Reached(Exception):
    """Raised where a reader that reads only the head (`Reader.head_only`) meets ``device_traces``: the stack and
    marks as they are then."""


class Lazy:
    """A list of memoized values kept as the byte range of its items in the file: decoded by `Reader.resolve`."""

    __slots__ = ("lo", "hi")

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi


class Coded:
    """A column of a `Run` whose values are not numbers (strings, None, booleans, floats): each distinct value once,
    and per entry the index of its value."""

    __slots__ = ("values", "index")

    def __init__(self, values: list[Any], index: np.ndarray) -> None:
        self.values, self.index = values, index


class Run:
    """Entries of a history read by the reader's template, as columns: per field asked for, an int64 array (numbers),
    a `Coded` column, or None (absent); a field in ``lists`` holds a list, found by `Reader.list_at` from the entry's
    start (``starts``: the byte where each entry's match began)."""

    __slots__ = ("starts", "columns", "lists")

    def __init__(self, starts: np.ndarray, columns: dict[str, np.ndarray | Coded], lists: tuple[str, ...]) -> None:
        self.starts, self.columns, self.lists = starts, columns, lists

    def __len__(self) -> int:
        return len(self.starts)


class Outer(list):
    """The list under ``device_traces``: its items (one list per device) are streamed."""

    devices = 0


class Sink:
    """One device's history: entries (tuples) and runs of entries (`Run`) go to the callback, nothing is kept."""

    __slots__ = ("device", "add")

    def __init__(self, device: int, add: Callable[[int, tuple | Run], None]) -> None:
        self.device, self.add = device, add


def _take(reader: Reader, pos: int, size: int) -> tuple[bytes, int]:
    end = pos + size
    if end > len(reader.data):
        raise PickleError("the pickle is cut short")
    return bytes(reader.data[pos:end]), end


def _line(reader: Reader, pos: int) -> tuple[bytes, int]:
    end = reader.data.find(b"\n", pos)
    if end < 0:
        raise PickleError("the pickle is cut short")
    return bytes(reader.data[pos:end]), end + 1


def pop_mark(stack: list, marks: list) -> list:
    at = marks.pop()
    items = stack[at:]
    del stack[at:]
    return items


def memoize(reader: Reader, index: int, value: Any) -> None:
    memo = reader.memo
    if index >= len(memo):
        memo.extend([None] * (index + 1 - len(memo)))
    memo[index] = value
    if isinstance(value, str) and value not in reader.strings:
        reader.strings[value] = index


def _sized(width: int, build: Callable[[bytes], Any]) -> Callable:
    """An opcode whose argument is a length of ``width`` bytes, then that many bytes, turned into a value."""

    def handler(reader: Reader, pos: int, stack: list, marks: list) -> int:
        raw, pos = _take(reader, pos, width)
        body, pos = _take(reader, pos, int.from_bytes(raw, "little"))
        stack.append(build(body))
        return pos

    return handler


def _fixed(width: int, build: Callable[[bytes], Any]) -> Callable:
    def handler(reader: Reader, pos: int, stack: list, marks: list) -> int:
        raw, pos = _take(reader, pos, width)
        stack.append(build(raw))
        return pos

    return handler


def _text(build: Callable[[bytes], Any]) -> Callable:
    def handler(reader: Reader, pos: int, stack: list, marks: list) -> int:
        raw, pos = _line(reader, pos)
        stack.append(build(raw))
        return pos

    return handler


def _push(value: Callable[[Reader, list], Any]) -> Callable:
    def handler(reader: Reader, pos: int, stack: list, marks: list) -> int:
        stack.append(value(reader, stack))
        return pos

    return handler


def _empty_list(reader: Reader, pos: int, stack: list, marks: list) -> int:
    """A list; the one under ``device_traces`` is an `Outer`, and each list that goes into it a `Sink`."""
    outer = reader.outer
    if stack and isinstance(stack[-1], str) and stack[-1] == TRACES_KEY and outer is None:
        if reader.head_only:
            raise Reached(stack, marks)
        reader.outer = Outer()
        stack.append(reader.outer)
    elif outer is not None and stack and (stack[-1] is outer or marks and stack[marks[-1] - 1] is outer):
        stack.append(Sink(outer.devices, reader.on_entry))
        outer.devices += 1
    else:
        stack.append([])
    return pos


def _setitems(reader: Reader, pos: int, stack: list, marks: list) -> int:
    items = pop_mark(stack, marks)
    target = stack[-1]
    if not isinstance(target, dict):
        raise PickleError(f"SETITEMS on a {type(target).__name__}")
    for k in range(0, len(items) - 1, 2):
        target[items[k]] = items[k + 1]
    if not reader.learned and (reader._batch_of(stack, marks) or len(stack) > 1 and isinstance(stack[-2], Sink)):
        reader._learn(target)  # the first entry of a history: the ones after it are read by its template
    return pos


def _setitem(reader: Reader, pos: int, stack: list, marks: list) -> int:
    value, key = stack.pop(), stack.pop()
    if not isinstance(stack[-1], dict):
        raise PickleError(f"SETITEM on a {type(stack[-1]).__name__}")
    stack[-1][key] = value
    return pos


def _appends(reader: Reader, pos: int, stack: list, marks: list) -> int:
    items = pop_mark(stack, marks)
    reader._append(stack[-1], items)
    return pos


def _append(reader: Reader, pos: int, stack: list, marks: list) -> int:
    item = stack.pop()
    reader._append(stack[-1], [item])
    return pos


def _memo_op(index_of: Callable[[bytes], int], width: int, put: bool) -> Callable:
    """GET (``put`` False) or PUT of the memo index in the argument: ``width`` bytes, or a line (width 0)."""

    def handler(reader: Reader, pos: int, stack: list, marks: list) -> int:
        raw, pos = _take(reader, pos, width) if width else _line(reader, pos)
        if put:
            memoize(reader, index_of(raw), stack[-1])
        else:
            stack.append(reader.recall(index_of(raw)))
        return pos

    return handler


def _mark(reader: Reader, pos: int, stack: list, marks: list) -> int:
    marks.append(len(stack))
    return pos


def _collection(build: Callable[[list], Any]) -> Callable:
    def handler(reader: Reader, pos: int, stack: list, marks: list) -> int:
        stack.append(build(pop_mark(stack, marks)))
        return pos

    return handler


def _tuple(n: int) -> Callable:
    def handler(reader: Reader, pos: int, stack: list, marks: list) -> int:
        items = stack[len(stack) - n :]
        del stack[len(stack) - n :]
        stack.append(tuple(items))
        return pos

    return handler


def _additems(reader: Reader, pos: int, stack: list, marks: list) -> int:
    items = pop_mark(stack, marks)
    stack[-1].update(items)
    return pos


def _skip(width: int) -> Callable:
    return lambda reader, pos, stack, marks: _take(reader, pos, width)[1]


def _pop(reader: Reader, pos: int, stack: list, marks: list) -> int:
    if marks and marks[-1] == len(stack):
        marks.pop()
    else:
        stack.pop()
    return pos


def _protocol(reader: Reader, pos: int, stack: list, marks: list) -> int:
    raw, pos = _take(reader, pos, 1)
    reader.protocol = raw[0]
    return pos


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogatepass")


def _text_int(raw: bytes) -> int | bool:
    """Protocol 0's INT: ``00``/``01`` are False/True."""
    return {b"00": False, b"01": True}[raw] if raw in (b"00", b"01") else int(raw)


def _pop_to_mark(reader: Reader, pos: int, stack: list, marks: list) -> int:
    pop_mark(stack, marks)
    return pos


def _dup(reader: Reader, pos: int, stack: list, marks: list) -> int:
    stack.append(stack[-1])
    return pos


def _memoize_next(reader: Reader, pos: int, stack: list, marks: list) -> int:
    memoize(reader, len(reader.memo), stack[-1])
    return pos


HANDLERS: dict[int, Callable] = {
    0x80: _protocol,
    0x95: _skip(8),  # FRAME
    ord("("): _mark,
    ord("0"): _pop,
    ord("1"): _pop_to_mark,
    ord("2"): _dup,
    ord("N"): _push(lambda r, s: None),
    0x88: _push(lambda r, s: True),
    0x89: _push(lambda r, s: False),
    ord("I"): _text(_text_int),
    ord("L"): _text(lambda raw: int(raw.rstrip(b"L"))),
    ord("J"): _fixed(4, lambda raw: int.from_bytes(raw, "little", signed=True)),
    ord("K"): _fixed(1, lambda raw: raw[0]),
    ord("M"): _fixed(2, lambda raw: int.from_bytes(raw, "little")),
    0x8A: _sized(1, lambda raw: int.from_bytes(raw, "little", signed=True)),
    0x8B: _sized(4, lambda raw: int.from_bytes(raw, "little", signed=True)),
    ord("F"): _text(float),
    ord("G"): _fixed(8, lambda raw: FLOAT.unpack(raw)[0]),
    ord("S"): _text(lambda raw: raw.strip(b"'\"").decode("latin-1")),
    ord("T"): _sized(4, lambda raw: raw.decode("latin-1")),
    ord("U"): _sized(1, lambda raw: raw.decode("latin-1")),
    ord("V"): _text(lambda raw: raw.decode("raw-unicode-escape")),
    ord("X"): _sized(4, _decode),
    0x8C: _sized(1, _decode),
    0x8D: _sized(8, _decode),
    ord("B"): _sized(4, bytes),
    ord("C"): _sized(1, bytes),
    0x8E: _sized(8, bytes),
    0x96: _sized(8, bytearray),
    ord("]"): _empty_list,
    ord("a"): _append,
    ord("e"): _appends,
    ord("l"): _collection(list),
    ord(")"): _push(lambda r, s: ()),
    ord("t"): _collection(tuple),
    0x85: _tuple(1),
    0x86: _tuple(2),
    0x87: _tuple(3),
    ord("}"): _push(lambda r, s: {}),
    ord("d"): _collection(lambda items: dict(zip(items[::2], items[1::2]))),
    ord("s"): _setitem,
    ord("u"): _setitems,
    0x8F: _push(lambda r, s: set()),
    0x90: _additems,
    0x91: _collection(frozenset),
    ord("g"): _memo_op(int, 0, put=False),
    ord("h"): _memo_op(lambda raw: raw[0], 1, put=False),
    ord("j"): _memo_op(lambda raw: int.from_bytes(raw, "little"), 4, put=False),
    ord("p"): _memo_op(int, 0, put=True),
    ord("q"): _memo_op(lambda raw: raw[0], 1, put=True),
    ord("r"): _memo_op(lambda raw: int.from_bytes(raw, "little"), 4, put=True),
    0x94: _memoize_next,
}
