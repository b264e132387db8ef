"""The Darknet configuration language: `.cfg` text ⇄ sections, with round-trip editing.

A `CfgDocument` keeps the file's lines exactly as read (comments, blank lines, spacing, line ends),
so a document written back without edits is byte-identical, and `set()` changes only the one line it
edits. Sections hold typed getters that mark keys as used, so the network builder can warn about
keys nothing read, and every problem becomes a one-line `CfgError` naming file:line, section and key.

Darknet's own reader (spec §1) is followed where it is sound: whitespace inside a line is removed,
`[net]`/`[network]` must come first, negative layer references are relative. Where Darknet silently
misreads, darkpy is stricter or kinder, on purpose:
- CRLF line ends, a UTF-8 BOM and inline `#`/`;` comments are accepted (Darknet chokes or misreads);
- a value that is not a number, a key with no value and a key before any section are errors (Darknet
  uses atoi's 0 or crashes);
- a key set twice keeps Darknet's rule, the first value wins, with a warning naming both lines and the
  value used (`cfg check --strict` and `train --strict` make it an error).
"""
from __future__ import annotations

import difflib
import io
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable

from .errors import CfgError

__all__ = ["Option", "Section", "CfgDocument", "CfgWarning", "parse_cfg", "load_cfg",
           "sections_to_yaml", "yaml_to_cfg_text", "REQUIRED"]


class CfgWarning(UserWarning):
    """A cfg problem that does not stop the network from being built (e.g. an unused key)."""


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
_WS = re.compile(r"\s+")
_JOINED_DIGITS = re.compile(r"\d[ \t]+\d")


@dataclass
class Option:
    key: str
    value: str
    line: int          # 1-based line in the file (0 for options that did not come from a file)
    used: bool = False


