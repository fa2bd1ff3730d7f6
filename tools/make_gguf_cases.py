"""GGUF test files, written with the `gguf` Python package (llama.cpp's own gguf-py, from PyPI).

Why: zimage reads GGUF DiT and text-encoder files and dequantises their blocks itself (src/io/gguf*.cpp,
src/backend/cuda/kernels/gguf_dequant.cu). The reference for every block type is the gguf package's numpy
dequantisation of the same bytes; the reference for the model loaders is the golden v_turbo model
(tests/data/golden/v_turbo.tar.gz) written as GGUF the way city96's ComfyUI-GGUF (DiT, arch lumina2)
and llama.cpp's convert_hf_to_gguf.py (Qwen3 text encoder, arch qwen3) write them.

How to run (needs numpy and gguf; torch is not needed):
  /work/.venv-ref/bin/python tools/make_gguf_cases.py
      -> tests/data/gguf/gguf_cases.tar.gz (unpacked by the build into build/<preset>/gguf/)
         fuzz/corpus/gguf/seed_*.gguf (small seeds for fuzz/fuzz_gguf.cpp)
The output is deterministic (fixed seeds, archive members with mtime 0).

Archive contents:
  types/types.gguf     one tensor per case: "<TYPE>.blocks" (random block bytes whose scale fields
                       hold realistic f16 values: every bit pattern of the quants), "<TYPE>.edge"
                       (scales 0, -0, subnormal, 65504, negative, inf, nan), "<TYPE>.real" (realistic
                       weights quantised by the package, for the types it can quantise), plus 1-D,
                       3-D and 4-D tensors for the shape order
  types/<name>.npy     gguf.quants.dequantize of the tensor's bytes (float32, PyTorch shape)
  types/manifest.json  [{name, type, shape}]
  meta/meta.gguf       every metadata value type (scalars, strings, arrays, nested arrays), alignment
                       64, a tensor with a ComfyUI-GGUF orig_shape; the C++ test knows the values
  models/dit.gguf      the v_turbo DiT, ComfyUI names (fused qkv), Q8_0 / Q4_K / Q6_K / Q5_0 / Q5_1 /
                       Q4_0 / Q4_1 where the row length allows, F16 / BF16 / F32 elsewhere
  models/te.gguf       the v_turbo text encoder with llama.cpp names (token_embd, blk.N.attn_q, ...),
                       quantised likewise; token_embd keeps the golden rows of the v_turbo prompt and
                       repeats a 251-row pattern elsewhere, so the archive stays small
  models/dit_ref.json, models/te_ref.json
                       per tensor under its diffusers / transformers name: shape, the CRC-32 of the
                       package's dequantised float32 bytes (C order), and the first values. The C++
                       test checks the tensors it loads against these (bit-exact) and then compares
                       the GGUF model with a folder model built from those same weights.
"""
import gzip
import io
import json
import os
import sys
import tarfile
import tempfile
import zlib

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_ARCHIVE = os.path.join(ROOT, "tests/data/gguf/gguf_cases.tar.gz")
FUZZ_DIR = os.path.join(ROOT, "fuzz/corpus/gguf")
GOLDEN = os.path.join(ROOT, "tests/data/golden/v_turbo.tar.gz")

TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q6_K, Q.Q5_K, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q4_0, Q.Q4_1,
         Q.Q3_K, Q.Q2_K]
# Byte offsets of the f16 scale fields in a block (d and, for the "min" types, dmin / m).
SCALE_FIELDS = {Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
                Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}
PACKAGE_QUANTIZES = {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q5_0, Q.Q5_1, Q.Q4_0, Q.Q4_1}


def f16_bits(x):
    return np.asarray(x, dtype=np.float16).view(np.uint16)


