"""qtrain — quantized LLM training from Python: a C extension over qtrain's embeddable C API.

    import qtrain
    with qtrain.Trainer("configs/tiny-cpu.yaml", overrides={"optim.steps": 100}) as tr:
        for _ in range(100):
            rec = tr.step(tokens)          # int32 (rows, seq_len + 1), or no argument: the config's data
        print(tr.eval(), tr.parameters()["model.norm.weight"])
        tr.export("out/hf", dtype="bf16")

A Trainer runs the same steps as the `qtrain` program (bit for bit), with the GIL released; several
GPUs stay behind the one object. Errors are qtrain.Error subclasses carrying the C message.
"""
import os
import shutil

from ._qtrain import (ArgumentError, CheckpointError, ConfigError, DataError, DeviceError, DivergedError, Error,
                      OutputError)
from ._qtrain import Trainer as _Trainer

__all__ = ["Trainer", "Error", "ConfigError", "DataError", "CheckpointError", "DeviceError", "DivergedError",
           "OutputError", "ArgumentError"]
__version__ = "0.1.0"


def _override_list(overrides):
    """{"optim.lr": 3e-4, "eval.every": 0, "perf.cuda_graphs": False} -> ["optim.lr=0.0003", ...]."""
    if overrides is None:
        return None
    if isinstance(overrides, dict):
        out = []
        for k, v in overrides.items():
            if isinstance(v, bool):
                v = "true" if v else "false"
            elif isinstance(v, (list, tuple)):
                v = "[" + ", ".join(str(x) for x in v) + "]"
            out.append(f"{k}={v}")
        return out
    return [str(x) for x in overrides]


def _is_yaml_text(config):
    """A config string is YAML text when it holds a newline, or names no file and looks like a mapping."""
    return "\n" in config or (not os.path.exists(config) and ": " in config)


def _checked(x, what, kinds, hi, dtype, expected):
    """x as a C-contiguous array of dtype, or ArgumentError unless x's dtype is of kinds ("iu": integers,
    "iub": and bool) and every value is in [0, hi): no cast may wrap 2**32 + 5 to 5, truncate 5.7 to 5
    or turn a mask of 256 into 0. Without numpy: x as given (the extension takes int32 tokens and
    uint8/bool masks only, and checks their values)."""
    if x is None:
        return None
    try:
        import numpy as np
    except ImportError:
        return x
    a = np.asarray(x)
    if a.dtype.kind not in kinds:
        kind = "a bool or integer" if "b" in kinds else "an integer"
        raise ArgumentError(f"{what}: expected {expected}, of {kind} dtype, got dtype {a.dtype}")
    bad = (a < 0) | (a >= hi)
    if bad.any():
        at = "".join(f"[{int(i)}]" for i in np.argwhere(bad)[0])
        raise ArgumentError(f"{what}{at} = {a[bad][0]}: expected {expected}")
    return np.ascontiguousarray(a, dtype=dtype)


def _tokens(x, vocab):
    return _checked(x, "tokens", "iu", vocab, "int32", f"a token id in [0, {vocab}) (model.vocab_size)")


def _mask(m):
    return _checked(m, "mask", "iub", 2, "uint8", "0 or 1")


def _callbacks(on_step):
    """on_step (None, a callable or a sequence of callables) as a list of callables."""
    if on_step is None:
        return []
    fns = [on_step] if callable(on_step) else list(on_step)
    for fn in fns:
        if not callable(fn):
            raise TypeError(f"on_step: expected a callable or a list of callables, got {fn!r}")
    return fns


def _home():
    """The user's home directory (where the library keeps its tuning cache), or None where it has none."""
    home = os.path.expanduser("~")
    return None if home == "~" else home


