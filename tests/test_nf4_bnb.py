#!/usr/bin/env python3
"""test_nf4_bnb.py — qtrain's NF4 codec (src/ref/nf4_ref.c, through ctypes on libqtrain.so) against bitsandbytes
on the CPU, bit for bit, on random tensors of several shapes (odd sizes, a short last block, bf16 and fp32):

1. tables: the NF4 codebook, the thresholds and the dynamic map equal get_4bit_type('nf4') and
   create_dynamic_map() to the bit.
2. 4-bit codes and block absmax equal quantize_4bit(blocksize=64, quant_type='nf4').
3. double quantization: the offset is the correctly rounded mean of the absmax, within 4 fp32 ulps of torch's
   (torch sums in fp32 in an order of its own); given the same offset, absmax2 equals
   quantize_blockwise(absmax - offset, blocksize=256)'s and the 8-bit codes equal a numpy transcription of
   bitsandbytes' CUDA dQuantize<0> (the CPU backend's 65536-entry table picks a farther code now and then:
   at each such place ours is shown to be the nearer code). The dynamic-map search alone: against the same
   transcription on every code, every midpoint and its neighbours, and random values.
4. dequantization: our state dequantized by bitsandbytes (dequantize_4bit with a nested QuantState) and by
   us are the same bits, bf16 and fp32; bitsandbytes' own state dequantized by us equals its dequantize_4bit.
5. a block of zeros: codes 0x00 as bitsandbytes' CUDA kernel writes them (its CPU backend writes 0x77);
   both dequantize to zeros.
Skips when bitsandbytes (or torch) is not importable.
    BUILD=build python3 tests/test_nf4_bnb.py
"""
import ctypes
import os
import sys

os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")  # bitsandbytes' eager arithmetic, without a compile per shape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qt_test import BUILD, Skip, run_tests  # noqa: E402

try:
    import numpy as np
    import torch
    import bitsandbytes.functional as bnbf
    from bitsandbytes.functional import QuantState
except Exception as exc:  # noqa: BLE001
    np = torch = bnbf = None
    IMPORT_ERR = f"{exc.__class__.__name__}: {exc}"

DT = {"fp32": 0, "bf16": 1}
SHAPES = [(1,), (7,), (64,), (65,), (127,), (33, 100), (130, 72), (3, 4097), (512, 640)]
U8 = ctypes.POINTER(ctypes.c_uint8)
F = ctypes.POINTER(ctypes.c_float)
_LIB = []


def lib():
    if bnbf is None:
        raise Skip(f"bitsandbytes/torch not importable ({IMPORT_ERR})")
    if not _LIB:
        path = os.path.join(BUILD, "libqtrain.so")
        if not os.path.exists(path):
            raise Skip(f"{path} not built")
        so = ctypes.CDLL(path)
        so.qt_nf4_value.restype = so.qt_nf4_dyn_value.restype = ctypes.c_float
        so.qt_nf4_dyn_encode.argtypes = [ctypes.c_float]
        so.qt_nf4_quantize_ref.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_long, U8, F, ctypes.c_char_p,
                                           ctypes.c_char_p, ctypes.c_size_t]
        so.qt_nf4_double_quant_ref.argtypes = [F, ctypes.c_long, U8, F, F]
        so.qt_nf4_absmax_ref.argtypes = [F, U8, F, ctypes.c_float, ctypes.c_long]
        so.qt_nf4_dequant_ref.argtypes = [ctypes.c_int, ctypes.c_void_p, U8, F, ctypes.c_long]
        _LIB.append(so)
    return _LIB[0]


def ptr(a, t):
    return a.ctypes.data_as(t)


