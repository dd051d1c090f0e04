"""Probe: ``torch.compile`` of the whole converted model's decode step (random SmolLM2-shaped
weights, a 600-token prefill, two threads), against the same step eager.

Usage: ``python experiments/compile_model_step_probe.py ROW`` from the repository root (ROW:
teacher, hybrid_hedgehog, hybrid_favor or favor). Session 13: eager 91.9 ms/token for
hybrid_hedgehog; the first compile took 116 s and the second call failed in inductor
(``NameError``) once the position became dynamic.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
import torch._dynamo

sys.path.insert(0, "src")

from coulomb_attention.bench.decoder import (  # noqa: E402
    ROWS,
    SMOLLM2_SHAPES,
    DecoderBenchConfig,
    _converted,
    prefill,
    random_model,
)
from coulomb_attention.nn.families.llama import LlamaConfig  # noqa: E402


def main(row: str) -> None:
    torch._dynamo.config.cache_size_limit = 64
    torch.set_num_threads(2)
    teacher = random_model(LlamaConfig(**SMOLLM2_SHAPES), 0)
    model = teacher if ROWS[row] is None else _converted(teacher, ROWS[row],
                                                         DecoderBenchConfig())
    with torch.no_grad():
        logits, states0 = prefill(model, torch.randint(0, 49152, (1, 600)))
        nxt = logits.argmax(-1, keepdim=True)

        def step(ids, states):
            return model(ids, states=states, output_states=True)

        for name, f in (("eager", step), ("compiled", torch.compile(step))):
            states, times = states0, []
            for i in range(14):
                t = time.perf_counter()
                _, states = f(nxt, states)
                times.append(time.perf_counter() - t)
                if i < 3:
                    print(f"{name} call {i}: {times[-1]:.2f} s", flush=True)
            print(f"{name} {row}: median {1000 * statistics.median(times[4:]):.1f} ms/token")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "hybrid_hedgehog")
