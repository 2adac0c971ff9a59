"""A reader of pickle files that holds only plain data: never runs code from the file.

The widely shared caches of mini-ImageNet (``mini-imagenet-cache-train.pkl``: a dict of
a uint8 array and a dict of index lists) and tiered-ImageNet (``train_images_png.pkl``:
a list of uint8 arrays of PNG bytes; ``train_labels.pkl``: a dict of arrays and lists of
strings) are pickles. ``pickle.load`` on such a file runs whatever callable the file
names (``os.system`` is one opcode away), so these files are not unpickled here: this
module interprets the pickle opcodes itself (protocols 0 to 5, as written by Python 2
and 3) and builds only

* ``None``, booleans, integers, floats, ``str`` and ``bytes``;
* tuples, lists and dicts of them;
* NumPy arrays of numbers, booleans and fixed-length strings (no object arrays, no
  structured dtypes), from the three ways NumPy pickles them
  (``numpy.core.multiarray._reconstruct`` + state, ``numpy._core...`` in NumPy 2,
  and protocol 5's ``_frombuffer``), and NumPy scalars as Python numbers.

Any other global (a class, a function), persistent id, extension code or out-of-band
buffer is an error naming the file; nothing named in the file is ever imported or
called. Python 2 strings are read as ``latin-1`` (what ``pickle.load(...,
encoding="latin1")`` does, which keeps NumPy's raw bytes intact).
"""

from __future__ import annotations

import codecs
import struct
from typing import Any, Dict, List, Optional

import numpy as np


class UnsafePickleError(ValueError):
    """The file asks for something that is not plain data (or is not a pickle)."""


_MARK = object()
_RECONSTRUCT, _NDARRAY, _DTYPE, _SCALAR, _FROMBUFFER, _ENCODE = (
    "numpy _reconstruct", "numpy.ndarray", "numpy.dtype", "numpy scalar",
    "numpy _frombuffer", "_codecs.encode")
_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _DTYPE,
    ("numpy.core.multiarray", "scalar"): _SCALAR,
    ("numpy._core.multiarray", "scalar"): _SCALAR,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("_codecs", "encode"): _ENCODE,  # how Python 3 writes bytes at protocols 0-2
}
_PLAIN_KINDS = "biufcUS"  # bool, int, uint, float, complex, str, bytes


class _Global:
    def __init__(self, kind: str):
        self.kind = kind


class _Dtype:
    """A dtype being built: ``dtype(typestr, align, copy)``, then its state."""

    def __init__(self, typestr: str):
        self.typestr = typestr
        self.byteorder = "="

    def resolve(self) -> np.dtype:
        order = self.byteorder if self.byteorder in "<>" else ""
        dtype = np.dtype(order + self.typestr)
        if dtype.kind not in _PLAIN_KINDS or dtype.fields is not None or dtype.subdtype:
            raise UnsafePickleError(f"an array of dtype {dtype} (only numbers, booleans "
                                    "and strings are plain data)")
        return dtype


class _Array:
    """An array being built by ``_reconstruct`` and its state."""

    def __init__(self):
        self.value: Optional[np.ndarray] = None


def _as_dtype(value: Any) -> np.dtype:
    if isinstance(value, _Dtype):
        return value.resolve()
    raise UnsafePickleError(f"expected a NumPy dtype, found {type(value).__name__}")


def _array(shape: Any, dtype: np.dtype, fortran: Any, raw: Any) -> np.ndarray:
    if isinstance(raw, str):
        raw = raw.encode("latin-1")  # a Python 2 string of raw bytes
    if not isinstance(raw, (bytes, bytearray)):
        raise UnsafePickleError(f"array data of type {type(raw).__name__} (object arrays "
                                "are not plain data)")
    if not isinstance(shape, tuple) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise UnsafePickleError(f"an array shape {shape!r}")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(raw) != count * dtype.itemsize:
        raise UnsafePickleError(f"array of shape {shape} and dtype {dtype} needs "
                                f"{count * dtype.itemsize} bytes, the file has {len(raw)} "
                                "(truncated or damaged)")
    flat = np.frombuffer(bytes(raw), dtype=dtype, count=count)
    return flat.reshape(shape, order="F" if fortran else "C").copy()


