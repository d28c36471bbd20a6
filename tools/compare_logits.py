#!/usr/bin/python3
"""Compare dsv4 score output against a fixture's reference logits (debugging aid).
usage: compare_logits.py FIXTURE_DIR SEQ_INDEX LOGITS_FILE"""
import json, struct, sys
import numpy as np

from safetensors_f32 import read_safetensors


fx, seq, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ref = json.load(open(fx + '/reference.json'))
s = ref['sequences'][seq]
want = read_safetensors(fx + '/reference_logits.safetensors')[s['logits_tensor']]
got = np.fromfile(path, dtype='<f4').reshape(want.shape)
d = np.abs(got - want)
print('max |diff| %.3g at %s; argmax agree %d/%d' % (d.max(), np.unravel_index(d.argmax(), d.shape),
      (got.argmax(1) == want.argmax(1)).sum(), len(want)))
per_pos = d.max(1)
bad = np.nonzero(per_pos > 1e-3)[0]
print('positions > 1e-3:', bad[:20], len(bad))