def to_bytes(qtype, values):
    """Quantise float32 `values` [..., K] with the package (or our K-quantisers) to block bytes."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if qtype == Q.Q4_K:
        return quantize_q4_k(values)
    if qtype == Q.Q6_K:
        return quantize_q6_k(values)
    return gguf.quants.quantize(values, qtype)


def dequant(qtype, data):
    with np.errstate(all="ignore"):  # the edge cases multiply inf by 0 on purpose
        return np.ascontiguousarray(gguf.quants.dequantize(data, qtype), dtype=np.float32)


# ---- K-quantisers (the package has none): simple, valid encodings, checked by dequantising ----

def quantize_q4_k(x):
    rows = x.reshape(-1, 256)
    out = np.zeros((rows.shape[0], 144), dtype=np.uint8)
    for b, blk in enumerate(rows):
        g = blk.reshape(8, 32)
        mn = np.minimum(g.min(axis=1), 0.0)
        scale = (g.max(axis=1) - mn) / 15.0
        d = np.float16(scale.max() / 63.0)
        dmin = np.float16((-mn).max() / 63.0)
        sc = np.clip(np.round(scale / np.float32(d)), 0, 63).astype(np.int32) if d else np.zeros(8, np.int32)
        m = np.clip(np.round(-mn / np.float32(dmin)), 0, 63).astype(np.int32) if dmin else np.zeros(8, np.int32)
        q = np.zeros((8, 32), np.int32)
        for j in range(8):
            step = np.float32(d) * sc[j]
            if step:
                q[j] = np.clip(np.round((g[j] + np.float32(dmin) * m[j]) / step), 0, 15)
        scales = np.zeros(12, np.int32)
        for j in range(4):
            scales[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
            scales[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6)
            scales[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4)
        qs = np.zeros(128, np.int32)
        for c in range(4):
            qs[32 * c:32 * c + 32] = q[2 * c] | (q[2 * c + 1] << 4)
        out[b, 0:2] = np.frombuffer(f16_bits(d).tobytes(), np.uint8)
        out[b, 2:4] = np.frombuffer(f16_bits(dmin).tobytes(), np.uint8)
        out[b, 4:16] = scales
        out[b, 16:144] = qs
    return out.reshape(*x.shape[:-1], x.shape[-1] // 256 * 144)


def quantize_q6_k(x):
    rows = x.reshape(-1, 256)
    out = np.zeros((rows.shape[0], 210), dtype=np.uint8)
    for b, blk in enumerate(rows):
        g = blk.reshape(16, 16)
        s = np.abs(g).max(axis=1) / 31.0
        d = np.float16(s.max() / 127.0)
        sc = np.clip(np.round(s / np.float32(d)), -128, 127).astype(np.int32) if d else np.zeros(16, np.int32)
        q = np.zeros(256, np.int32)
        for j in range(16):
            step = np.float32(d) * sc[j]
            if step:
                q[16 * j:16 * j + 16] = np.clip(np.round(g[j] / step), -32, 31)
        q += 32
        ql = np.zeros(128, np.int32)
        qh = np.zeros(64, np.int32)
        for e in range(256):
            half, quarter, l = e // 128, (e % 128) // 32, e % 32
            i = half * 64 + (quarter % 2) * 32 + l
            ql[i] |= (q[e] & 0xF) << (0 if quarter < 2 else 4)
            qh[half * 32 + l] |= (q[e] >> 4) << (2 * quarter)
        out[b, 0:128] = ql
        out[b, 128:192] = qh
        out[b, 192:208] = sc.astype(np.int8).view(np.uint8)
        out[b, 208:210] = np.frombuffer(f16_bits(d).tobytes(), np.uint8)
    return out.reshape(*x.shape[:-1], x.shape[-1] // 256 * 210)


# ---- per-type cases ----

def block_geometry(qtype):
    return GGML_QUANT_SIZES[qtype]


def random_blocks(rng, qtype, rows, cols, scale_values):
    """Random block bytes, each f16 scale field set from scale_values (cycled)."""
    bs, ts = block_geometry(qtype)
    n_blocks = rows * cols // bs
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    bits = f16_bits(scale_values)
    k = 0
    for blk in range(n_blocks):
        for off in SCALE_FIELDS[qtype]:
            v = int(bits[k % len(bits)])
            raw[blk, off] = v & 0xFF
            raw[blk, off + 1] = v >> 8
            k += 1
    return raw.reshape(rows, cols // bs * ts)


def realistic(rng, rows, cols):
    """Weight-like rows of different magnitudes, a zero row and an outlier."""
    scales = [0.02, 0.05, 1.0, 1e-4, 30.0, 0.0, 0.02, 0.3]
    x = np.stack([rng.standard_normal(cols) * scales[r % len(scales)] for r in range(rows)])
    x[-1, 7] = 8.0  # an outlier in an otherwise small row
    return x.astype(np.float32)


EDGE_SCALES = np.array([0.0, -0.0, 2.0 ** -24, 2.0 ** -14, 65504.0, -65504.0, -0.0123, 1.0,
                        np.inf, -np.inf, np.nan, 3.1e-5], dtype=np.float32)


def plain_edge(qtype, rng, rows, cols):
    x = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 1e-7, -6e-8, 3.4e38,
                         1.17549435e-38, 1e-45, 70000.0], dtype=np.float32)
    x.flat[:len(specials)] = specials
    with np.errstate(over="ignore"):  # 70000 and 3.4e38 overflow f16 on purpose
        if qtype == Q.F16:
            return x.astype(np.float16)
        if qtype == Q.BF16:
            return bf16_bytes(x)
    return x


def bf16_bytes(x):
    # round to nearest even, as the package's BF16.quantize does
    return gguf.quants.quantize(np.ascontiguousarray(x, np.float32), Q.BF16)


def write_types(d, rng):
    w = gguf.GGUFWriter(os.path.join(d, "types.gguf"), arch="zimage-test")
    manifest = []

    def add(name, qtype, data, shape):
        if qtype in (Q.F32, Q.F16) and data.dtype != np.uint8:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_dtype=qtype)
        ref = dequant(qtype, data).reshape(shape)
        np.save(os.path.join(d, name + ".npy"), ref)
        manifest.append(dict(name=name, type=qtype.name, shape=list(shape)))

    rows, cols = 6, 512
    for qt in TYPES:
        if qt in (Q.F32, Q.F16, Q.BF16):
            add(qt.name + ".edge", qt, plain_edge(qt, rng, rows, cols), (rows, cols))
        else:
            add(qt.name + ".blocks", qt,
                random_blocks(rng, qt, rows, cols,
                              (rng.uniform(2e-4, 2e-2, size=64) * rng.choice([-1, 1], size=64))),
                (rows, cols))
            bs = block_geometry(qt)[0]
            add(qt.name + ".edge", qt, random_blocks(rng, qt, 2, 8 * bs, EDGE_SCALES), (2, 8 * bs))
        if qt in PACKAGE_QUANTIZES or qt in (Q.Q4_K, Q.Q6_K):
            x = realistic(rng, 8, cols)
            data = x if qt == Q.F32 else (x.astype(np.float16) if qt == Q.F16 else to_bytes(qt, x))
            add(qt.name + ".real", qt, data, (8, cols))
    # shape order: ne is innermost first, the PyTorch shape is its reverse
    add("shape.1d", Q.F32, rng.standard_normal(7).astype(np.float32), (7,))
    x3 = rng.standard_normal((2, 3, 64)).astype(np.float32)
    add("shape.3d", Q.Q8_0, to_bytes(Q.Q8_0, x3), (2, 3, 64))
    add("shape.4d", Q.F16, rng.standard_normal((2, 3, 4, 8)).astype(np.float16), (2, 3, 4, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    return manifest


def write_meta(path):
    w = gguf.GGUFWriter(path, arch="zimage-test")
    w.add_custom_alignment(64)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 1.5)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "h\u00e9llo w\u00f6rld \u2713")
    w.add_uint64("test.u64", 2 ** 63 + 5)
    w.add_int64("test.i64", -(2 ** 62))
    w.add_float64("test.f64", 0.1)
    w.add_array("test.arr_i32", [1, -2, 3])
    w.add_key_value("test.arr_u8", [7, 8, 255], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT8)
    w.add_key_value("test.arr_f32", [0.5, -1.25], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.FLOAT32)
    w.add_array("test.arr_str", ["a", "bc", ""])
    w.add_array("test.arr_bool", [True, False])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_array("test.nested_str", [["x"], ["y", "z"]])
    w.add_array("comfy.gguf.orig_shape.reshaped", [2, 2, 8])
    w.add_tensor("plain", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("quant", to_bytes(Q.Q8_0, np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)),
                 raw_dtype=Q.Q8_0)
    w.add_tensor("reshaped", np.arange(32, dtype=np.float32).reshape(4, 8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- the tiny models ----

def read_golden():
    """v_turbo's transformer and text encoder (float32 numpy, bf16 values) and its token ids."""
    out = {}
    with tarfile.open(GOLDEN) as tar:
        for m in tar.getmembers():
            if m.name.endswith(".safetensors") and ("/transformer/" in m.name or "/text_encoder/" in m.name):
                comp = "dit" if "/transformer/" in m.name else "te"
                out[comp] = load_bf16_safetensors(tar.extractfile(m).read())
            if m.name.endswith("debug/token_ids.json"):
                out["ids"] = json.loads(tar.extractfile(m).read())["ids"]
    return out


