"""HDF5 integrity of recordings (docs/integrity.md, "Truncated and corrupt recordings"): what is checked
before HDF5 reads a file, and what the writer stores so that it can be.

Before HDF5 sees a file, `check_whole` compares its size with the end-of-file address of the HDF5
superblock and checks the superblock's checksum (`lookup3`); the file is then opened plainly
(`open_checked`; never in SWMR mode, whose reader retries a bad metadata read for minutes), so HDF5
verifies each metadata checksum once. A writer killed in SWMR mode leaves the "open for writing" flags
set; `clear_write_flags` clears them before a resume. HDF5's global heaps (where variable-length
strings live) have no checksum, and a corrupt one can send HDF5 into an endless loop, so the writer
stores their SHA-256 (`seal`: the `integrity` attribute) and readers compare them (`check_sealed`)
before reading any string. Needs neither torch nor transformer_lens.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
from dataclasses import dataclass

import h5py
import numpy as np

from ..core.errors import UserError
from ..core.outputs import HDF5_MAGIC

INTEGRITY = "integrity"
"""Root attribute: SHA-256 of each HDF5 global heap collection (docs/formats.md, Recordings)."""
HDF5_SIGNATURE = HDF5_MAGIC
HDF5_ERRORS = (OSError, KeyError, RuntimeError)
"""What h5py raises for corrupt metadata (opening a file, an object, visiting a group)."""
WRITE_FLAGS = 0x1 | 0x4
"""Superblock consistency flags "open for writing" and "open for SWMR writing": set while a writer
has the file open, and left set by a writer that was killed."""


@dataclass(frozen=True)
class Superblock:
    """The fixed-layout fields of an HDF5 superblock that tell whether a file is whole.

    Field offsets: the HDF5 file format specification, "Superblock" (versions 0 to 3), as
    summarised in docs/integrity.md.
    """

    at: int  # where the signature is: 0, or 512, 1024, ... after a user block
    version: int
    flags: int  # file consistency flags (WRITE_FLAGS)
    lengths: int  # bytes of a length field
    eof: int  # end-of-file address: the size HDF5 recorded when it last wrote the superblock
    raw: bytes  # versions 2 and 3: the superblock, ending in its checksum; b"" for 0 and 1

    def checksum_ok(self) -> bool:
        return not self.raw or lookup3(self.raw[:-4]) == int.from_bytes(self.raw[-4:], "little")


def read_superblock(path) -> Superblock | None:
    """The superblock of an HDF5 file, or None when there is no HDF5 signature."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            at = 0
            while at + 8 <= size:  # HDF5 looks for its signature at 0, 512, 1024, 2048, ...
                f.seek(at)
                head = f.read(96)  # the longest superblock prefix needed (16-byte addresses)
                if head[:8] == HDF5_SIGNATURE:
                    break
                at = 512 if at == 0 else 2 * at
            else:
                return None
    except OSError as e:
        raise UserError(f"{path}: cannot be read ({e.strerror or e})") from None
    if len(head) < 16:
        raise UserError(f"{path}: truncated HDF5 file (it ends inside its superblock)")
    version = head[8]
    if version in (0, 1):
        o, lengths, flags, base = head[13], head[14], int.from_bytes(head[20:24], "little"), 24 + 4 * version
    elif version in (2, 3):
        o, lengths, flags, base = head[9], head[10], head[11], 12
    else:
        raise UserError(f"{path}: corrupt HDF5 file (unknown superblock version {version})")
    end = base + (4 if version >= 2 else 3) * o + (4 if version >= 2 else 0)
    if o not in (2, 4, 8, 16) or len(head) < end:
        raise UserError(f"{path}: corrupt or truncated HDF5 file (unreadable superblock)")
    eof = int.from_bytes(head[base + 2 * o : base + 3 * o], "little")  # after the base and one more address
    return Superblock(at, version, flags, lengths, eof, head[:end] if version >= 2 else b"")


def check_whole(path) -> Superblock:
    """Refuse a file that is not a whole HDF5 file, before HDF5 opens it (a UserError naming it).

    Truncation: HDF5 records the file's end in the superblock each time it writes it; a file
    shorter than that lost its tail. The superblock of versions 2 and 3 carries a checksum.
    """
    sb = read_superblock(path)
    if sb is None:
        raise UserError(f"{path}: not an HDF5 file (no HDF5 signature)")
    if not sb.checksum_ok():
        raise UserError(f"{path}: corrupt HDF5 file (superblock checksum mismatch)")
    size = os.path.getsize(path)
    if size < sb.eof:
        raise UserError(f"{path}: truncated HDF5 file ({size} bytes; its superblock records {sb.eof})")
    return sb


def clear_write_flags(path, sb: Superblock) -> None:
    """Clear the "open for writing" flags a killed SWMR writer left, as `h5clear -s -i` does.

    With the flags set HDF5 opens the file only in SWMR mode, whose reader retries a failing
    metadata read for minutes instead of failing; cleared, a plain open checks everything
    once. The end-of-file address is raised to the file's size, so chunks written after the
    superblock was last flushed stay addressable.
    """
    if len(sb.raw) < 12:
        raise UserError(f"{path}: left open by a writer, and its superblock (version {sb.version}) cannot be repaired")
    o = sb.raw[9]
    raw = bytearray(sb.raw)
    raw[11] = sb.flags & ~WRITE_FLAGS
    raw[12 + 2 * o : 12 + 3 * o] = max(sb.eof, os.path.getsize(path)).to_bytes(o, "little")
    raw[-4:] = lookup3(bytes(raw[:-4])).to_bytes(4, "little")
    with open(path, "r+b") as f:
        f.seek(sb.at)
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())


