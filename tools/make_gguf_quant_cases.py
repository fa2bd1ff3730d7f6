"""Reference bytes for zimage's GGUF quantisers (src/io/gguf/gguf_quantize.cpp), from the `gguf` Python
package (llama.cpp's gguf-py, PyPI), whose numpy Q8_0 and Q4_0 quantisers are bit-exact with
ggml's reference C code.

Writes into tests/data/gguf_quant/:
  input.f32   float32 little-endian, 4096 values (128 blocks of 32): normal values at scales
              from 1e-4 to 1e3, one all-zero block, one block of exact half-steps (ties), one
              block with a single non-zero value and one with negative extremes
  q8_0.bin    gguf.quants.quantize(input, Q8_0) bytes
  q4_0.bin    gguf.quantize(input, Q4_0) bytes
The C++ test (tests/unit/test_gguf_quantize.cpp) quantises input.f32 and compares byte for byte.

Run: /work/.venv-ref/bin/python tools/make_gguf_quant_cases.py
"""
import os

import gguf
import numpy as np

out = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "gguf_quant")
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(1234)
blocks = []
for i in range(124):
    scale = 10.0 ** rng.uniform(-4, 3)
    blocks.append(rng.standard_normal(32).astype(np.float32) * np.float32(scale))
blocks.append(np.zeros(32, np.float32))
blocks.append((np.arange(32, dtype=np.float32) - 16) * np.float32(0.5))
single = np.zeros(32, np.float32)
single[7] = -3.25
blocks.append(single)
blocks.append(-np.abs(rng.standard_normal(32).astype(np.float32)))
x = np.concatenate(blocks).astype(np.float32).reshape(4, 1024)
x.tofile(os.path.join(out, "input.f32"))
for name, t in (("q8_0", gguf.GGMLQuantizationType.Q8_0), ("q4_0", gguf.GGMLQuantizationType.Q4_0)):
    q = gguf.quants.quantize(x, t)
    q.tofile(os.path.join(out, name + ".bin"))
    print(name, q.shape, q.nbytes)
