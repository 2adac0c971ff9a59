"""The one reader of gin text: gin's own parser finds the statements, and this module
gives what the rest of metalearn asks of them.

* :func:`binding_sources`: every binding of gin files and ``--gin_param`` texts, includes
  followed, with the file and line that made it (what ``validation`` reports errors
  with).
* :func:`config_text_bindings` / :func:`config_bindings`: ``key -> value text`` of a
  saved config (``gin.config_str()``'s text: a workdir's ``config.gin``, a checkpoint's
  copy), what the config-change check and the results tables compare, after
  :func:`substitute_macros` (each ``%MACRO`` replaced by its value text).
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import tokenize
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from metalearn import _compat
from metalearn.repository import MovedGinFileError, moved_gin_file

config_parser = _compat.gin_parser()


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a gin binding was made: a file (``None`` for a ``--gin_param``) and line."""
    filename: Optional[str]
    line: int
    text: str

    def __str__(self) -> str:
        where = f'file "{self.filename}", line {self.line}' if self.filename else \
            "--gin_param"
        return f"{where}: {self.text.strip()}"


@dataclasses.dataclass(frozen=True)
class Binding:
    """One binding ``scope/selector.param`` and where it was made."""
    scope: str
    selector: str
    param: str
    source: Source


class GinIncludeError(ValueError):
    """A gin file includes itself, through its includes."""


class _Delegate(config_parser.ParserDelegate):
    """Parses references and macros as plain names: only the statements are wanted."""

    def configurable_reference(self, scoped_selector, evaluate):
        return scoped_selector

    def macro(self, name):
        return name


def _included(chain: Tuple[Tuple[str, int, str], ...]) -> str:
    return "".join(f'\n  included from "{f}", line {n}: {t}' for f, n, t in reversed(chain))


def statements(text_or_file, filename: Optional[str] = None,
               chain: Tuple[Tuple[str, int, str], ...] = ()) -> list:
    """The statements of gin text (a string or an open file), as gin's parser reads them
    (``BindingStatement``, ``ImportStatement``, ``IncludeStatement``; includes not
    followed).

    Args:
      filename: the file's name in messages (``None``: a ``--gin_param`` text).
      chain: the includes that led here, ``(file, line, text)``, for messages.

    Raises:
      SyntaxError: bad gin syntax; the message names the file (or the ``--gin_param``),
        the line and its text, and the includes that led to it.
    """
    try:
        return list(config_parser.ConfigParser(text_or_file, _Delegate()))
    except tokenize.TokenError as error:  # an unclosed bracket at the end of the text
        line = max(error.args[1][0] - 1, 1)
        where = f'gin file "{filename}", line {line}' if filename else \
            f"--gin_param {text_or_file!r}"
        raise SyntaxError(f"bad gin syntax in {where}: {error.args[0]}: a bracket or "
                          f"quote opened on this line or before is not closed"
                          f"{_included(chain)}") from None
    except SyntaxError as error:
        where = f'gin file "{filename}", line {error.lineno}' if filename else \
            f"--gin_param {text_or_file!r}"
        text = f"\n    {error.text.rstrip()}" if filename and error.text else ""
        msg = re.sub(r"malformed node or string[^\n]*\n\s*", "", str(error.msg))
        raise SyntaxError(f"bad gin syntax in {where}: {msg}{text}"
                          f"{_included(chain)}") from None