def _call(func: Any, args: Any) -> Any:
    """REDUCE: only the allowed NumPy constructors, never anything the file names."""
    if not isinstance(func, _Global) or not isinstance(args, tuple):
        raise UnsafePickleError("a call of something other than NumPy's array and dtype "
                                "constructors")
    if func.kind == _RECONSTRUCT:
        if len(args) != 3 or not (isinstance(args[0], _Global) and args[0].kind == _NDARRAY):
            raise UnsafePickleError("numpy _reconstruct of a class other than ndarray")
        return _Array()
    if func.kind == _DTYPE:
        if not args or not isinstance(args[0], str):
            raise UnsafePickleError(f"a dtype from {args!r}")
        return _Dtype(args[0])
    if func.kind == _SCALAR:
        if len(args) != 2:
            raise UnsafePickleError("a NumPy scalar without its bytes")
        dtype = _as_dtype(args[0])
        return _array((), dtype, False, args[1]).item()
    if func.kind == _FROMBUFFER:
        if len(args) != 4:
            raise UnsafePickleError("numpy _frombuffer with unexpected arguments")
        buffer, dtype, shape, order = args
        return _array(tuple(shape), _as_dtype(dtype), order == "F", buffer)
    if func.kind == _ENCODE:
        if len(args) != 2 or not isinstance(args[0], str) or \
                args[1] not in ("latin1", "latin-1"):
            raise UnsafePickleError(f"_codecs.encode{args!r}")
        return args[0].encode("latin-1")
    raise UnsafePickleError(f"a call of {func.kind}")


def _build(target: Any, state: Any) -> Any:
    """BUILD: the state of an array or a dtype under construction, nothing else."""
    if isinstance(target, _Dtype):
        if not isinstance(state, tuple) or len(state) < 5 or \
                any(s is not None for s in state[2:5]):
            raise UnsafePickleError("a dtype with sub-arrays or fields (structured arrays "
                                    "are not plain data)")
        if not isinstance(state[1], str):
            raise UnsafePickleError(f"a dtype byte order {state[1]!r}")
        target.byteorder = state[1]
        return target
    if isinstance(target, _Array):
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise UnsafePickleError("an array state that NumPy never writes")
        shape, dtype, fortran, raw = state[-4:]
        target.value = _array(tuple(shape), _as_dtype(dtype), fortran, raw)
        return target
    raise UnsafePickleError(f"setting the state of a {type(target).__name__}")


