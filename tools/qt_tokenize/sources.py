"""sources.py — finds the input files and turns them into tasks of about `chunk` bytes for the workers,
reading as a stream (memory bounded by a few chunks, whatever the input size).

Formats (by extension after .gz / .zst / .zstd, or --format): text (.txt and anything else: one
document per file, or split on --doc-sep), JSON lines (.jsonl .ndjson .json), Parquet (.parquet,
pyarrow), Arrow streams (.arrow, as `datasets` writes them) and folders saved by `datasets`'
save_to_disk (state.json or dataset_dict.json inside). Directories are walked in sorted order, globs
are expanded sorted.

A task is a tuple the worker understands (worker.run):
  ("pieces", path, [(bytes, starts_doc, ends_doc, path, line), ...])
                                                          text; a long document comes in pieces cut
                                                          where tok.find_cut allows; line: of its
                                                          first byte
  ("jsonl", (path, first_line), bytes)                     whole lines
  ("rows", (path, first_row), [value, ...])                one column's values, or row dicts (--chat, --pairs)"""
import glob
import gzip
import io
import json
import os
import subprocess
import shutil

from .tok import find_cut

TEXT_EXT = {".txt", ".md", ".text"}
JSONL_EXT = {".jsonl", ".ndjson", ".json"}
KNOWN_EXT = TEXT_EXT | JSONL_EXT | {".parquet", ".arrow"}
COMPRESSED = (".gz", ".zst", ".zstd")
CHAT_COLUMNS = ("messages", "conversations", "prompt", "completion", "instruction", "input", "output",
                "system")
PAIR_COLUMNS = ("prompt", "chosen", "rejected")  # --pairs: a preference row


class InputError(Exception):
    pass


def need(module, what):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        pkg = {"pyarrow.parquet": "pyarrow", "pyarrow.ipc": "pyarrow"}.get(module, module)
        raise InputError(f"{what} needs the `{pkg}` package (pip install {pkg})")


def is_hf_dataset(d):
    return os.path.isfile(os.path.join(d, "state.json")) or os.path.isfile(os.path.join(d, "dataset_dict.json"))


def fmt_of(path, forced):
    if os.path.isdir(path):
        return "hf"
    if forced != "auto":
        return forced
    base = path
    for c in COMPRESSED:
        if base.endswith(c):
            base = base[:-len(c)]
    ext = os.path.splitext(base)[1].lower()
    return {".parquet": "parquet", ".arrow": "arrow"}.get(ext, "jsonl" if ext in JSONL_EXT else "text")


def expand(inputs, forced="auto"):
    """[(path, format)] in order: each argument is a file, a glob, a `datasets` folder or a directory
    (walked, sorted, keeping files with known extensions, compressed or not)."""
    out = []
    for arg in inputs:
        if any(c in arg for c in "*?["):
            paths = sorted(glob.glob(arg, recursive=True))
            if not paths:
                raise InputError(f"{arg}: matches no file")
        elif os.path.isdir(arg):
            paths = [arg]
        elif os.path.isfile(arg):
            paths = [arg]
        else:
            raise InputError(f"{arg}: no such file")
        for p in paths:
            if os.path.isdir(p) and not is_hf_dataset(p):
                found = []
                for root, dirs, files in os.walk(p):
                    dirs.sort()
                    for f in sorted(files):
                        base = f
                        for c in COMPRESSED:
                            base = base[:-len(c)] if base.endswith(c) else base
                        if os.path.splitext(base)[1].lower() in KNOWN_EXT:
                            found.append(os.path.join(root, f))
                if not found:
                    raise InputError(f"{p}: directory holds no input file ({', '.join(sorted(KNOWN_EXT))})")
                out += [(f, fmt_of(f, forced)) for f in found]
            else:
                out.append((p, fmt_of(p, forced)))
    return out


def _json_file(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})")
    except ValueError as e:
        raise InputError(f"{path}: not valid JSON ({e})")