def read_gin_file(path: str, chain: Tuple[Tuple[str, int, str], ...] = ()) -> str:
    """A gin file's text, read as UTF-8 (what gin reads).

    Args:
      chain: the includes that led here, ``(file, line, text)``, for messages.

    Raises:
      SyntaxError: a byte that is not UTF-8; the message names the file, the line and
        column, and the byte (as Python does for a source file), and the includes that
        led to it.
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise SyntaxError(f'bad gin file "{path}", line {line}, column {column}: byte '
                          f"0x{data[error.start]:02x} is not UTF-8 ({error.reason}); gin "
                          "files are read as UTF-8: save it as UTF-8 (or remove the "
                          f"character){_included(chain)}") from None


def _raise_if_moved(path: str, including: Optional[str] = None, line: int = 0,
                    text: str = "", chain: Tuple[Tuple[str, int, str], ...] = ()) -> None:
    """Raises :class:`MovedGinFileError` if the missing gin file ``path`` is one that
    moved, naming the new path and, for an include, the file and line including it."""
    moved = moved_gin_file(path)
    if moved is None:
        return
    where = "" if not text else f"\n  In --gin_param: {text.strip()}" if including is None \
        else f'\n  In file "{including}", line {line}: {text.strip()}{_included(chain)}'
    raise MovedGinFileError(f"gin file {path!r} not found: {moved}{where}")


def find_file(path: str) -> Optional[str]:
    """A gin file path as gin's ``include`` finds it (the given path, then the search
    path that ``metalearn.configurables`` adds); ``None`` if neither has it."""
    prefixes = [""] + list(_compat.gin_location_prefixes())
    for prefix in prefixes:
        candidate = os.path.join(prefix, path)
        if os.path.isfile(candidate):
            return candidate
    return None


def _bindings_of(text_or_file, filename: Optional[str],
                 chain: Tuple[Tuple[str, int, str], ...] = ()) -> List[Binding]:
    """The bindings of one gin file or binding text, its includes followed; ``chain``:
    the includes that led here, ``(file, line, text)``."""
    found: List[Binding] = []
    for statement in statements(text_or_file, filename, chain):
        if isinstance(statement, config_parser.BindingStatement) and statement.arg_name:
            location = statement.location
            found.append(Binding(statement.scope or "", statement.selector,
                                 statement.arg_name,
                                 Source(filename, location.line_num,
                                        location.line_content)))
        elif isinstance(statement, config_parser.IncludeStatement):
            path = find_file(statement.filename)
            if path is None:
                _raise_if_moved(statement.filename, filename, statement.location.line_num,
                                statement.location.line_content, chain)
                continue  # gin names the file and line of the include itself
            here = (filename, statement.location.line_num,
                    statement.location.line_content.strip())
            files = [os.path.realpath(f) for f, _, _ in chain + (here,) if f]
            if os.path.realpath(path) in files:
                steps = "".join(f'\n  "{f}", line {n}: {t}' for f, n, t in chain + (here,))
                raise GinIncludeError(f"gin file {path!r} includes itself:{steps}")
            found += _bindings_of(read_gin_file(path, chain + (here,)), path,
                                  chain + (here,))
    return found


@dataclasses.dataclass(frozen=True)
class KeyedStatement:
    """A binding or macro of a config, includes followed: its key (``[scope/]Name.param``
    with the configurable's short name, or a macro's name), where it was made, and the
    files that led there (the file given first, the file itself last; empty for a
    ``--gin_param``)."""
    key: str
    source: Source
    files: Tuple[str, ...]


def _keyed_of(text_or_file, filename: Optional[str], files: Tuple[str, ...]
              ) -> List[KeyedStatement]:
    found: List[KeyedStatement] = []
    for statement in statements(text_or_file, filename):
        location = statement.location
        if isinstance(statement, config_parser.BindingStatement):
            if statement.arg_name:
                scope = f"{statement.scope}/" if statement.scope else ""
                key = f"{scope}{statement.selector.rsplit('.', 1)[-1]}.{statement.arg_name}"
            else:
                key = statement.selector  # a macro
            found.append(KeyedStatement(key, Source(filename, location.line_num,
                                                    location.line_content), files))
        elif isinstance(statement, config_parser.IncludeStatement):
            path = find_file(statement.filename)
            if path is None or os.path.realpath(path) in map(os.path.realpath, files):
                continue  # gin names a missing include; binding_sources a cycle
            found += _keyed_of(read_gin_file(path), path, files + (path,))
    return found


def keyed_statements(gin_files: Sequence[str] = (), gin_params: Sequence[str] = ()
                     ) -> List[KeyedStatement]:
    """Every binding and macro of ``gin_files`` and ``gin_params`` (includes followed,
    an ``include`` given as a ``--gin_param`` too), in parse order, with the files that
    led to it: what the rule of role files (``validation.check_roles``) reads.

    Raises:
      SyntaxError: bad gin syntax (see :func:`statements`).
    """
    found: List[KeyedStatement] = []
    for path in gin_files:
        located = find_file(path)
        if located is not None:
            found += _keyed_of(read_gin_file(located), located, (located,))
    for param in gin_params:
        found += _keyed_of(param, None, ())
    return found


def binding_sources(gin_files: Sequence[str] = (), gin_params: Sequence[str] = (),
                    strict: bool = False) -> List[Binding]:
    """Every binding made by ``gin_files`` (includes followed) and ``gin_params``, in
    parse order, with the file and line that made it.

    Args:
      strict: raise on bad input; otherwise unreadable input gives no entries.

    Raises:
      SyntaxError: (``strict``) bad gin syntax; the message names the file (full
        path), the line and its text, and the includes that led to it.
      GinIncludeError: (``strict``) a file includes itself; the message shows the cycle.
      MovedGinFileError: (``strict``) a gin file given, or included, is missing because
        it moved (:data:`metalearn.repository.MOVED_GIN_FILES`); the message names the
        new path (and the file and line of the include).
    """
    bindings: List[Binding] = []
    try:
        for path in gin_files:
            found = find_file(path)
            if found is None:
                _raise_if_moved(path)
            else:
                bindings += _bindings_of(read_gin_file(found), found)
        for param in gin_params:
            bindings += _bindings_of(param, None)
    except (SyntaxError, GinIncludeError, MovedGinFileError):
        if strict:
            raise
        return []
    except Exception:  # noqa: BLE001  (gin's own parse reports it)
        return []
    return bindings


def config_text_bindings(text: str) -> Dict[str, str]:
    """``key -> value text`` of gin config text as ``gin.config_str()`` writes it: the
    key as written before ``=`` (``[scope/]Name.param``, or a macro's name), the value
    as written after it, comments dropped and continuation lines joined by a space.

    Gin's parser says where each statement starts; every other line belongs to the
    statement above it.

    Raises:
      SyntaxError: the text is not gin (see :func:`statements`).
    """
    starts = {}
    for statement in statements(text):
        binds = isinstance(statement, config_parser.BindingStatement)
        starts[statement.location.line_num] = starts.get(statement.location.line_num,
                                                         False) or binds
    bindings: Dict[str, str] = {}
    key = None
    for number, line in enumerate(io.StringIO(text), 1):
        stripped = line.split("#", 1)[0].rstrip() if not line.lstrip().startswith(
            ("'", '"')) else line.rstrip()
        if number in starts:
            key = None
            if starts[number] and "=" in stripped:
                key, value = (s.strip() for s in stripped.split("=", 1))
                bindings[key] = value
        elif stripped.strip() and key is not None:
            bindings[key] += " " + stripped.strip()
    return bindings


def config_bindings(path: str) -> Dict[str, str]:
    """``key -> value text`` of a saved gin config file (see
    :func:`config_text_bindings`)."""
    return config_text_bindings(read_gin_file(path))


_MACRO_USE = re.compile(r"%([A-Za-z_]\w*)")


def substitute_macros(bindings: Mapping[str, str]) -> Dict[str, str]:
    """The bindings with each macro use (``%NUM_STEPS``) replaced by the macro's value
    text (macros within macros too) and the macros themselves (keys without a ``.``)
    left out: what each binding resolves to, so that ``Loop.num_steps = %NUM_STEPS``
    with ``NUM_STEPS = 10`` equals ``Loop.num_steps = 10``."""
    macros = {k: v for k, v in bindings.items() if "." not in k}

    def value(text: str, depth: int = 0) -> str:
        if depth > 10:  # a macro defined through itself: left as written
            return text
        return _MACRO_USE.sub(lambda m: value(macros[m.group(1)], depth + 1)
                              if m.group(1) in macros else m.group(0), text)

    return {k: value(v) for k, v in bindings.items() if k not in macros}
