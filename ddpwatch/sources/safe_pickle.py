"""Unpickles a Flight Recorder dump as plain data only, within a memory budget (no code, no classes); no torch."""

from __future__ import annotations

import io
import pickle
import sys

from ..format import bounded

# What unpickling may build (bounded.Budget, estimated bytes of memory). torch 2.13's own dump of 2,000 gloo
# entries with stacks (334 KB, frames shared through the memo) estimates at 6.2 MB, 18.7 bytes per byte of file
# (it took 2.6 MB, tracemalloc: the estimate is conservative); PICKLE_BUILT_PER_BYTE leaves 2.6 times that. The
# cap: MAX_ENTRIES entries of that kind (100 times as many) estimate at 625 MB.
PICKLE_BUILT_PER_BYTE = 48
PICKLE_BUILT_CAP = 2**30
MAX_INT_BITS = 14_000  # about Python's 4,300-digit limit for int <-> str (converting longer ones takes quadratic time)
MAX_NUMBER_TEXT = 4300


def _refuse(what: str):
    raise pickle.UnpicklingError(f"refused {what}: a Flight Recorder dump holds only plain data")


def _brief(value) -> str:
    """A value as an error names it, short and in bounded time (the repr of a pickle's shared nested lists can be
    terabytes)."""
    if isinstance(value, (str, bytes)):
        return repr(value[:40]) + ("..." if len(value) > 40 else "")
    if isinstance(value, int) and value.bit_length() > 128:
        return f"an int of {value.bit_length()} bits"
    if value is None or isinstance(value, (int, float, complex)):
        return repr(value)
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return f"a {type(value).__name__} of {len(value)} items"
    return type(value).__name__


# kind -> (estimated bytes of an empty one, bytes per item it holds) for a call's copy: CPython 3.11's sizes, with
# the growth of a list (8 bytes a slot, 16 here), a dict (up to 55 bytes an item) and a set (up to 110).
_CONTAINER_COST = {list: (56, 16), tuple: (40, 16), dict: (224, 64), set: (216, 128), frozenset: (216, 128)}
_SIZED = (list, tuple, dict, set, frozenset, str, bytes)
_SCALARS = (str, bytes, int, float, complex, bool, type(None))


def _call_cost(kind, args: tuple) -> int | None:
    """What kind(*args) would build, in estimated bytes, known before it is built; None for a call plain data never
    needs: a size (bytes(8_000_000_000)), str of a container (a repr that shared lists make terabytes long), an
    int of more digits than Python converts."""
    if not args:
        return _CONTAINER_COST.get(kind, (64, 0))[0]
    if len(args) > 1:
        return None
    [arg] = args
    if kind in _CONTAINER_COST:
        empty, each = _CONTAINER_COST[kind]
        return empty + each * len(arg) if isinstance(arg, _SIZED) else None
    if kind is bytes:
        return 33 + len(arg) if isinstance(arg, (bytes, str, list, tuple)) else None
    if not isinstance(arg, _SCALARS) or (isinstance(arg, int) and arg.bit_length() > MAX_INT_BITS):
        return None
    if isinstance(arg, (str, bytes)) and kind is not str and len(arg) > MAX_NUMBER_TEXT:
        return None
    return 64 + 4 * len(arg) if isinstance(arg, (str, bytes)) else 64 + MAX_NUMBER_TEXT


def _checked_call(kind):
    """`kind(*args)` as a pickle may ask for it (protocol 2 spells sets and bytes as calls), charged before it is
    built, refused when it is not what plain data needs."""

    def call(unpickler, *args):
        cost = _call_cost(kind, args)
        if cost is None:
            _refuse(f"{kind.__name__}({', '.join(map(_brief, args[:3]))}{', ...' if len(args) > 3 else ''})")
        unpickler.budget.charge(cost)
        return kind(*args)

    return call