def _finish(value: Any, depth: int = 0) -> Any:
    """Placeholders to arrays; anything not plain data is an error."""
    if depth > 100:
        raise UnsafePickleError("data nested more than 100 levels deep")
    if isinstance(value, _Array):
        if value.value is None:
            raise UnsafePickleError("an array without its data")
        return value.value
    if isinstance(value, (_Dtype, _Global)):
        raise UnsafePickleError("a bare NumPy dtype or class in the data")
    if isinstance(value, list):
        return [_finish(v, depth + 1) for v in value]
    if isinstance(value, tuple):
        return tuple(_finish(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return {_finish(k, depth + 1): _finish(v, depth + 1) for k, v in value.items()}
    if isinstance(value, bytearray):
        return bytes(value)
    if value is None or isinstance(value, (bool, int, float, str, bytes, np.ndarray)):
        return value
    raise UnsafePickleError(f"a {type(value).__name__}")


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise UnsafePickleError(f"the file ends inside a value (needs {n} bytes at "
                                    f"offset {self.pos}, has {len(self.data) - self.pos})")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def line(self) -> bytes:
        end = self.data.find(b"\n", self.pos)
        if end < 0:
            raise UnsafePickleError("the file ends inside a text value")
        chunk = self.data[self.pos:end]
        self.pos = end + 1
        return chunk

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "little")


def _pop_mark(stack: List[Any], marks: List[int]) -> List[Any]:
    if not marks:
        raise UnsafePickleError("a MARK expected")
    start = marks.pop()
    items = stack[start:]
    del stack[start:]
    return items


def loads(data: bytes) -> Any:
    """The plain data of a pickle's bytes (see the module docstring); raises
    :class:`UnsafePickleError` for anything else."""
    r = _Reader(bytes(data))
    stack: List[Any] = []
    marks: List[int] = []
    memo: Dict[int, Any] = {}

    def pop() -> Any:
        if not stack:
            raise UnsafePickleError("a value expected on the stack (damaged file)")
        return stack.pop()

    while True:
        if r.pos >= len(r.data):
            raise UnsafePickleError("the file ends before the pickle's STOP (truncated)")
        op = r.data[r.pos:r.pos + 1]
        r.pos += 1
        if op == b".":                                   # STOP
            if len(stack) != 1:
                raise UnsafePickleError("a damaged pickle (stack at STOP)")
            return _finish(stack[0])
        elif op == b"\x80":                              # PROTO
            if r.uint(1) > 5:
                raise UnsafePickleError("a pickle protocol above 5")
        elif op == b"\x95":                              # FRAME
            r.uint(8)
        elif op == b"(":
            marks.append(len(stack))
        elif op == b"0":
            pop()
        elif op == b"1":
            _pop_mark(stack, marks)
        elif op == b"2":
            stack.append(stack[-1] if stack else pop())
        elif op == b"N":
            stack.append(None)
        elif op == b"\x88":
            stack.append(True)
        elif op == b"\x89":
            stack.append(False)
        elif op == b"I":                                 # INT (text)
            text = r.line()
            stack.append(True if text == b"01" else False if text == b"00" else int(text))
        elif op == b"J":
            stack.append(struct.unpack("<i", r.take(4))[0])
        elif op == b"K":
            stack.append(r.uint(1))
        elif op == b"M":
            stack.append(r.uint(2))
        elif op == b"L":                                 # LONG (text)
            stack.append(int(r.line().rstrip(b"L")))
        elif op in (b"\x8a", b"\x8b"):                   # LONG1, LONG4
            n = r.uint(1 if op == b"\x8a" else 4)
            stack.append(int.from_bytes(r.take(n), "little", signed=True))
        elif op == b"F":
            stack.append(float(r.line()))
        elif op == b"G":
            stack.append(struct.unpack(">d", r.take(8))[0])
        elif op == b"S":                                 # STRING (Python 2, quoted)
            text = r.line()
            if len(text) < 2 or text[:1] != text[-1:] or text[:1] not in (b"'", b'"'):
                raise UnsafePickleError("a damaged STRING value")
            stack.append(codecs.escape_decode(text[1:-1])[0].decode("latin-1"))
        elif op in (b"T", b"U"):                         # BINSTRING, SHORT_BINSTRING
            stack.append(r.take(r.uint(4 if op == b"T" else 1)).decode("latin-1"))
        elif op == b"V":
            stack.append(r.line().decode("raw-unicode-escape"))
        elif op in (b"X", b"\x8c", b"\x8d"):             # BINUNICODE, SHORT_, 8
            n = r.uint({b"X": 4, b"\x8c": 1, b"\x8d": 8}[op])
            try:
                stack.append(r.take(n).decode("utf-8", "surrogatepass"))
            except UnicodeDecodeError as error:
                raise UnsafePickleError(f"a damaged string ({error})") from None
        elif op in (b"B", b"C", b"\x8e"):                # BINBYTES, SHORT_, 8
            stack.append(r.take(r.uint({b"B": 4, b"C": 1, b"\x8e": 8}[op])))
        elif op == b"\x96":                              # BYTEARRAY8
            stack.append(bytearray(r.take(r.uint(8))))
        elif op == b"\x98":                              # READONLY_BUFFER: no-op in-band
            pass
        elif op == b")":
            stack.append(())
        elif op == b"t":
            stack.append(tuple(_pop_mark(stack, marks)))
        elif op in (b"\x85", b"\x86", b"\x87"):          # TUPLE1..3
            n = op[0] - 0x84
            if len(stack) < n:
                raise UnsafePickleError("a damaged tuple")
            items = tuple(stack[-n:])
            del stack[-n:]
            stack.append(items)
        elif op == b"]":
            stack.append([])
        elif op == b"l":
            stack.append(list(_pop_mark(stack, marks)))
        elif op == b"a":
            value = pop()
            if not stack or not isinstance(stack[-1], list):
                raise UnsafePickleError("APPEND to something other than a list")
            stack[-1].append(value)
        elif op == b"e":
            items = _pop_mark(stack, marks)
            if not stack or not isinstance(stack[-1], list):
                raise UnsafePickleError("APPENDS to something other than a list")
            stack[-1].extend(items)
        elif op == b"}":
            stack.append({})
        elif op in (b"d", b"u"):                         # DICT, SETITEMS
            items = _pop_mark(stack, marks)
            if len(items) % 2:
                raise UnsafePickleError("a dict with a key without value")
            if op == b"d":
                stack.append({})
            if not isinstance(stack[-1] if stack else None, dict):
                raise UnsafePickleError("SETITEMS on something other than a dict")
            for k, v in zip(items[::2], items[1::2]):
                stack[-1][_key(k)] = v
        elif op == b"s":
            value, key = pop(), pop()
            if not stack or not isinstance(stack[-1], dict):
                raise UnsafePickleError("SETITEM on something other than a dict")
            stack[-1][_key(key)] = value
        elif op in (b"p", b"q", b"r", b"\x94"):          # PUT, BINPUT, LONG_BINPUT, MEMOIZE
            index = (int(r.line()) if op == b"p" else r.uint(1) if op == b"q"
                     else r.uint(4) if op == b"r" else len(memo))
            if not stack:
                raise UnsafePickleError("a damaged memo")
            memo[index] = stack[-1]
        elif op in (b"g", b"h", b"j"):                   # GET, BINGET, LONG_BINGET
            index = int(r.line()) if op == b"g" else r.uint(1 if op == b"h" else 4)
            if index not in memo:
                raise UnsafePickleError(f"a damaged memo (no entry {index})")
            stack.append(memo[index])
        elif op in (b"c", b"\x93"):                      # GLOBAL, STACK_GLOBAL
            if op == b"c":
                module, name = r.line().decode("utf-8"), r.line().decode("utf-8")
            else:
                name, module = pop(), pop()
            kind = _GLOBALS.get((module, name))
            if kind is None:
                raise UnsafePickleError(f"it refers to {module}.{name}, which is not plain "
                                        "data (an array, dict, list, number or string); "
                                        "the file is not loaded")
            stack.append(_Global(kind))
        elif op == b"R":                                 # REDUCE
            args = pop()
            stack.append(_call(pop(), args))
        elif op == b"b":                                 # BUILD
            state = pop()
            if not stack:
                raise UnsafePickleError("BUILD without a target")
            stack[-1] = _build(stack[-1], state)
        else:
            names = {b"P": "a persistent id", b"Q": "a persistent id", b"i": "INST",
                     b"o": "OBJ", b"\x81": "NEWOBJ", b"\x92": "NEWOBJ_EX",
                     b"\x97": "an out-of-band buffer", b"\x8f": "a set", b"\x90": "a set",
                     b"\x91": "a frozenset", b"\x82": "an extension code",
                     b"\x83": "an extension code", b"\x84": "an extension code"}
            what = names.get(op, f"opcode {op!r}")
            raise UnsafePickleError(f"it holds {what} at offset {r.pos - 1}, which is not "
                                    "plain data (or the file is not a pickle)")


def _key(key: Any) -> Any:
    if isinstance(key, (list, dict, bytearray, _Array, _Dtype, _Global)):
        raise UnsafePickleError(f"a dict key of type {type(key).__name__}")
    return key


def load(file: str, what: str = "pickle file") -> Any:
    """The plain data of a pickle file; an error names ``file`` (``what`` says what it
    should be, e.g. ``"mini-ImageNet cache"``)."""
    try:
        with open(file, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {file!r} not found") from None
    except OSError as error:
        raise ValueError(f"{what} {file!r} cannot be read ({error})") from error
    try:
        return loads(data)
    except UnsafePickleError as error:
        raise UnsafePickleError(f"{what} {file!r} is not a pickle of plain data: "
                                f"{error}") from None
    except (ValueError, UnicodeDecodeError, struct.error, TypeError) as error:
        raise UnsafePickleError(f"{what} {file!r} is damaged or not a pickle of plain "
                                f"data ({type(error).__name__}: {error})") from None
