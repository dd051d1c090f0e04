"""Suite-wide setup: Triton (when installed) runs in its interpreter, so the fused GPU kernels
(tests/nn/test_triton_linear.py) are tested on the CPU. Must precede the first triton import
(triton decorates its own functions for one mode at import); a machine that wants compiled
kernels in the suite sets TRITON_INTERPRET=0 itself."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
