"""Reading a user's files with bounds, and text normalised the one way everything compares it.

Only regular files are opened: a FIFO would block forever and a device (``/dev/zero``,
``/dev/urandom``) never ends. A compressed file is recognised by its first bytes, whatever
its name (gzip, xz, bzip2, a zip holding one file); one it cannot open (zstd, a zip of
several files) is refused by name. Text is UTF-8 (a UTF-8 BOM dropped), or UTF-16/32 with a
BOM; anything else (NUL bytes, bytes that do not decode) is refused, never read as text with
holes in it. Every failure is an :class:`InputError` whose message is one line naming the
file.

Normalisation (:func:`normalise`), shared by the near-duplicate collapse and the held-out
check: Unicode NFKC (full-width letters, ligatures and compatibility forms fold to their plain
letters), zero-width characters, soft hyphens and other invisible format characters removed,
case folded, and the Cyrillic and Greek letters that look like Latin ones read as those.
"""

from __future__ import annotations

import bz2
import codecs
import gzip
import io
import lzma
import os
import re
import stat
import unicodedata
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

#: The most one record (a JSON value, a CSV row) may hold: memory stays bounded by it.
MAX_RECORD_CHARS = 64 * 2**20
CHUNK = 2**20

_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"BZh", "bzip2"),
    (b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip"), (b"\x28\xb5\x2f\xfd", "zstd"),
    (b"\x04\x22\x4d\x18", "lz4"), (b"7z\xbc\xaf\x27\x1c", "7z"),
)
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
         (codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
         (codecs.BOM_UTF16_BE, "utf-16"))
_DECOMPRESS_ERRORS = (OSError, EOFError, lzma.LZMAError, zlib.error, zipfile.BadZipFile)


class InputError(ValueError):
    """A file cannot be read as text; the message is one line naming it."""


