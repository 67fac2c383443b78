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


def _batch(x, dtype):
    """x as a C-contiguous array of dtype when numpy is there (else as given: any buffer works)."""
    if x is None:
        return None
    try:
        import numpy as np
    except ImportError:
        return x
    return np.ascontiguousarray(x, dtype=dtype)


class Trainer(_Trainer):
    """A qtrain run made from one YAML config.

    Trainer(config, overrides=None): config is a YAML file's path or YAML text; overrides a dict of
    keys ({"optim.lr": 3e-4}) or "key=value" strings, as `qtrain --set`. Every step also does what the
    config asks after it: a train record every log.every steps (stdout, log.file, the log callback),
    eval every eval.every steps, a checkpoint every checkpoint.every steps and at optim.steps.
    checkpoint.dir must not hold another run's checkpoints (CheckpointError), as with the CLI.
    Use as a context manager or call close().
    """

    def __init__(self, config, overrides=None, *, resume=None, allow_changed=None, export_only=False, log=None):
        super().__init__(config, _override_list(overrides), resume=resume, allow_changed=allow_changed,
                         export_only=export_only, config_is_text=config is not None and _is_yaml_text(config))
        if log is not None:
            self.set_log_callback(log)

    @classmethod
    def resume(cls, path_or_dir, config=None, overrides=None, *, allow_changed=None, log=None):
        """Continues a run from a checkpoint file or a checkpoint directory (its newest valid
        checkpoint). With config None, the config saved in the checkpoint is used."""
        return cls(config, overrides, resume=os.fspath(path_or_dir), allow_changed=allow_changed, log=log)

    def step(self, tokens=None, mask=None):
        """One optimizer step; returns {"step", "loss", "grad_norm", "lr", "tokens_per_s", "saved"} (and
        "eval_loss" when eval.every fell on it). tokens: int32 (rows, seq_len + 1), rows = micro_batch x
        grad_accum x GPUs (info()["rows"]), or None for the config's data; mask: 0/1 like tokens, 0 =
        that token is not a target. Ctrl-C: the step finishes, then KeyboardInterrupt."""
        return super().step(_batch(tokens, "int32"), _batch(mask, "uint8"))

    def backward(self, tokens=None, mask=None):
        """The first half of step(): the gradients are then readable (gradients()) until update()."""
        return super().backward(_batch(tokens, "int32"), _batch(mask, "uint8"))

    def eval(self, tokens=None, mask=None):
        """The eval loss: over data.eval, or over the given rows (a multiple of micro_batch)."""
        return super().eval(_batch(tokens, "int32"), _batch(mask, "uint8"))

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
