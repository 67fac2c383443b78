"""pack.py — the token stream: raw little-endian tokens (and mask bytes) in temporary files, and the
packer that lays documents into the loader's windows.

The loader cuts a shard of n tokens into windows of seq_len+1 tokens with stride seq_len (window k =
stream[k*S : k*S+S+1]; the last token of one window is the first of the next). The packer starts a
document that does not fit in what is left of the current window at the next window, filling the gap
with pad tokens of mask 0; the first token after a gap gets mask 0 too (its context is padding). A
document longer than a window (S+1 tokens) is dropped (--long drop) or starts at a window boundary and
runs on across windows (--long split). The stream ends padded to W*S+1 tokens, W whole windows."""
import array

import numpy as np

from .shard import ShardError


class Sink:
    """Appends tokens (and masks, when with_mask) to two temporary files; counts tokens and mask ones
    and keeps where each document starts (docs: stream positions, increasing). Every id must be < vocab
    (which fits token_bytes): an id is never cut to the stored width."""

    def __init__(self, tokens_path, mask_path, token_bytes, vocab):
        self.dtype = np.dtype("<u2" if token_bytes == 2 else "<u4")
        self.vocab = vocab
        self.tf = open(tokens_path, "wb")
        self.mf = open(mask_path, "wb") if mask_path else None
        self.n = self.ones = 0
        self.docs = array.array("q")

    def write(self, toks, mask, starts_doc=False):
        """Appends toks (and mask); starts_doc: toks[0] begins a document."""
        if not len(toks):
            return
        if starts_doc:
            self.docs.append(self.n)
        top = int(np.max(toks))
        if top >= self.vocab:
            raise ShardError(f"token id {top} >= the shard's vocab_size {self.vocab} (the largest id + 1)")
        self.tf.write(np.asarray(toks).astype(self.dtype, copy=False).tobytes())
        if self.mf is not None:
            m = np.ones(len(toks), np.uint8) if mask is None else mask
            self.mf.write(m.tobytes())
            self.ones += int(np.count_nonzero(m))
        self.n += len(toks)

    def close(self):
        self.tf.close()
        if self.mf is not None:
            self.mf.close()


class Packer:
    """add() takes the segments of one worker result in order; documents may span several calls."""

    def __init__(self, sink, seq_len, long_mode, pad_id):
        self.sink, self.S, self.long_mode, self.pad = sink, seq_len, long_mode, pad_id
        self.docs = self.dropped_docs = self.dropped_tokens = self.split_docs = self.pad_tokens = 0
        self.notes = {}       # {kind: [count, where of the first]}: inputs skipped or repaired (worker.NOTES)
        self.pend = []        # (tokens, mask) of the document being collected
        self.pend_n = 0
        self.state = None     # None, "drop" or "split": what happens to the rest of a long document
        self.after_gap = False
        self.in_doc = False   # the open document has tokens written: its next piece starts nothing

    def add(self, toks, mask, lens, ends):
        if not self.S:  # no packing: the stream is the documents back to back
            off = 0
            for n, end in zip(lens.tolist(), ends.tolist()):
                if n and not self.in_doc:
                    self.sink.docs.append(self.sink.n + off)
                    self.in_doc = True
                off += n
                self.in_doc = self.in_doc and not end
            self.sink.write(toks, mask)
            self.docs += int(np.count_nonzero(ends))
            return
        off = 0
        for n, end in zip(lens.tolist(), ends.tolist()):
            t = toks[off:off + n]
            m = None if mask is None else mask[off:off + n]
            off += n
            self._segment(t, m, end)

    def _segment(self, t, m, end):
        if self.state == "drop":
            self.dropped_tokens += len(t)
        elif self.state == "split":
            self._emit(t, m)
        else:
            self.pend.append((t, m))
            self.pend_n += len(t)
            if self.pend_n > self.S + 1:
                if self.long_mode == "drop":
                    self.state = "drop"
                    self.dropped_tokens += self.pend_n
                else:
                    self.state = "split"
                    self.split_docs += 1
                    self._pad_to(-(-self.sink.n // self.S) * self.S)
                    for pt, pm in self.pend:
                        self._emit(pt, pm)
                self.pend, self.pend_n = [], 0
            elif end:
                room = (self.sink.n // self.S) * self.S + self.S + 1 - self.sink.n
                if self.pend_n > room:
                    self._pad_to((self.sink.n // self.S + 1) * self.S)
                for pt, pm in self.pend:
                    self._emit(pt, pm)
                self.pend, self.pend_n = [], 0
        if end:
            if self.state == "drop":
                self.dropped_docs += 1
            else:
                self.docs += 1
            self.state = None
            self.in_doc = False

    def _emit(self, t, m):
        if m is None:
            m = np.ones(len(t), np.uint8)
        if self.after_gap and len(t):
            m = m.copy()
            m[0] = 0
            self.after_gap = False
        self.sink.write(t, m, starts_doc=not self.in_doc)
        self.in_doc = self.in_doc or len(t) > 0

    def _pad_to(self, pos):
        k = pos - self.sink.n
        if k > 0:
            self.sink.write(np.full(k, self.pad, np.uint32), np.zeros(k, np.uint8))
            self.pad_tokens += k
            self.after_gap = True

    def finish(self):
        """Ends the stream: a document still open (its last piece never came) is written as it is,
        then, when packing, the last window is padded to full length."""
        if self.pend:
            for pt, pm in self.pend:
                self._emit(pt, pm)
            self.pend = []
        if self.S and self.sink.n:
            w = max(1, -(-(self.sink.n - 1) // self.S))
            self._pad_to(w * self.S + 1)


class PairPacker:
    """--pairs: each sequence (the segments come as chosen, rejected, chosen, ...) starts a window of its own and
    is padded to seq_len tokens (its last target is then padding, mask 0, and the window's extra last token is the
    next sequence's first, a prompt token of mask 0); the stream ends with one pad token: 2 P seq_len + 1 tokens,
    the layout of a version 4 pair shard (shard.py)."""

    def __init__(self, sink, seq_len, pad_id):
        self.sink, self.S, self.pad = sink, seq_len, pad_id
        self.docs = self.pad_tokens = self.dropped_docs = self.dropped_tokens = self.split_docs = 0
        self.notes = {}

    def add(self, toks, mask, lens, ends):
        off = 0
        for n in lens.tolist():
            if n > self.S:
                raise ShardError(f"a pair sequence of {n} tokens > --seq-len {self.S} reached the packer")
            self.sink.write(toks[off:off + n], mask[off:off + n], starts_doc=True)
            self._pad(self.S - n)
            off += n
            self.docs += 1

    def _pad(self, k):
        if k > 0:
            self.sink.write(np.full(k, self.pad, np.uint32), np.zeros(k, np.uint8))
            self.pad_tokens += k

    @property
    def pairs(self):
        return self.docs // 2

    def finish(self):
        if self.sink.n:
            self._pad(1)