def _encode(unpickler, text, encoding="utf-8", errors="strict"):
    """_codecs.encode as protocol-2 pickles use it for a bytes value: latin-1 text to bytes, nothing else."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        _refuse(f"_codecs.encode({_brief(text)}, {_brief(encoding)})")
    unpickler.budget.charge(33 + len(text))
    return text.encode(encoding, errors)


# MARK sets a new list as the stack until the opcode that takes the items (pop_mark) drops it: 56 bytes, a slot,
# the allocator's share (4 M MARKs took 307 MB). A memo entry: an int key, a dict slot, room to grow (4 M MEMOIZE
# took 340 MB).
_MARK_COST = 80
_MEMO_COST = 128


def _charged_dispatch() -> dict:
    """pickle's opcode table with each opcode charging the budget for what it builds: before it builds it where
    that is known from the stack (containers, the memo), after for the values read from the file (at most 4
    bytes of memory per byte read). Every opcode costs a stack slot (8 bytes) at least, so no opcode is free."""
    op = pickle
    fixed = {
        op.MARK: _MARK_COST,
        op.EMPTY_DICT: 240,
        op.EMPTY_LIST: 72,
        op.EMPTY_SET: 232,
        op.TUPLE1: 64,
        op.TUPLE2: 72,
        op.TUPLE3: 80,
        op.BININT: 48,
        op.BININT2: 48,
        op.BINFLOAT: 40,
        op.SETITEM: 64,
        op.PUT: _MEMO_COST,
        op.BINPUT: _MEMO_COST,
        op.LONG_BINPUT: _MEMO_COST,
        op.MEMOIZE: _MEMO_COST,
    }
    per_item = {
        op.APPENDS: (0, 8),
        op.SETITEMS: (0, 32),
        op.ADDITEMS: (0, 128),
        op.LIST: (56, 8),
        op.TUPLE: (40, 8),
        op.DICT: (224, 32),
        op.FROZENSET: (216, 128),
    }  # 32 per key and per value
    read = {
        op.BINUNICODE,
        op.SHORT_BINUNICODE,
        op.BINUNICODE8,
        op.UNICODE,
        op.BINSTRING,
        op.SHORT_BINSTRING,
        op.STRING,
        op.BINBYTES,
        op.SHORT_BINBYTES,
        op.BINBYTES8,
        op.BYTEARRAY8,
        op.LONG,
        op.LONG1,
        op.LONG4,
        op.INT,
        op.FLOAT,
    }

    def before(load, cost):
        def charged(self):
            self.budget.charge(cost)
            load(self)

        return charged

    def items(load, empty, each):
        def charged(self):
            self.budget.charge(empty + each * len(self.stack))  # the stack holds what the opcode takes since MARK
            load(self)

        return charged

    def after(load):
        def charged(self):
            load(self)
            self.budget.charge(8 + sys.getsizeof(self.stack[-1]))

        return charged

    table = {}
    for code, load in pickle._Unpickler.dispatch.items():
        key = bytes([code])
        if key in per_item:
            table[code] = items(load, *per_item[key])
        elif key in read:
            table[code] = after(load)
        else:
            table[code] = before(load, fixed.get(key, 8))
    return table


class _SafeUnpickler(pickle._Unpickler):
    """Unpickling runs whatever callables a pickle names: allow only plain builtin containers and scalars, and
    build within a budget.

    torch writes FR dumps with nothing but dicts, lists, tuples, strings, numbers, booleans and None, so a real
    dump never needs a class at all; anything else (os.system, eval, torch classes) is refused. The allowed names
    resolve to checked calls that are not classes, so NEWOBJ cannot use them. This is the pure-Python unpickler:
    its opcodes can be charged one by one (_charged_dispatch), and the C one sizes its memo by the largest index a
    file names, so one opcode (LONG_BINPUT 2**31) makes it allocate gigabytes; here the memo is a dict."""

    ALLOWED = {
        ("builtins", kind.__name__): _checked_call(kind)
        for kind in (dict, list, tuple, set, frozenset, str, bytes, int, float, bool, complex)
    } | {("_codecs", "encode"): _encode}  # how protocol-2 pickles spell a bytes value: str -> bytes, nothing more
    dispatch = _charged_dispatch()

    def __init__(self, file, budget: bounded.Budget):
        super().__init__(file)
        self.budget = budget

    def find_class(self, module, name):
        if module == "__builtin__":
            module = "builtins"  # protocol 2 spells it the Python 2 way
        call = self.ALLOWED.get((module, name))
        if call is None:
            raise pickle.UnpicklingError(
                f"refused to load {module}.{name}: a Flight Recorder dump holds only plain data"
            )
        return lambda *args: call(self, *args)

    # pop_mark is the pure-Python unpickler's own method (pickle._Unpickler calls it for every MARK'd opcode);
    # typeshed's stub of that private class leaves it out.
    def pop_mark(self):
        self.budget.used -= _MARK_COST  # the list MARK made is dropped: what lasts is charged by the opcode
        return super().pop_mark()  # type: ignore[misc]

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("refused a persistent reference: a Flight Recorder dump holds only plain data")


def safe_unpickle(data: bytes, where: str = "pickle"):
    budget = bounded.Budget(where, len(data), PICKLE_BUILT_CAP, PICKLE_BUILT_PER_BYTE)
    return _SafeUnpickler(io.BytesIO(data), budget).load()