def hf_files(d, split):
    """The .arrow files of a save_to_disk folder (a Dataset, or a DatasetDict's `split`); each one that
    state.json lists must exist."""
    dd = os.path.join(d, "dataset_dict.json")
    if os.path.isfile(dd):
        splits = _json_file(dd).get("splits", [])
        if split not in splits:
            raise InputError(f"{d}: no split {split!r} (has {', '.join(splits)}); choose one with --split")
        d = os.path.join(d, split)
    state = _json_file(os.path.join(d, "state.json"))
    files = []
    for f in state.get("_data_files", []):
        name = f.get("filename") if isinstance(f, dict) else None
        if not isinstance(name, str):
            raise InputError(f"{d}/state.json: _data_files entry {json.dumps(f)[:80]} has no filename")
        if not os.path.isfile(os.path.join(d, name)):
            raise InputError(f"{d}: missing {name} (state.json lists it; the folder is incomplete)")
        files.append(os.path.join(d, name))
    return files


def input_bytes(files, split):
    total = 0
    for p, fmt in files:
        total += sum(os.path.getsize(f) for f in hf_files(p, split)) if fmt == "hf" else os.path.getsize(p)
    return total


def reading(where, gen):
    """The items of gen; an exception other than InputError becomes one naming `where` (a string, or a
    function that gives it: the file and row reached)."""
    try:
        yield from gen
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 — pyarrow, gzip, zstandard and OS errors alike
        where = where() if callable(where) else where
        raise InputError(f"{where}: cannot read ({type(e).__name__}: {e})")


class Reader:
    """A binary stream of a possibly compressed file, and how far into the file on disk it has read."""

    def __init__(self, path):
        self.path, self.raw, self.proc = path, open(path, "rb"), None
        if path.endswith(".gz"):
            self.f = gzip.GzipFile(fileobj=self.raw)
        elif path.endswith((".zst", ".zstd")):
            try:
                import zstandard
                self.f = zstandard.ZstdDecompressor().stream_reader(self.raw, read_across_frames=True)
            except ImportError:
                if not shutil.which("zstd"):
                    raise InputError(f"{path}: reading .zst needs the `zstandard` package "
                                     "(pip install zstandard) or the zstd command-line tool")
                self.proc = subprocess.Popen(["zstd", "-q", "-d", "-c"], stdin=self.raw, stdout=subprocess.PIPE)
                self.f = self.proc.stdout
        else:
            self.f = self.raw

    def read(self, n):
        try:
            return self.f.read(n)
        except (OSError, EOFError, gzip.BadGzipFile) as e:
            raise InputError(f"{self.path}: cannot decompress ({e})")
        except Exception as e:  # zstandard.ZstdError
            raise InputError(f"{self.path}: cannot read ({e})")

    def pos(self):
        try:
            return self.raw.tell()
        except (OSError, ValueError):
            return 0

    def close(self):
        if self.proc:
            self.proc.stdout.close()
            if self.proc.wait() != 0:
                raise InputError(f"{self.path}: zstd -d failed")
        self.raw.close()


