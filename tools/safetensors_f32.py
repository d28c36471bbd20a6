"""Reads the float32 tensors of a safetensors file into numpy arrays (for the tools here)."""
import json
import struct

import numpy as np


def read_safetensors(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    hdr = json.loads(b[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == '__metadata__':
            continue
        s, e = v['data_offsets']
        assert v['dtype'] == 'F32'
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype='<f4').reshape(v['shape'])
    return out
