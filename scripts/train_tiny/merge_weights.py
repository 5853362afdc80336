"""Joins train.py's weights-NN.safetensors shards into one file for make-checkpoint --from.

  python3 merge_weights.py OUT.safetensors weights-01.safetensors weights-02.safetensors ...
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st  # noqa: E402

if __name__ == "__main__":
    merged = {}
    for path in sys.argv[2:]:
        for name, (dt, shape, arr) in st.read_file(path).items():
            if dt == "BF16":
                arr = arr.astype(np.uint16)
            merged[name] = arr.reshape(shape)
    st.write_file(sys.argv[1], merged, {"format": "pt"})
    print(f"{sys.argv[1]}: {len(merged)} tensors")