class Trainer(_Trainer):
    """A qtrain run made from one YAML config.

    Trainer(config, overrides=None): config is a YAML file's path or YAML text; overrides a dict of
    keys ({"optim.lr": 3e-4}) or "key=value" strings, as `qtrain --set`. Every step also does what the
    config asks after it: a train record every log.every steps (stdout, log.file, the log callback),
    eval every eval.every steps, a checkpoint every checkpoint.every steps and at optim.steps.
    checkpoint.dir must not hold another run's checkpoints (CheckpointError), as with the CLI.
    Use as a context manager or call close().

    on_step: a callable, or a list of them, called after every optimizer step (step(), update()) with
    that step's metrics, a dict: step, loss, lr, grad_norm, tokens_per_s, saved, and eval_loss when
    eval.every fell on the step. They run on the stepping thread once the step is done, in order; one
    that raises skips the rest and its exception comes out of step() (the step is done and kept).
    The list is self.on_step: append to it or remove from it at any time. log: a callable given each
    record the run logs (the lines of log.file, every log.every steps) as a dict.

    One call at a time: a call while another thread's (or a callback's) call runs raises
    RuntimeError naming the running call; close() from another thread waits for it to end.
    """

    def __init__(self, config, overrides=None, *, resume=None, allow_changed=None, export_only=False, log=None,
                 on_step=None):
        self.on_step = _callbacks(on_step)
        super().__init__(config, _override_list(overrides), resume=resume, allow_changed=allow_changed,
                         export_only=export_only, config_is_text=config is not None and _is_yaml_text(config),
                         home=_home())
        self._vocab = self.info()["vocab_size"]
        if log is not None:
            self.set_log_callback(log)

    @classmethod
    def resume(cls, path_or_dir, config=None, overrides=None, *, allow_changed=None, log=None, on_step=None):
        """Continues a run from a checkpoint file or a checkpoint directory (its newest valid
        checkpoint: damaged newer ones are skipped with a warning and moved aside to *.bad, with or
        without a config). With config None, the config saved in the checkpoint is used."""
        return cls(config, overrides, resume=os.fspath(path_or_dir), allow_changed=allow_changed, log=log,
                   on_step=on_step)

    def _stepped(self, rec):
        """rec after the on_step callbacks have seen it (each gets its own copy)."""
        for fn in list(self.on_step):
            fn(dict(rec))
        return rec

    def step(self, tokens=None, mask=None):
        """One optimizer step; returns {"step", "loss", "grad_norm", "lr", "tokens_per_s", "saved"} (and
        "eval_loss" when eval.every fell on it). tokens: integer token ids (rows, seq_len + 1), rows =
        micro_batch x grad_accum x GPUs (info()["rows"]), or None for the config's data; mask: 0/1 like
        tokens (bool or an integer dtype), 0 = that token is not a target. A token outside
        [0, vocab_size), a float dtype or a mask value other than 0/1 raises ArgumentError naming the
        first bad [row][column]. Ctrl-C: the step finishes, then KeyboardInterrupt."""
        return self._stepped(super().step(_tokens(tokens, self._vocab), _mask(mask)))

    def backward(self, tokens=None, mask=None):
        """The first half of step(): the gradients are then readable (gradients()) until update()."""
        return super().backward(_tokens(tokens, self._vocab), _mask(mask))

    def update(self):
        """The second half of step(): AdamW and what follows a step; returns step()'s dict."""
        return self._stepped(super().update())

    def eval(self, tokens=None, mask=None):
        """The eval loss: over data.eval, or over the given rows (a multiple of micro_batch)."""
        return super().eval(_tokens(tokens, self._vocab), _mask(mask))

    def next_batch(self):
        """The configured loader's next step batch as (tokens int32, mask uint8), both (rows, seq_len + 1);
        the loader moves on as a step would, and step(tokens, mask) then trains exactly what step()
        would have."""
        import numpy as np
        tok, mask, rows, cols = self._next_batch()
        return (np.frombuffer(tok, dtype=np.int32).reshape(rows, cols).copy(),
                np.frombuffer(mask, dtype=np.uint8).reshape(rows, cols).copy())

    def save(self, path=None):
        """Writes a checkpoint of the current step into checkpoint.dir (waiting for it) and returns its
        path; with path, also copies it there."""
        src = self._save()
        if path is None:
            return src
        path = os.fspath(path)
        shutil.copyfile(src, path + ".tmp")
        os.replace(path + ".tmp", path)
        return path

    def _flat(self, grads):
        import numpy as np
        flat = np.empty(self.info()["numel"], dtype=np.float32)
        (self._read_gradients if grads else self._read_weights)(flat)
        return {name: flat[off:off + int(np.prod(shape))].reshape(shape) for name, shape, off in self.tensors()}

    def parameters(self):
        """{HF name: float32 numpy array}: copies of the weights (fp32 master copy on a GPU)."""
        return self._flat(False)

    def get_parameter(self, name):
        """One tensor's weights as a float32 numpy array (a copy)."""
        params = self.parameters()
        if name not in params:
            raise KeyError(f'no tensor "{name}" in this model')
        return params[name].copy()

    def gradients(self, device=False):
        """The gradients accumulated by backward() (zero after update()), by HF name.

        device=False: host float32 numpy copies (numpy arrays speak DLPack: torch.from_dlpack(g)
        shares their memory). device=True (one GPU): DLPack capsules of the GPU's fp32 gradients, no
        copy: torch.from_dlpack(capsule) is a CUDA tensor over the trainer's memory, valid until the
        next backward/update/step and while the trainer is open (each capsule keeps it alive)."""
        if device:
            return {name: self._grad_dlpack(name) for name, _, _ in self.tensors()}
        return self._flat(True)


del _Trainer
