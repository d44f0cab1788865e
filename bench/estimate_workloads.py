"""Ordinary PyTorch scripts for `npumem estimate`'s accuracy checks: each builds a model, moves
it to the GPU and trains it (or generates with it) for a few steps, as a user's script does.

    python bench/estimate_workloads.py NAME [--batch N] [--device cuda]

NAME is one of record_workloads.py's models (mlp, mlp_amp, encoder, gpt_train, gpt_generate,
cnn_sgd, cnn_wide, unet, lstm, ...) or a transformers model made from a config with random
weights (no download): gpt2_train, gpt2_amp, bert_train, llama_train, llama_generate.
The same script runs on a GPU (bench/estimate_truth.py records the real run) and under
`npumem estimate` on a machine without one (bench/estimate_accuracy.py compares the two).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import record_workloads  # noqa: E402


def _hf_batch(vocab: int, batch: int, length: int, device: str):
    ids = torch.randint(0, vocab, (batch, length), device=device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def _hf_model(kind: str, layers: int):
    import transformers as tf
    if kind == "gpt2":
        config = tf.GPT2Config(n_layer=layers, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)
        return tf.GPT2LMHeadModel(config), config.vocab_size
    if kind == "bert":
        config = tf.BertConfig(num_hidden_layers=layers, hidden_size=768, num_attention_heads=12,
                               intermediate_size=3072, vocab_size=30522)
        return tf.BertForMaskedLM(config), config.vocab_size
    config = tf.LlamaConfig(num_hidden_layers=layers, hidden_size=1024, intermediate_size=2816,
                            num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
                            max_position_embeddings=2048)
    return tf.LlamaForCausalLM(config), config.vocab_size


def hf_training(kind: str, batch: int, length: int, steps: int, amp: bool, device: str) -> None:
    model, vocab = _hf_model(kind, 4)
    model.to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), 1e-4)
    scaler = torch.amp.GradScaler(device, enabled=amp)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.float16, enabled=amp):
            loss = model(**_hf_batch(vocab, batch, length, device)).loss
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    print(f"{kind}: loss {loss.item():.3f}")


def hf_generation(kind: str, batch: int, length: int, new_tokens: int, device: str) -> None:
    model, vocab = _hf_model(kind, 4)
    model.to(device).eval()
    ids = torch.randint(0, vocab, (batch, length), device=device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    print(f"{kind}: generated {tuple(out.shape)}")


HF = {
    "gpt2_train": lambda a: hf_training("gpt2", a.batch or 8, a.seq or 512, 3, False, a.device),
    "gpt2_amp": lambda a: hf_training("gpt2", a.batch or 8, a.seq or 512, 3, True, a.device),
    "bert_train": lambda a: hf_training("bert", a.batch or 16, a.seq or 256, 3, False, a.device),
    "llama_train": lambda a: hf_training("llama", a.batch or 4, a.seq or 512, 3, False, a.device),
    "llama_generate": lambda a: hf_generation("llama", a.batch or 4, a.seq or 128, 32, a.device),
}


def main() -> None:
    zoo = record_workloads._workloads()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted([*zoo, *HF]))
    parser.add_argument("--batch", type=int, default=0, help="batch size (transformers models)")
    parser.add_argument("--seq", type=int, default=0, help="sequence length (transformers models)")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.name in HF:
        HF[args.name](args)
        return
    with torch.device(args.device):             # the model and its batches on the device
        zoo[args.name]()()
    print(f"{args.name}: done")


if __name__ == "__main__":
    main()