def data(shape, dtype, seed):
    """N(0, 1) values with a scale per row spread over 1e-3..1e2, so block maxima (and the double quantization) vary."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if len(shape) == 2:
        x *= torch.exp(torch.empty(shape[0], 1).uniform_(-7, 4.6, generator=g))
    return x.to(torch.bfloat16 if dtype == "bf16" else torch.float32)


def raw(x):
    """The bytes of a torch tensor as numpy (bf16 as uint16)."""
    x = x.contiguous().reshape(-1)
    return x.view(torch.int16).numpy().view(np.uint16) if x.dtype == torch.bfloat16 else x.numpy()


def ours_quant(x, dtype):
    so, n = lib(), x.numel()
    xs = raw(x)
    nb = (n + 63) // 64
    codes, absmax = np.zeros((n + 1) // 2, np.uint8), np.zeros(nb, np.float32)
    err = ctypes.create_string_buffer(512)
    rc = so.qt_nf4_quantize_ref(DT[dtype], xs.ctypes.data, n, ptr(codes, U8), ptr(absmax, F), b"x", err, 512)
    assert rc == 0, err.value.decode()
    q, a2, off = np.zeros(nb, np.uint8), np.zeros((nb + 255) // 256, np.float32), np.zeros(1, np.float32)
    so.qt_nf4_double_quant_ref(ptr(absmax, F), nb, ptr(q, U8), ptr(a2, F), ptr(off, F))
    return codes, absmax, q, a2, off[0]


def ours_dequant(codes, absmax, n, dtype):
    out = np.zeros(n, np.uint16 if dtype == "bf16" else np.float32)
    lib().qt_nf4_dequant_ref(DT[dtype], out.ctypes.data, ptr(codes, U8), ptr(np.ascontiguousarray(absmax), F), n)
    return out


def ours_absmax(q, a2, off):
    out = np.zeros(q.size, np.float32)
    lib().qt_nf4_absmax_ref(ptr(out, F), ptr(q, U8), ptr(a2, F), float(off), q.size)
    return out


def f32_bits(v):
    return int(np.array(v, np.float32).view(np.uint32))


def same(name, ours, theirs):
    ours, theirs = np.asarray(ours).reshape(-1), np.asarray(theirs).reshape(-1)
    assert ours.shape == theirs.shape, f"{name}: {ours.shape} values, bitsandbytes {theirs.shape}"
    ob = ours.view(np.uint32) if ours.dtype == np.float32 else ours
    tb = theirs.view(np.uint32) if theirs.dtype == np.float32 else theirs
    bad = np.nonzero(ob != tb)[0]
    assert bad.size == 0, (f"{name}: {bad.size} of {ours.size} differ; first at {bad[0]}: ours {ours[bad[0]]!r}, "
                           f"bitsandbytes {theirs[bad[0]]!r}")


def dyn_encode_cuda(x, code):
    """bitsandbytes' kernels.cu dQuantize<0> (not stochastic) on fp32 numpy arrays: the 7-step bisection from 127
    and the fp32 midpoint of the last two codes on x's side."""
    x = x.astype(np.float32)
    p = np.full(x.shape, 127)
    hi, lo = np.full(x.shape, 255), np.zeros(x.shape, int)
    vhi, vlo = np.full(x.shape, 1.0, np.float32), np.full(x.shape, -1.0, np.float32)
    v = code[p]
    for step in (64, 32, 16, 8, 4, 2, 1):
        up = x > v
        lo, vlo = np.where(up, p, lo), np.where(up, v, vlo)
        hi, vhi = np.where(up, hi, p), np.where(up, vhi, v)
        p = np.where(up, p + step, p - step)
        v = code[p]
    vhi = np.where(hi == 255, code[255], vhi)
    vlo = np.where(lo == 0, code[0], vlo)
    half = np.float32(0.5)
    up_pick = np.where(x > (vhi + v) * half, hi, p)
    dn_pick = np.where(x < (vlo + v) * half, lo, p)
    return np.where(x > v, up_pick, dn_pick).astype(np.uint8)


def dyn_map():
    return bnbf.create_dynamic_map().numpy().astype(np.float32)