class Tasks:
    """Iterates over (task, input bytes done) for all files; `opts` holds chunk, doc_sep, field, chat,
    split and cut (the tokenizer's cut rules, or "any" for byte-level)."""

    def __init__(self, files, opts):
        self.files, self.o = files, opts
        self.done = 0          # bytes of finished files
        self.cur = None        # Reader of the file being read

    def progress(self):
        return self.done + (self.cur.pos() if self.cur else 0)

    def __iter__(self):
        pieces, size = [], 0   # text pieces are batched across small files
        for path, fmt in self.files:
            if fmt == "text":
                if self.o["chat"] or self.o["pairs"]:
                    raise InputError(f"{path}: --{'pairs' if self.o['pairs'] else 'chat'} reads JSON lines, Parquet "
                                     "or `datasets` folders, not text (use --format to force one)")
                for piece in reading(path, self._text(path)):
                    pieces.append(piece)
                    size += len(piece[0])
                    if size >= self.o["chunk"]:
                        yield ("pieces", path, pieces), self.progress()
                        pieces, size = [], 0
            else:
                if pieces:  # the text before this file goes first
                    yield ("pieces", path, pieces), self.progress()
                    pieces, size = [], 0
                gen = {"jsonl": self._jsonl, "parquet": self._parquet, "arrow": self._arrow,
                       "hf": self._hf}[fmt]
                for task in reading(path, gen(path)):
                    yield task, self.progress()
            self.done += (input_bytes([(path, fmt)], self.o["split"]))
            self.cur = None
        if pieces:
            yield ("pieces", self.files[-1][0], pieces), self.progress()

    def _text(self, path):
        """(bytes, starts_doc, ends_doc, path, line) pieces of the file's documents; empty documents are
        skipped."""
        chunk, sep, rules = self.o["chunk"], self.o["doc_sep"], self.o["cut"]
        r = self.cur = Reader(path)
        buf, starts, line = b"", True, 1
        while True:
            data = r.read(chunk)
            buf += data
            if sep:
                while True:
                    i = buf.find(sep)
                    if i < 0:
                        break
                    if i or not starts:
                        yield buf[:i], starts, True, path, line
                    line += buf.count(b"\n", 0, i + len(sep))
                    buf, starts = buf[i + len(sep):], True
            if not data:
                if buf or not starts:
                    yield buf, starts, True, path, line
                r.close()
                return
            if len(buf) >= chunk and rules:
                limit = len(buf) - (len(sep) - 1 if sep else 0)
                cut = limit if rules == "any" else find_cut(buf, rules, limit)
                if cut > 0:
                    yield buf[:cut], starts, False, path, line
                    line += buf.count(b"\n", 0, cut)
                    buf, starts = buf[cut:], False

    def _jsonl(self, path):
        r = self.cur = Reader(path)
        line, buf = 1, b""
        while True:
            data = r.read(self.o["chunk"])
            buf += data
            end = len(buf) if not data else buf.rfind(b"\n") + 1
            if end > 0 and buf[:end].strip():
                yield ("jsonl", (path, line), buf[:end])
            line += buf.count(b"\n", 0, end)
            buf = buf[end:]
            if not data:
                r.close()
                return

    def _columns(self, names, path):
        if self.o["pairs"]:
            missing = [c for c in PAIR_COLUMNS if c not in names]
            if missing:
                raise InputError(f"{path}: no column {missing[0]!r}: --pairs reads prompt, chosen and rejected "
                                 f"(has {', '.join(names)})")
            return list(PAIR_COLUMNS)
        if self.o["chat"]:
            cols = [c for c in names if c in CHAT_COLUMNS or c == self.o["messages_field"]]
            if not cols:
                raise InputError(f"{path}: no conversation columns (expected one of messages, "
                                 f"prompt/completion, instruction/output; has {', '.join(names)})")
            return cols
        if self.o["field"] not in names:
            raise InputError(f"{path}: no column {self.o['field']!r} (has {', '.join(names)}); "
                             "choose one with --field")
        return [self.o["field"]]

    def _batches(self, path, batches, names):
        """Groups record batches into row tasks of about chunk bytes."""
        cols = self._columns(names, path)
        rows, size, first = [], 0, 0
        for b in reading(lambda: f"{path}: row {first + len(rows)}", batches):
            b = b.select(cols)
            vals = b.to_pylist() if self.o["chat"] or self.o["pairs"] else b.column(0).to_pylist()
            rows += vals
            size += b.nbytes
            if size >= self.o["chunk"]:
                yield ("rows", (path, first), rows)
                first += len(rows)
                rows, size = [], 0
        if rows:
            yield ("rows", (path, first), rows)

    def _parquet(self, path):
        pq = need("pyarrow.parquet", f"{path}: Parquet input")
        try:
            pf = pq.ParquetFile(path)
        except Exception as e:  # noqa: BLE001 — pyarrow raises several types
            raise InputError(f"{path}: cannot read Parquet ({e})")
        yield from self._batches(path, pf.iter_batches(batch_size=1024), pf.schema_arrow.names)

    def _arrow(self, path):
        pa = need("pyarrow", f"{path}: Arrow input")
        try:
            rd = pa.ipc.open_stream(pa.memory_map(path))
        except Exception:  # noqa: BLE001 — not a stream: the random-access file format
            rd = pa.ipc.open_file(pa.memory_map(path))
            rd = (rd.get_batch(i) for i in range(rd.num_record_batches)), rd.schema
            yield from self._batches(path, rd[0], rd[1].names)
            return
        yield from self._batches(path, rd, rd.schema.names)

    def _hf(self, path):
        need("pyarrow", f"{path}: a `datasets` folder")
        for f in hf_files(path, self.o["split"]):
            yield from self._arrow(f)