_M32 = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M32


def lookup3(data: bytes, initval: int = 0) -> int:
    """Bob Jenkins' lookup3 `hashlittle`, the checksum of HDF5 metadata (superblock v2/v3)."""
    M = _M32
    a = b = c = (0xDEADBEEF + len(data) + initval) & M
    if not data:
        return c
    data = data + bytes(-len(data) % 12)  # a zero-padded last block adds what lookup3's tail switch adds
    w = [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]
    for i in range(0, len(w) - 3, 3):  # every block but the last: add, then mix
        a, b, c = (a + w[i]) & M, (b + w[i + 1]) & M, (c + w[i + 2]) & M
        a = ((a - c) & M) ^ _rot(c, 4)
        c = (c + b) & M
        b = ((b - a) & M) ^ _rot(a, 6)
        a = (a + c) & M
        c = ((c - b) & M) ^ _rot(b, 8)
        b = (b + a) & M
        a = ((a - c) & M) ^ _rot(c, 16)
        c = (c + b) & M
        b = ((b - a) & M) ^ _rot(a, 19)
        a = (a + c) & M
        c = ((c - b) & M) ^ _rot(b, 4)
        b = (b + a) & M
    a, b, c = (a + w[-3]) & M, (b + w[-2]) & M, (c + w[-1]) & M  # the last block: add, then final
    c = ((c ^ b) - _rot(b, 14)) & M
    a = ((a ^ c) - _rot(c, 11)) & M
    b = ((b ^ a) - _rot(a, 25)) & M
    c = ((c ^ b) - _rot(b, 16)) & M
    a = ((a ^ c) - _rot(c, 4)) & M
    b = ((b ^ a) - _rot(a, 14)) & M
    c = ((c ^ b) - _rot(b, 24)) & M
    return c


def global_heaps(path) -> list[list]:
    """[[offset, size, sha256], ...] of each HDF5 global heap collection in the file.

    A collection starts with "GCOL", version 1, three reserved bytes and its size (format
    specification, "Global Heap"). Bytes that merely look like one (in data) get a digest
    too; that is harmless, as they do not change either.
    """
    lengths = read_superblock(path).lengths
    out = []
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        at = mm.find(b"GCOL\x01")
        while at >= 0:
            size = int.from_bytes(mm[at + 8 : at + 8 + lengths], "little")
            if 16 <= size <= len(mm) - at:
                out.append([at, size, hashlib.sha256(mm[at : at + size]).hexdigest()])
            at = mm.find(b"GCOL\x01", at + 1)
    return out


def seal(f: h5py.File) -> None:
    """Store the digests of the global heaps (`INTEGRITY`), once every string attribute exists.

    As fixed-length bytes, the attribute lives in HDF5's checksummed attribute storage, not
    in a global heap itself.
    """
    f.flush()
    f.attrs[INTEGRITY] = np.bytes_(json.dumps({"global_heaps": global_heaps(f.filename)}).encode())
    f.flush()


def check_sealed(f: h5py.File, path) -> None:
    """Compare the global heaps with their digests (a file without `INTEGRITY` passes: older
    versions did not write it). Call before reading any string attribute."""
    raw = f.attrs.get(INTEGRITY)
    raw = raw.decode() if isinstance(raw, bytes) else raw
    if raw is None:
        return
    try:
        heaps = [(int(a), int(n), str(d)) for a, n, d in json.loads(raw)["global_heaps"]]
    except (ValueError, TypeError, KeyError):
        raise UserError(f"{path}: corrupt recording (unreadable {INTEGRITY} attribute)") from None
    with open(path, "rb") as fh:
        for at, size, digest in heaps:
            fh.seek(at)
            if hashlib.sha256(fh.read(size)).hexdigest() != digest:
                raise UserError(f"{path}: corrupt recording (the HDF5 global heap at byte {at}, which holds its "
                                "string attributes, changed since it was written)")


def integrity_digest(f: h5py.File) -> str:
    """SHA-256 of a file's `INTEGRITY` attribute (it changes whenever the file is rewritten): how a
    master file names the exact shard it was made from."""
    raw = f.attrs.get(INTEGRITY, b"")
    return hashlib.sha256(raw if isinstance(raw, bytes) else str(raw).encode()).hexdigest()


def reason(e: BaseException) -> str:
    """HDF5's complaint, one line."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def open_checked(path, chunk_cache: bool = True) -> h5py.File:
    """An HDF5 file opened for reading once it passed the integrity checks (docs/integrity.md,
    "Truncated and corrupt recordings"); a UserError names the file if it is truncated, corrupt
    or still marked open by a writer. Read a recording's attributes through this, not h5py.File.
    `chunk_cache` False: without HDF5's chunk cache (`Recording`: a file with no compressed dataset).
    """
    sb = check_whole(path)
    if sb.flags & WRITE_FLAGS:
        # its writer is still running or was killed; only `record --resume` opens such a file
        raise UserError(f"{path}: recording is incomplete (complete=false, still open by a writer or left by a "
                        "killed one); finish it with --resume")
    try:
        # a plain open: HDF5 checks each metadata checksum once (SWMR mode would retry for minutes)
        f = h5py.File(path, "r", **({} if chunk_cache else {"rdcc_nbytes": 0}))
    except OSError as e:
        raise UserError(f"{path}: not an HDF5 file (or a corrupt one: {reason(e)})") from None
    try:
        check_sealed(f, path)  # before any string attribute is read
    except HDF5_ERRORS as e:
        f.close()
        raise UserError(f"{path}: corrupt HDF5 file ({reason(e)})") from None
    except BaseException:
        f.close()
        raise
    return f
