"""CPU training throughput: ftkit vs Hugging Face transformers + PEFT, same model, same
tokens, same machine, in one run.

Makes a random Llama-architecture model with transformers (TinyLlama's layout scaled
down), then times N AdamW steps of LoRA (r=16, all linear layers) and of full
fine-tuning with both stacks, and prints tokens/s and the ratio.

usage: python bench_cpu_train.py BENCH_TRAIN_BINARY [--steps N] [--seq T]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def hf_tokens_per_s(model_dir, mode, batch, seq, steps):
    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32,
                                             attn_implementation="eager")
    if mode == "lora":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                 target_modules="all-linear"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    t0 = 0.0
    for s in range(steps + 1):
        if s == 1:
            t0 = time.perf_counter()
        opt.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return batch * seq * steps / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_train")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    cfg = LlamaConfig(vocab_size=8000, hidden_size=512, intermediate_size=1408,
                      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                      max_position_embeddings=1024)
    with tempfile.TemporaryDirectory() as d:
        torch.manual_seed(0)
        LlamaForCausalLM(cfg).save_pretrained(d, safe_serialization=True)
        print(f"model: llama hidden 512, 4 layers, 8/4 heads, vocab 8000; batch {a.batch} x "
              f"seq {a.seq}; {os.cpu_count()} CPU threads; torch {torch.__version__}")
        for mode in ("lora", "full"):
            out = subprocess.run([a.bench_train, d, "--mode", mode, "--batch", str(a.batch),
                                  "--seq", str(a.seq), "--steps", str(a.steps)],
                                 capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"bench-train failed: {out.stderr}")
            ours = json.loads(out.stdout)
            hf = hf_tokens_per_s(d, mode, a.batch, a.seq, a.steps)
            peak = ours["peak_bytes"]["total"] / 2**20
            print(f"bench-cpu-train {mode}: ours {ours['tokens_per_s']:.0f} tokens/s "
                  f"(peak {peak:.0f} MiB tracked), HF+PEFT {hf:.0f} tokens/s, "
                  f"ratio {ours['tokens_per_s'] / hf:.2f}")


if __name__ == "__main__":
    main()