def test_tables(tmp):
    so = lib()
    ours_cb = np.array([so.qt_nf4_value(c) for c in range(16)], np.float32)
    same("NF4 codebook", ours_cb, bnbf.get_4bit_type("nf4", device="cpu").numpy())
    same("dynamic map", np.array([so.qt_nf4_dyn_value(c) for c in range(256)], np.float32), dyn_map())
    mids = (ours_cb[:-1] + ours_cb[1:]) / np.float32(2)
    for k, t in enumerate(mids):  # each threshold: at it -> the lower code, one ulp above -> the upper one
        for s, want in ((t, k), (np.nextafter(t, np.float32(2)), k + 1)):
            x = torch.full((64,), float(s))
            x[0] = 1.0  # absmax 1: the scaled values are the values
            q, _ = bnbf.quantize_4bit(x, blocksize=64, quant_type="nf4")
            codes, _, _, _, _ = ours_quant(x, "fp32")
            assert (q.numpy().reshape(-1)[1] >> 4) == want == (codes[1] >> 4), \
                f"threshold {k} ({t!r}): bitsandbytes {q.numpy().reshape(-1)[1] >> 4}, ours {codes[1] >> 4}, want {want}"


def test_codes_absmax(tmp):
    lib()  # skips without bitsandbytes or torch
    for i, shape in enumerate(SHAPES):
        for dtype in ("bf16", "fp32"):
            x = data(shape, dtype, 100 + i)
            codes, absmax, _, _, _ = ours_quant(x, dtype)
            q, st = bnbf.quantize_4bit(x, blocksize=64, quant_type="nf4", compress_statistics=False)
            tag = f"{shape} {dtype}"
            same(f"{tag} codes", codes, q.numpy())
            same(f"{tag} absmax", absmax, st.absmax.numpy())


def test_double_quant(tmp):
    lib()  # skips without bitsandbytes or torch
    code = dyn_map()
    ulps = farther = total = 0
    for i, shape in enumerate(SHAPES):
        x = data(shape, "bf16", 200 + i)
        _, absmax, q, a2, off = ours_quant(x, "bf16")
        _, st = bnbf.quantize_4bit(x, blocksize=64, quant_type="nf4", compress_statistics=True)
        theirs = np.float32(st.offset.item())
        exact = np.float32(np.float64(absmax.astype(np.float64).sum()) / absmax.size)
        assert off == exact, f"{shape}: offset {off!r}, the correctly rounded mean {exact!r}"
        d = abs(f32_bits(off) - f32_bits(theirs))
        assert d <= 4, f"{shape}: offset {off!r}, torch's {theirs!r} ({d} ulps apart)"
        ulps = max(ulps, d)
        centred = absmax - off
        tq, tst = bnbf.quantize_blockwise(torch.from_numpy(centred.copy()), code=torch.from_numpy(code), blocksize=256)
        same(f"{shape} absmax2", a2, tst.absmax.numpy())
        with np.errstate(divide="ignore", invalid="ignore"):  # one block: absmax2 = 0, NaN scaled values, code 0
            scaled = centred * (np.float32(1) / np.repeat(a2, 256)[:centred.size])
        same(f"{shape} qabsmax (CUDA dQuantize)", q, dyn_encode_cuda(scaled, code))
        tq = tq.numpy()
        farther, total = farther + int((q != tq).sum()), total + q.size
        for j in np.nonzero(q != tq)[0]:  # the CPU backend's table: its pick is never nearer than ours
            assert abs(scaled[j] - code[q[j]]) <= abs(scaled[j] - code[tq[j]]), \
                f"{shape}: scale {j}: ours {q[j]}, bitsandbytes' CPU {tq[j]} is nearer to {scaled[j]!r}"
    print(f"  offsets at most {ulps} fp32 ulps from torch's mean; the CPU backend's table picks a farther 8-bit code "
          f"for {farther} of {total} scales")