def load_bf16_safetensors(buf):
    n = int.from_bytes(buf[:8], "little")
    header = json.loads(buf[8:8 + n])
    data = buf[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = np.frombuffer(data[b:e], dtype=np.uint16 if info["dtype"] in ("BF16", "F16") else np.float32)
        if info["dtype"] == "BF16":
            arr = (raw.astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F16":
            arr = raw.view(np.float16).astype(np.float32)
        else:
            arr = raw
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def crc(a):
    return zlib.crc32(np.ascontiguousarray(a, dtype=np.float32).tobytes()) & 0xFFFFFFFF


def ref_entry(a):
    flat = a.reshape(-1)
    return dict(shape=list(a.shape), crc32=crc(a), first=[float(v) for v in flat[:4]])


class ModelWriter:
    """Adds tensors to a GGUFWriter in a chosen type and returns the package's dequantised value."""

    def __init__(self, path, arch):
        self.w = gguf.GGUFWriter(path, arch=arch)

    def add(self, name, x, qtype, stored_shape=None):
        x = np.ascontiguousarray(x, np.float32)
        if stored_shape is not None:  # stored reshaped, with ComfyUI-GGUF's orig_shape key
            self.w.add_array("comfy.gguf.orig_shape." + name, list(x.shape))
            x = x.reshape(stored_shape)
        if qtype == Q.F32:
            data = x
        elif qtype == Q.F16:
            data = x.astype(np.float16)
        else:
            data = to_bytes(qtype, x)
        if qtype in (Q.F32, Q.F16):
            self.w.add_tensor(name, data)
        else:
            self.w.add_tensor(name, data, raw_dtype=qtype)
        deq = dequant(qtype, data)
        if qtype in (Q.Q4_K, Q.Q6_K):  # our own quantisers: the encoding must be close
            err = np.abs(deq - x).max() / max(np.abs(x).max(), 1e-30)
            assert err < 0.2, (name, qtype, err)
        return deq.reshape(x.shape if stored_shape is None else stored_shape)

    def finish(self):
        self.w.write_header_to_file()
        self.w.write_kv_data_to_file()
        self.w.write_tensors_to_file()
        self.w.close()


def write_dit(path, dit):
    mw = ModelWriter(path, "lumina2")
    ref = {}

    def qtype_for(name, x):
        if x.ndim == 1:
            return Q.F32 if "norm" in name else Q.F16
        if name.startswith(("x_pad_token", "cap_pad_token")):
            return Q.BF16
        k = x.shape[-1]
        if "t_embedder.mlp.0" in name:
            return Q.Q4_K
        if "t_embedder.mlp.2" in name:
            return Q.Q6_K
        if k % 32:
            return Q.F16  # feed_forward.w2: 170 columns
        if name.startswith("noise_refiner"):
            return Q.Q5_0
        if name.startswith("context_refiner"):
            return Q.Q4_1
        if "feed_forward.w1" in name and name.startswith("layers.0"):
            return Q.Q5_1
        if "final_layer.linear" in name:
            return Q.Q4_0
        return Q.Q8_0

    for name in sorted(dit):
        if name.endswith(("attention.to_k.weight", "attention.to_v.weight")):
            continue
        x = dit[name]
        if name.endswith("attention.to_q.weight"):  # ComfyUI: one fused [q; k; v]
            base = name[:-len("to_q.weight")]
            parts = [dit[base + p + ".weight"] for p in ("to_q", "to_k", "to_v")]
            qkv = np.concatenate(parts, axis=0)
            deq = mw.add(base + "qkv.weight", qkv, qtype_for(name, qkv))
            rows = [p.shape[0] for p in parts]
            for p, a in zip(("to_q", "to_k", "to_v"), np.split(deq, np.cumsum(rows)[:-1], axis=0)):
                ref[base + p + ".weight"] = ref_entry(a)
            continue
        comfy = name.replace("all_x_embedder.2-1.", "x_embedder.").replace(
            "all_final_layer.2-1.", "final_layer.").replace("attention.to_out.0.", "attention.out.").replace(
            "attention.norm_q.", "attention.q_norm.").replace("attention.norm_k.", "attention.k_norm.")
        stored = (8, 8) if comfy == "cap_embedder.1.bias" else None  # exercises orig_shape
        qt = Q.F32 if stored else qtype_for(comfy, x)
        deq = mw.add(comfy, x, qt, stored_shape=stored)
        ref[name] = ref_entry(deq.reshape(x.shape))
    mw.finish()
    return ref


def write_te(path, te, ids):
    mw = ModelWriter(path, "qwen3")
    w = mw.w
    cfg = dict(block_count=2, context_length=1024, embedding_length=32, feed_forward_length=64,
               head_count=4, head_count_kv=2)
    w.add_block_count(cfg["block_count"])
    w.add_context_length(cfg["context_length"])
    w.add_embedding_length(cfg["embedding_length"])
    w.add_feed_forward_length(cfg["feed_forward_length"])
    w.add_head_count(cfg["head_count"])
    w.add_head_count_kv(cfg["head_count_kv"])
    w.add_key_length(8)
    w.add_value_length(8)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    ref = {}
    emb = te["embed_tokens.weight"]
    used = sorted({t for seq in ids for t in seq})
    period = emb[:251]
    new_emb = np.tile(period, (emb.shape[0] // 251 + 1, 1))[:emb.shape[0]].copy()
    new_emb[used] = emb[used]  # the prompt's tokens keep their golden rows
    deq = mw.add("token_embd.weight", new_emb, Q.Q8_0)
    ref["model.embed_tokens.weight"] = ref_entry(deq)
    parts = {"self_attn.q_proj": ("attn_q", Q.Q8_0), "self_attn.k_proj": ("attn_k", Q.Q5_0),
             "self_attn.v_proj": ("attn_v", Q.Q4_0), "self_attn.o_proj": ("attn_output", Q.Q8_0),
             "mlp.gate_proj": ("ffn_gate", Q.Q8_0), "mlp.up_proj": ("ffn_up", Q.Q4_1),
             "mlp.down_proj": ("ffn_down", Q.Q5_1), "input_layernorm": ("attn_norm", Q.F32),
             "post_attention_layernorm": ("ffn_norm", Q.F32), "self_attn.q_norm": ("attn_q_norm", Q.F32),
             "self_attn.k_norm": ("attn_k_norm", Q.F32)}
    for layer in range(2):
        for hf, (ll, qt) in parts.items():
            x = te[f"layers.{layer}.{hf}.weight"]
            deq = mw.add(f"blk.{layer}.{ll}.weight", x, qt)
            ref[f"model.layers.{layer}.{hf}.weight"] = ref_entry(deq)
    deq = mw.add("output_norm.weight", te["norm.weight"], Q.F32)
    ref["model.norm.weight"] = ref_entry(deq)
    mw.finish()
    return ref


# ---- fuzz seeds ----

def write_fuzz_seeds(d, rng):
    os.makedirs(d, exist_ok=True)
    for old in os.listdir(d):
        if old.startswith("seed_") and old.endswith(".gguf"):
            os.remove(os.path.join(d, old))
    for i, qt in enumerate(TYPES):
        w = gguf.GGUFWriter(os.path.join(d, f"seed_{i:02d}_{qt.name}.gguf"), arch="lumina2" if i % 2 else "qwen3")
        w.add_string("general.name", "seed")
        w.add_array("test.arr", [1, 2, 3])
        bs = block_geometry(qt)[0]
        cols = max(bs, 8)
        if qt in (Q.F32, Q.F16, Q.BF16):
            data = plain_edge(qt, rng, 2, cols)
        else:
            data = random_blocks(rng, qt, 2, cols, np.array([0.01, -0.02], np.float32))
        if qt in (Q.F32, Q.F16) and data.dtype != np.uint8:
            w.add_tensor("blk.0.attn_q.weight", data)
        else:
            w.add_tensor("blk.0.attn_q.weight", data, raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    write_meta(os.path.join(d, "seed_meta.gguf"))


def add_dir(tar, src, arc):
    for root, _, files in sorted(os.walk(src)):
        for f in sorted(files):
            p = os.path.join(root, f)
            info = tar.gettarinfo(p, arcname=os.path.join(arc, os.path.relpath(p, src)))
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(p, "rb") as fh:
                tar.addfile(info, fh)


def main():
    rng = np.random.default_rng(20250601)
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "types"))
        os.makedirs(os.path.join(tmp, "meta"))
        os.makedirs(os.path.join(tmp, "models"))
        manifest = write_types(os.path.join(tmp, "types"), rng)
        write_meta(os.path.join(tmp, "meta/meta.gguf"))
        golden = read_golden()
        dit_ref = write_dit(os.path.join(tmp, "models/dit.gguf"), golden["dit"])
        te_ref = write_te(os.path.join(tmp, "models/te.gguf"), golden["te"], golden["ids"])
        with open(os.path.join(tmp, "models/dit_ref.json"), "w") as f:
            json.dump(dit_ref, f, indent=1, sort_keys=True)
        with open(os.path.join(tmp, "models/te_ref.json"), "w") as f:
            json.dump(te_ref, f, indent=1, sort_keys=True)
        # Round trip through the package's own reader: every file parses, every tensor is there.
        for p in ("types/types.gguf", "meta/meta.gguf", "models/dit.gguf", "models/te.gguf"):
            r = gguf.GGUFReader(os.path.join(tmp, p))
            assert len(r.tensors) > 0, p
        os.makedirs(os.path.dirname(OUT_ARCHIVE), exist_ok=True)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for sub in ("types", "meta", "models"):
                add_dir(tar, os.path.join(tmp, sub), sub)
        with open(OUT_ARCHIVE, "wb") as f:
            with gzip.GzipFile(fileobj=f, mode="wb", mtime=0, filename="") as gz:
                gz.write(buf.getvalue())
        print(f"{OUT_ARCHIVE}: {os.path.getsize(OUT_ARCHIVE)} bytes, {len(manifest)} type cases")
    write_fuzz_seeds(FUZZ_DIR, rng)
    print(f"{FUZZ_DIR}: {len(os.listdir(FUZZ_DIR))} seeds")


if __name__ == "__main__":
    sys.exit(main())
