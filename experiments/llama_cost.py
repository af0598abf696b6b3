"""
What SmolLM2-135M (a Llama: RMSNorm, SwiGLU, rotary positions, 9 query heads sharing 3 key/value heads) costs as a
T2R model, beside its KV cache, from 1K to 8K tokens: its memory from the shapes, and its CPU speed with random
weights of its exact shape (speed does not depend on the weights' values), so that it runs with no download.

    python -m experiments.llama_cost                  # memory, one finetuning step, decoding 8192 tokens
    python -m experiments.llama_cost --memory_only    # the memory alone (instant: nothing is allocated)

Memory: float32 weights, gradients and AdamW's moments, and one sequence's generation state: T2R's S and z per
key/value head (the same at every length) against the keys and values of its 3 key/value heads at each length.
Speed: one finetuning step at batch 1 x 512 tokens (median of --repeats after a warm-up); greedy decoding of 8192
tokens at batch 1, the per-token latency (median of 32 steps) at 1K, 2K, 4K and 8K. With rotary positions the
feature map reads the rotated q and k, so T2R decodes unfolded (Eq. 8 does not apply).
"""


if __package__ in (None, ""):  # run as a file: the project's modules are found from its root, as a module
    raise SystemExit("error: run it from the repository's root as a module: python -m experiments.llama_cost")

import torch
from experiments.gpt2_cost import FEATURE_SIZE, decoding, memory, print_memory, timed_models
from support import hf
from support.runtime import Parser, positive_int, run_main

# SmolLM2-135M's config.json (HuggingFaceTB/SmolLM2-135M), the settings our model reads
SMOLLM2_135M = dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
                    tie_word_embeddings=True, hidden_act="silu", max_position_embeddings=8192)
LENGTHS = (1024, 2048, 4096, 8192)


def main(argv=None):
    p = Parser(prog="llama_cost.py", description="SmolLM2-135M as T2R: memory from its shapes, CPU speed.")
    p.add_argument("--memory_only", action="store_true", help="print the memory figures and stop")
    p.add_argument("--repeats", type=positive_int, default=2, help="finetuning steps timed after the warm-up")
    args = p.parse_args(argv)
    config = hf.llama_config(SMOLLM2_135M, "SmolLM2-135M")
    print_memory(memory(config, lengths=LENGTHS))
    if args.memory_only:
        return
    teacher, student = timed_models(config, "SmolLM2-135M's", args.repeats)
    with torch.no_grad():
        for name, model in (("softmax, KV cache", teacher.eval()), (f"t2r k={FEATURE_SIZE}", student.eval())):
            rate, latencies = decoding(model, LENGTHS)
            at = " | ".join(f"{1000 * latency:.1f} ms a token at {n}" for n, latency in zip(LENGTHS, latencies))
            print(f"greedy decoding of {LENGTHS[-1]} tokens, batch 1 | {name} | {rate:.1f} tokens/s | {at}", flush=True)


if __name__ == "__main__":
    run_main(main)