def test_dyn_encode_sweep(tmp):
    """Our dynamic-map codes against the numpy dQuantize on every code, every midpoint and its neighbours,
    the ends and 200000 random values."""
    so, code = lib(), dyn_map()
    mids = (code[:-1] + code[1:]) * np.float32(0.5)
    pts = np.concatenate([code, mids, np.nextafter(mids, np.float32(2)), np.nextafter(mids, np.float32(-2)),
                          np.array([-1.0, 1.0, -1.5, 1.5, 0.0, -0.0, 1e-30], np.float32),
                          np.random.default_rng(5).uniform(-1.05, 1.05, 200000).astype(np.float32)])
    ours = np.array([so.qt_nf4_dyn_encode(float(v)) for v in pts], np.uint8)
    same("dynamic-map codes", ours, dyn_encode_cuda(pts, code))


def state_of(q, a2, off, shape, dtype):
    code = torch.from_numpy(dyn_map())
    nested = QuantState(absmax=torch.from_numpy(a2.copy()), code=code, blocksize=256, dtype=torch.float32)
    return QuantState(absmax=torch.from_numpy(q.copy()), shape=torch.Size(shape), dtype=dtype, blocksize=64,
                      code=bnbf.get_4bit_type("nf4", device="cpu"), quant_type="nf4",
                      offset=torch.tensor(off, dtype=torch.float32), state2=nested)


def test_dequant(tmp):
    lib()  # skips without bitsandbytes or torch
    for i, shape in enumerate(SHAPES):
        n = int(np.prod(shape))
        x = data(shape, "bf16", 300 + i)
        codes, _, q, a2, off = ours_quant(x, "bf16")
        absmax = ours_absmax(q, a2, off)
        for dtype, tdt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            theirs = bnbf.dequantize_4bit(torch.from_numpy(codes.reshape(-1, 1).copy()), state_of(q, a2, off, shape, tdt))
            same(f"{shape} {dtype} dequant of our state", ours_dequant(codes, absmax, n, dtype), raw(theirs))
        # bitsandbytes' own state, dequantized by us
        tq, st = bnbf.quantize_4bit(x, blocksize=64, quant_type="nf4", compress_statistics=True)
        t_absmax = ours_absmax(st.absmax.numpy(), st.state2.absmax.numpy(), st.offset.item())
        ref_absmax = bnbf.dequantize_blockwise(st.absmax, st.state2) + st.offset
        same(f"{shape} absmax of bitsandbytes' state", t_absmax, ref_absmax.numpy())
        same(f"{shape} dequant of bitsandbytes' state", ours_dequant(tq.numpy().reshape(-1), t_absmax, n, "bf16"),
             raw(bnbf.dequantize_4bit(tq, st)))


def test_zero_block(tmp):
    lib()  # skips without bitsandbytes or torch
    x = torch.randn(200)
    x[64:128] = 0
    codes, absmax, _, _, _ = ours_quant(x, "fp32")
    q, st = bnbf.quantize_4bit(x, blocksize=64, quant_type="nf4")
    assert absmax[1] == 0 and st.absmax[1].item() == 0
    assert (codes[32:64] == 0).all(), f"our zero block codes {codes[32:64]}, expected 0x00 (bitsandbytes' CUDA kernel)"
    assert (q.numpy().reshape(-1)[32:64] == 0x77).all(), "bitsandbytes' CPU backend no longer codes a zero block as 0x77"
    same("codes outside the zero block", np.delete(codes, range(32, 64)), np.delete(q.numpy().reshape(-1), range(32, 64)))
    y = ours_dequant(codes, absmax, 200, "fp32")
    assert (y[64:128] == 0).all() and (raw(bnbf.dequantize_4bit(q, st))[64:128] == 0).all()


if __name__ == "__main__":
    sys.exit(run_tests(globals(), sys.argv[1:]))