def regular_file(path: Path) -> os.stat_result:
    """``path``'s stat, refusing anything but a regular file (it follows links)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
        raise InputError(f"{path}: {kind}, not a regular file; only regular files are read")
    return st


def compression(head: bytes) -> str | None:
    """The compressed format ``head`` (a file's first bytes) starts with, if any."""
    return next((name for magic, name in _MAGIC if head.startswith(magic)), None)


class _Bounded(io.RawIOBase):
    """A binary stream that fails once more than ``limit`` bytes came out of it (a
    decompression bomb is refused, not unpacked)."""

    def __init__(self, inner: IO[bytes] | gzip.GzipFile, limit: int, path: Path) -> None:
        self.inner, self.left, self.path = inner, limit, path
        self.limit = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        try:
            data = self.inner.read(len(buffer))
        except _DECOMPRESS_ERRORS as exc:
            raise InputError(f"{self.path}: cannot decompress: "
                             f"{' '.join(str(exc).split()) or type(exc).__name__}") from None
        self.left -= len(data)
        if self.left < 0:
            raise InputError(f"{self.path}: over {self.limit / 2**30:g} GiB once decompressed; "
                             "split it")
        buffer[:len(data)] = data
        return len(data)


@contextmanager
def open_binary(path: Path, limit: int) -> Iterator[tuple[io.BufferedReader, str | None]]:
    """``path``'s bytes (decompressed where its first bytes say so), at most ``limit`` of
    them, and the compression found."""
    st = regular_file(path)
    if st.st_size > limit:
        raise InputError(f"{path}: over {limit / 2**30:g} GiB; split it")
    try:
        raw = path.open("rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with raw:
        head = raw.read(8)
        raw.seek(0)
        kind = compression(head)
        inner: IO[bytes] | gzip.GzipFile
        if kind is None:
            inner = raw
        elif kind == "gzip":
            inner = gzip.GzipFile(fileobj=raw, mode="rb")
        elif kind == "xz":
            inner = lzma.LZMAFile(raw)  # noqa: SIM115 (closed with ``raw``)
        elif kind == "bzip2":
            inner = bz2.BZ2File(raw)
        elif kind == "zip":
            try:
                archive = zipfile.ZipFile(raw)
                names = [i for i in archive.infolist() if not i.is_dir()]
            except (zipfile.BadZipFile, OSError) as exc:
                raise InputError(f"{path}: cannot open as zip: {exc}") from None
            if len(names) != 1:
                raise InputError(f"{path}: a zip of {len(names)} files; unpack it and name "
                                 "the folder")
            inner = archive.open(names[0])
        else:
            raise InputError(f"{path}: {kind}-compressed, which is not read; decompress it")
        yield io.BufferedReader(_Bounded(inner, limit, path), CHUNK), kind


def _binary(sample: bytes) -> bool:
    return b"\x00" in sample


def text_chunks(path: Path, limit: int) -> Iterator[str]:
    """``path`` decoded, in chunks of about a MiB; raises InputError for text that is not
    UTF-8 (or UTF-16/32 with a BOM), and for binary data."""
    with open_binary(path, limit) as (stream, _):
        head = stream.peek(4)[:4]
        encoding = next((enc for bom, enc in _BOMS if head.startswith(bom)), "utf-8")
        decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
        done = 0
        lines = 1
        while True:
            data = stream.read(CHUNK)
            if encoding == "utf-8" and _binary(data):
                line = lines + data.count(b"\n", 0, data.index(b"\x00"))
                raise InputError(f"{path}:{line}: binary data (a NUL byte), not text; "
                                 "UTF-16 needs its BOM")
            try:
                text = decoder.decode(data, final=not data)
            except UnicodeDecodeError as exc:
                line = lines + data.count(b"\n", 0, max(0, exc.start))
                raise InputError(f"{path}:{line}: not valid {encoding.upper()} text (byte "
                                 f"{done + exc.start:,}); save it as UTF-8") from None
            done += len(data)
            lines += data.count(b"\n")
            if text:
                yield text
            if not data:
                return


def read_text(path: Path, limit: int) -> str:
    """The whole of ``path`` as text, with :func:`text_chunks`' bounds and refusals."""
    return "".join(text_chunks(path, limit))


# ----------------------------------------------------------------------- normalisation

# Cyrillic and Greek letters drawn like Latin ones (lowercase: case is folded first).
_HOMOGLYPHS = str.maketrans(
    "\u0430\u0432\u0435\u0451\u043a\u043c\u043d\u043e\u0440\u0441\u0442\u0443\u0445\u0455"
    "\u0456\u0457\u0458\u04bb\u0501\u051b\u051d\u0261\u03b1\u03b2\u03b5\u03b9\u03ba\u03bd"
    "\u03bf\u03c1\u03c4\u03c5\u03c7",
    "abeekmhopctyxsiijhdqwgabeikvoptux")
_INVISIBLE = re.compile("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f"
                        "\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff"
                        "\uffa0]")
_WORD = re.compile(r"\w+")


def normalise(text: str) -> str:
    """``text`` as compared: NFKC, invisible characters removed, case folded, lookalike
    Cyrillic and Greek letters read as Latin."""
    text = _INVISIBLE.sub("", unicodedata.normalize("NFKC", text))
    return text.casefold().translate(_HOMOGLYPHS)


def words(text: str) -> list[str]:
    """The normalised words of ``text`` (punctuation and layout ignored)."""
    return _WORD.findall(normalise(text))


# ----------------------------------------------------------------------- records


def lines(chunks: Iterator[str], path: Path, limit: int = MAX_RECORD_CHARS) -> Iterator[str]:
    """The lines of decoded ``chunks`` (ends kept); a line over ``limit`` characters is
    refused, so memory holds one bounded line."""
    rest = ""
    for chunk in chunks:
        parts = (rest + chunk).split("\n")
        rest = parts.pop()
        yield from (p + "\n" for p in parts)
        if len(rest) > limit:
            raise InputError(f"{path}: a line over {limit // 2**20} MiB characters; a record "
                             "that long is not read")
    if rest:
        yield rest


def pieces(chunks: Iterator[str]) -> Iterator[tuple[int, str]]:
    """Decoded text in bounded pieces cut at whitespace, each with the line it starts on:
    a file of one very long line is read a piece at a time."""
    line = 1
    rest = ""
    for chunk in chunks:
        text = rest + chunk
        cut = max(text.rfind(" "), text.rfind("\n"), text.rfind("\t"))
        if cut < 0 and len(text) < CHUNK:
            rest = text
            continue
        cut = len(text) if cut < 0 else cut + 1
        yield line, text[:cut]
        line += text.count("\n", 0, cut)
        rest = text[cut:]
    if rest:
        yield line, rest


_SPACE = re.compile(r"[ \t\r\n]*")
_DELIMITER = re.compile(r"[ \t\r\n,\]}]")


def json_values(chunks: Iterator[str], path: Path, limit: int = MAX_RECORD_CHARS
                ) -> Iterator[tuple[int, object]]:
    """The records of a JSON document, streamed: the elements of a top-level array, or each
    top-level value (JSON Lines, or values one after another, pretty-printed or not), each
    with the line it starts on. Memory holds one record (at most ``limit`` characters);
    a malformed document is an InputError naming the line."""
    import json

    decoder = json.JSONDecoder()
    source = iter(chunks)
    buf = ""
    pos = 0
    line = 1
    eof = False

    def more() -> bool:
        nonlocal buf, pos, eof
        if eof:
            return False
        chunk = next(source, None)
        if chunk is None:
            eof = True
            return False
        buf = buf[pos:] + chunk
        pos = 0
        return True

    def skip() -> str:
        """The next non-blank character (moving to it), or '' at the end."""
        nonlocal pos, line
        while True:
            end = _SPACE.match(buf, pos).end()  # type: ignore[union-attr]
            line += buf.count("\n", pos, end)
            pos = end
            if pos < len(buf):
                return buf[pos]
            if not more():
                return ""

    def fail(msg: str) -> InputError:
        return InputError(f"{path}:{line}: invalid JSON: {msg}")

    def value() -> object:
        nonlocal pos, line
        while True:
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                # Perhaps only cut by the chunk's end: read on, up to the bound.
                if len(buf) - pos > limit:
                    raise InputError(f"{path}:{line}: a record over {limit // 2**20} MiB "
                                     "characters, or invalid JSON") from None
                if more():
                    continue
                raise fail(f"{exc.msg}") from None
            except RecursionError:
                raise fail("nested too deeply") from None
            if buf[pos] not in "[{\"" and not _DELIMITER.search(buf, end) and more():
                continue  # a number or literal may go on in the next chunk
            line += buf.count("\n", pos, end)
            pos = end
            return obj

    first = skip()
    if first != "[":
        while first:
            start = line
            yield start, value()
            first = skip()
        return
    pos += 1
    if skip() == "]":
        pos += 1
    else:
        while True:
            if not skip():
                raise fail("the array is not closed")
            start = line
            yield start, value()
            sep = skip()
            if sep == ",":
                pos += 1
                continue
            if sep == "]":
                pos += 1
                break
            raise fail("expected ',' or ']' between elements")
    if skip():
        raise fail("extra data after the array")