@dataclass
class Section:
    """One `[type]` block. `index` is -1 for `[net]`, else the layer index it becomes."""

    kind: str
    index: int
    line: int
    file: str
    options: dict[str, Option] = field(default_factory=dict)

    # -- errors ---------------------------------------------------------------------------------
    def error(self, message: str, key: str | None = None) -> CfgError:
        line = self.options[key].line if key in self.options else self.line
        return CfgError(message, self.file, line, self.index, self.kind, key)

    def warn(self, message: str, key: str | None = None) -> None:
        warnings.warn(self.error(message, key).format(), CfgWarning, stacklevel=3)

    # -- raw access -----------------------------------------------------------------------------
    def has(self, key: str) -> bool:
        return key in self.options

    def raw(self, key: str) -> str | None:
        opt = self.options.get(key)
        if opt is None:
            return None
        opt.used = True
        return opt.value

    def _lookup(self, key: str, default: Any, what: str) -> str | None:
        value = self.raw(key)
        if value is None and default is REQUIRED:
            raise self.error(f"missing required key (expected {what})", key)
        return value

    # -- typed getters (each marks the key as used) ---------------------------------------------
    def get_str(self, key: str, default: Any = None) -> Any:
        value = self._lookup(key, default, "a value")
        return default if value is None else value

    def get_int(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._lookup(key, default, "an integer")
        if value is None:
            return default
        return self._to_int(key, value)

    def get_float(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._lookup(key, default, "a number")
        if value is None:
            return default
        self._check_ascii_number(key, value, value)
        try:
            return float(value)
        except ValueError:
            raise self.error(f"not a number (got {value!r}, expected a number)", key) from None

    def get_bool(self, key: str, default: bool = False) -> bool:
        return bool(self.get_int(key, int(default)))

    def get_int_list(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._lookup(key, default, "a comma-separated list of integers")
        if value is None:
            return default
        return [self._to_int(key, v) for v in self._split(key, value)]

    def get_float_list(self, key: str, default: Any = REQUIRED) -> Any:
        value = self._lookup(key, default, "a comma-separated list of numbers")
        if value is None:
            return default
        out = []
        for v in self._split(key, value):
            self._check_ascii_number(key, v, value)
            try:
                out.append(float(v))
            except ValueError:
                raise self.error(f"not a number in list (got {v!r} in {value!r}, expected numbers)",
                                 key) from None
        return out

    def get_choice(self, key: str, choices: Iterable[str], default: Any = REQUIRED,
                   aliases: dict[str, str] | None = None) -> Any:
        """One of `choices`; a key of `aliases` (another spelling, e.g. silu) reads as its value."""
        value = self.get_str(key, default)
        choices = list(choices)
        if aliases and value in aliases:
            return aliases[value]
        if value not in choices and value is not default:
            hint = difflib.get_close_matches(value, choices + list(aliases or ()), n=1)
            tip = f"; did you mean {hint[0]!r}?" if hint else ""
            raise self.error(f"unknown value (got {value!r}, expected one of {', '.join(choices)}){tip}", key)
        return value

    def _check_ascii_number(self, key: str, value: str, whole: str) -> None:
        """Python's int()/float() read Unicode digits (`３`) and `1_000`; Darknet's atoi/atof do not:
        only ASCII numbers are accepted."""
        if not value.isascii() or "_" in value:
            what = "non-ASCII characters" if not value.isascii() else "an underscore"
            raise self.error(f"not a number (got {whole!r}, which contains {what}; write numbers with "
                             f"ASCII digits only)", key)

    def _to_int(self, key: str, value: str) -> int:
        self._check_ascii_number(key, value, value)
        try:
            return int(value)
        except ValueError:
            pass
        try:
            f = float(value)
        except ValueError:
            f = None
        if f is not None and f.is_integer():
            return int(f)
        raise self.error(f"not an integer (got {value!r}, expected an integer)", key)

    def _split(self, key: str, value: str) -> list[str]:
        parts = value.split(",")
        if parts and parts[-1] == "":      # darknet: a trailing comma adds a 0; we drop it
            parts = parts[:-1]
        if any(p == "" for p in parts) or not parts:
            raise self.error(f"empty element in list (got {value!r})", key)
        return parts

    def unused(self) -> list[Option]:
        return [o for o in self.options.values() if not o.used]

    def warn_unused(self) -> None:
        for opt in self.unused():
            self.warn(f"unused key (value {opt.value!r}); darknet ignores it too", opt.key)

    def as_dict(self) -> dict[str, str]:
        return {k: o.value for k, o in self.options.items()}


def _split_option(text: str) -> tuple[str, str] | None:
    """Strip comments and whitespace from one line's content; return (key, value) or None."""
    for mark in ("#", ";"):
        cut = text.find(mark)
        if cut >= 0:
            text = text[:cut]
    text = _WS.sub("", text)
    if "=" not in text:
        return None
    key, value = text.split("=", 1)
    return key, value


class CfgDocument:
    """A parsed cfg file: the original lines plus the sections they define."""

    def __init__(self, lines: list[str], sections: list[Section], file: str, bom: bool = False,
                 from_yaml: bool = False):
        self.lines = lines
        self.sections = sections
        self.file = file
        self.bom = bom
        # A YAML document's option lines are YAML line numbers (for errors); its `lines` are generated
        # cfg text, so edits change the options and regenerate the text instead of editing a line.
        self.from_yaml = from_yaml
        #: problems the reader found that do not stop it (duplicate keys), as one-line messages;
        #: each was also issued as a CfgWarning. `cfg_problems` lists them first.
        self.parse_warnings: list[str] = []

    # -- access ---------------------------------------------------------------------------------
    @property
    def net(self) -> Section:
        return self.sections[0]

    @property
    def layers(self) -> list[Section]:
        return self.sections[1:]

    def text(self) -> str:
        return ("\ufeff" if self.bom else "") + "".join(self.lines)

    def serialize(self, path: str | os.PathLike | None = None) -> str:
        """The text `write(path)` writes: YAML for a .yaml/.yml path, else the cfg lines."""
        path = os.fspath(path or self.file)
        return sections_to_yaml(self.sections) if path.endswith((".yaml", ".yml")) else self.text()

    def write(self, path: str | os.PathLike | None = None) -> None:
        """Write the document (atomically: temp file + rename)."""
        path = os.fspath(path or self.file)
        data = self.serialize(path)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(data)
        os.replace(tmp, path)

    def section(self, ref: str) -> Section:
        """`net` (or `network`), a layer index `3`, or a negative index `-1` (the last layer)."""
        if ref in ("net", "network"):
            return self.net
        try:
            i = int(ref)
        except ValueError:
            raise CfgError(f"unknown section reference {ref!r} (expected 'net' or a layer index)",
                           self.file) from None
        n = len(self.layers)
        j = i + n if i < 0 else i
        if not 0 <= j < n:
            raise CfgError(f"layer index {i} out of range (the file has {n} layers)", self.file)
        return self.layers[j]

    def get(self, path: str) -> str | None:
        ref, key = _split_path(path, self.file)
        opt = self.section(ref).options.get(key)
        return None if opt is None else opt.value

    def require(self, path: str) -> str:
        """As `get`, but a key that is not set is a CfgError naming the section and key."""
        ref, key = _split_path(path, self.file)
        sec = self.section(ref)
        if key not in sec.options:
            raise sec.error("not set in this section", key)
        return sec.options[key].value

    def apply_edits(self, assignments: Iterable[str] = (), unset: Iterable[str] = ()) -> None:
        """Apply `SECTION.KEY=VALUE` assignments, then remove each `SECTION.KEY` in `unset`."""
        for item in assignments:
            path, eq, value = item.partition("=")
            if not eq:
                raise CfgError(f"bad assignment {item!r} (expected SECTION.KEY=VALUE, e.g. net.batch=64)",
                               self.file)
            self.set(path.strip(), value)
        for path in unset:
            self.unset(path)

    # -- editing (line-preserving) --------------------------------------------------------------
    def _eol(self) -> str:
        crlf = sum(1 for ln in self.lines if ln.endswith("\r\n"))
        return "\r\n" if crlf * 2 > len(self.lines) else "\n"

    def set(self, path: str, value: str) -> None:
        """Set `section.key=value`, editing the key's line in place or adding a line to the section."""
        ref, key = _split_path(path, self.file)
        sec = self.section(ref)
        value = _WS.sub("", str(value))
        if not value:
            raise sec.error("empty value (write a value, or remove the key)", key)
        opt = sec.options.get(key)
        if self.from_yaml:
            if opt is None:
                sec.options[key] = Option(key, value, 0)
            else:
                opt.value = value
            self.lines = _cfg_lines(self.sections)
            return
        if opt is not None and opt.line > 0:
            old = self.lines[opt.line - 1]
            body = old.rstrip("\r\n")
            eol = old[len(body):]
            cut = min([i for i in (body.find("#"), body.find(";")) if i >= 0], default=len(body))
            head, comment = body[:cut], body[cut:]
            eq = head.index("=")
            before_value = head[: eq + 1] + head[eq + 1:][: len(head[eq + 1:]) - len(head[eq + 1:].lstrip())]
            trailing = head[len(head.rstrip()):]
            self.lines[opt.line - 1] = f"{before_value}{value}{trailing}{comment}{eol}"
            opt.value = value
            return
        # append after the section's last option (or its header)
        last = max([o.line for o in sec.options.values()] + [sec.line])
        eol = self._eol()
        if last - 1 < len(self.lines) and not self.lines[last - 1].endswith(("\n", "\r")):
            self.lines[last - 1] += eol
        self.lines.insert(last, f"{key}={value}{eol}")
        self._shift(last + 1, +1)
        sec.options[key] = Option(key, value, last + 1)

    def unset(self, path: str) -> None:
        ref, key = _split_path(path, self.file)
        sec = self.section(ref)
        opt = sec.options.pop(key, None)
        if opt is None:
            raise sec.error("no such key to remove", key)
        if self.from_yaml:
            self.lines = _cfg_lines(self.sections)
        elif opt.line > 0:
            del self.lines[opt.line - 1]
            self._shift(opt.line + 1, -1)

    def _shift(self, from_line: int, delta: int) -> None:
        for sec in self.sections:
            if sec.line >= from_line:
                sec.line += delta
            for o in sec.options.values():
                if o.line >= from_line:
                    o.line += delta

    def reparse(self) -> "CfgDocument":
        return parse_cfg(self.text(), self.file)


def _split_path(path: str, file: str) -> tuple[str, str]:
    if "." not in path:
        raise CfgError(f"bad key path {path!r} (expected SECTION.KEY, e.g. net.batch or 3.filters)", file)
    ref, key = path.rsplit(".", 1)
    if not key:
        raise CfgError(f"bad key path {path!r} (no key after the dot)", file)
    return ref, key


def parse_cfg(text: str | bytes, file: str = "<cfg>") -> CfgDocument:
    """Parse cfg text. Raises CfgError (one line, with file:line) on anything malformed."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CfgError(f"not a text file (invalid UTF-8 at byte {e.start})", file) from None
    bom = text.startswith("\ufeff")
    if bom:
        text = text[1:]
    if "\x00" in text:
        raise CfgError("not a text file (contains NUL bytes)", file)
    lines = text.splitlines(keepends=True)
    sections: list[Section] = []
    parse_warnings: list[str] = []
    for n, raw in enumerate(lines, start=1):
        body = raw.rstrip("\r\n")
        stripped = _WS.sub("", body)
        if not stripped or stripped[0] in "#;":
            continue
        if stripped[0] == "[":
            head = stripped.split("#", 1)[0].split(";", 1)[0]
            if not head.endswith("]") or len(head) < 3:
                raise CfgError(f"malformed section header (got {body.strip()!r}, expected [name])", file, n)
            kind = head[1:-1]
            index = len(sections) - 1
            if not sections and kind not in ("net", "network"):
                raise CfgError(f"the first section must be [net] or [network] (got [{kind}])", file, n)
            sections.append(Section(kind, index, n, file))
            continue
        kv = _split_option(body)
        if not sections:
            raise CfgError(f"option before any section (got {body.strip()!r}); start the file with [net]",
                           file, n)
        sec = sections[-1]
        if kv is None:
            raise CfgError(f"expected key=value (got {body.strip()!r})", file, n, sec.index, sec.kind)
        key, value = kv
        joined = _JOINED_DIGITS.search(body.split("#", 1)[0].split(";", 1)[0].partition("=")[2])
        if joined and key:
            # darknet: strip() removes every space, so "61,45    61,45" reads as 61,4561,45
            warning = CfgError(f"whitespace between digits ({joined.group(0)!r}) is removed, joining them "
                               f"into one number, as in darknet; a missing comma?",
                               file, n, sec.index, sec.kind, key).format()
            parse_warnings.append(warning)
            warnings.warn(warning, CfgWarning, stacklevel=2)
        if not key:
            raise CfgError(f"missing key before '=' (got {body.strip()!r})", file, n, sec.index, sec.kind)
        if not value:
            raise CfgError("missing value after '='", file, n, sec.index, sec.kind, key)
        if key in sec.options:
            # darknet: option_find scans the section's list from the front and list_insert appends,
            # so the first of two values is the one used (e.g. "# Testing" and "# Training" blocks
            # both left active). darkpy does the same, and says so once per repeated line.
            first = sec.options[key]
            if first.value != value:
                msg = (f"duplicate key: line {first.line} sets {first.value!r}, line {n} sets {value!r}; "
                       f"the first is used ({key}={first.value}), as in darknet")
            else:
                msg = f"duplicate key, same value as line {first.line}; the first is used"
            warning = CfgError(msg, file, n, sec.index, sec.kind, key).format()
            parse_warnings.append(warning)
            warnings.warn(warning, CfgWarning, stacklevel=2)
            continue
        sec.options[key] = Option(key, value, n)
    if not sections:
        raise CfgError("the file has no sections (expected [net] first)", file)
    doc = CfgDocument(lines, sections, file, bom)
    doc.parse_warnings = parse_warnings
    return doc


def load_cfg(path: str | os.PathLike) -> CfgDocument:
    """Read a `.cfg` (or `.yaml`/`.yml` network file) from disk."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CfgError("no such file", path) from None
    except IsADirectoryError:
        raise CfgError("is a directory, not a cfg file", path) from None
    except OSError as e:
        raise CfgError(f"cannot read ({e.strerror})", path) from None
    if path.endswith((".yaml", ".yml")):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CfgError(f"not a text file (invalid UTF-8 at byte {e.start})", path) from None
        return parse_yaml(text, path)
    return parse_cfg(data, path)


# -- YAML ⇄ cfg -------------------------------------------------------------------------------------

def sections_to_yaml(sections: list[Section]) -> str:
    """A YAML list of one-key mappings: `- convolutional: {filters: 32, ...}` (comments are not kept)."""
    import yaml

    items = []
    for sec in sections:
        opts = {}
        for k, o in sec.options.items():
            opts[k] = _yaml_scalar(o.value)
        items.append({sec.kind: opts})
    return yaml.safe_dump(items, sort_keys=False, default_flow_style=False)


def _yaml_scalar(value: str) -> Any:
    for conv in (int, float):
        try:
            v = conv(value)
        except ValueError:
            continue
        if str(v) == value:  # keep '0.0010' style text as text so the round trip is exact
            return v
        return value
    return value


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (list, tuple)):
        return ",".join(_scalar_text(v) for v in value)
    return _WS.sub("", str(value))


def yaml_to_cfg_text(text: str, file: str = "<yaml>") -> str:
    doc = parse_yaml(text, file)
    out = []
    for i, sec in enumerate(doc.sections):
        if i:
            out.append("")
        out.append(f"[{sec.kind}]")
        out.extend(f"{k}={o.value}" for k, o in sec.options.items())
    return "\n".join(out) + "\n"


def parse_yaml(text: str, file: str = "<yaml>") -> CfgDocument:
    """Parse a YAML network (see `sections_to_yaml`) into a document whose lines are the cfg text."""
    import yaml

    try:
        root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        why = " ".join(str(getattr(e, "problem", None) or e).split())   # one line, always
        raise CfgError(f"invalid YAML ({why})", file, mark.line + 1 if mark else None) from None
    constructor = yaml.SafeLoader("")      # builds Python values from the composed nodes
    if root is None or not isinstance(root, yaml.SequenceNode):
        raise CfgError("a YAML network is a list of sections, e.g. '- net: {batch: 1}'", file,
                       root.start_mark.line + 1 if root is not None else None)
    sections: list[Section] = []
    for item in root.value:
        line = item.start_mark.line + 1
        if not isinstance(item, yaml.MappingNode) or len(item.value) != 1:
            raise CfgError("each list item must be one mapping 'type: {key: value}'", file, line)
        knode, vnode = item.value[0]
        kind = _WS.sub("", str(knode.value))
        index = len(sections) - 1
        if not sections and kind not in ("net", "network"):
            raise CfgError(f"the first section must be net or network (got {kind})", file, line)
        sec = Section(kind, index, line, file)
        if isinstance(vnode, yaml.ScalarNode) and vnode.value in ("", "~", "null"):
            pass
        elif not isinstance(vnode, yaml.MappingNode):
            raise CfgError("section options must be a mapping of key: value", file, line, index, kind)
        else:
            for kn, vn in vnode.value:
                key = _WS.sub("", str(kn.value))
                kline = kn.start_mark.line + 1
                if key in sec.options:
                    raise CfgError("duplicate key", file, kline, index, kind, key)
                try:
                    value = constructor.construct_object(vn, deep=True)
                except yaml.YAMLError:      # e.g. a recursive alias
                    value = None
                if not _plain_value(value):
                    raise CfgError("a value must be a number, a string or a list", file, kline, index, kind, key)
                sec.options[key] = Option(key, _scalar_text(value), kline)
        sections.append(sec)
    if not sections:
        raise CfgError("the file has no sections", file)
    return CfgDocument(_cfg_lines(sections), sections, file, from_yaml=True)


def _plain_value(value: Any) -> bool:
    """A YAML value that has a cfg spelling: a non-empty scalar, or a non-empty list of scalars."""
    scalar = (bool, int, float, str)
    if isinstance(value, list):
        return bool(value) and all(isinstance(v, scalar) and v != "" for v in value)
    return isinstance(value, scalar) and value != ""


def _cfg_lines(sections: list[Section]) -> list[str]:
    """The cfg text of `sections`, one line per list item (a blank line between sections)."""
    cfg_lines = []
    for i, sec in enumerate(sections):
        if i:
            cfg_lines.append("\n")
        cfg_lines.append(f"[{sec.kind}]\n")
        cfg_lines.extend(f"{k}={o.value}\n" for k, o in sec.options.items())
    return cfg_lines


def diff_text(old: str, new: str, file: str) -> str:
    return "".join(difflib.unified_diff(io.StringIO(old).readlines(), io.StringIO(new).readlines(),
                                        fromfile=file, tofile=file))
