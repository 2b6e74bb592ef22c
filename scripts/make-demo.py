#!/usr/bin/env python3
"""Builds the demo that `make train` runs with no arguments: a tiny Llama-architecture
base model that knows a toy world, and a fine-tuning task it cannot do yet.

    .venv/bin/python scripts/make-demo.py [--out demo] [--steps N]

Writes, deterministically (seeded):

  demo/model/       the base: config.json, model.safetensors (bf16), tokenizer.json
                    (byte-level BPE), tokenizer_config.json, generation_config.json
  demo/train.jsonl  the fine-tuning set, {"prompt", "completion"} records
  demo/eval.jsonl   held-out records: questions about creatures never asked about in
                    train.jsonl

The world: 150 made-up creatures, each with a colour, a home and a food. The base model
is pretrained (here, in torch, some minutes on a CPU) on short stories about them, so it
knows the facts ("The zabu eats" -> " fish"), but it has never seen a question. The
fine-tuning task is answering questions in a new format:

    prompt:      "Q: What does the zabu eat?\nA:"
    completion:  " It eats fish."

The LoRA adapter has to learn the format and to reach the facts the base already holds;
on the held-out creatures exact match goes from 0 to most answers. ftkit's code never runs
here: the files are committed, and this script documents and reproduces them. It needs
torch, transformers and tokenizers (the venv of scripts/setup-python.sh).
"""

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SEED = 1234

SYLLABLES = ["ba", "bo", "da", "di", "fa", "fi", "go", "gu", "ka", "ki", "lo", "lu", "ma", "mi",
             "na", "nu", "pa", "po", "ra", "ri", "sa", "so", "ta", "tu", "va", "vo", "za", "zu"]
COLOURS = ["red", "blue", "green", "yellow", "black", "white", "brown", "grey", "pink", "orange"]
HOMES = ["cave", "forest", "river", "desert", "swamp", "meadow", "mountain", "lake", "jungle",
         "valley"]
FOODS = ["fish", "berries", "grass", "seeds", "bugs", "honey", "leaves", "nuts", "roots",
         "mushrooms"]
N_CREATURES = 150
N_FT_CREATURES = 120  # creatures of the fine-tuning train set; the rest are held out

# Pretraining: ways of telling the three facts about one creature.
STORY_TEMPLATES = [
    "The {n} is {c}. It lives in the {h} and eats {f}.",
    "The {n} lives in the {h}. It is {c} and it eats {f}.",
    "In the {h} lives the {n}, a {c} creature that eats {f}.",
    "The {c} {n} eats {f} in the {h}.",
    "The {n} eats {f}. It is {c}, and its home is the {h}.",
    "A {c} {n} lives in the {h}. The {n} eats {f}.",
]
# Sentences that come between stories, so that the model sees stories side by side.
LINKS = ["", "", "Near it, ", "Not far away, ", "Far from there, "]

# Fine-tuning: questions, two phrasings each, and the answer as a sentence of the world.
QUESTIONS = [
    ("What colour is the {n}?", "It is {c}."),
    ("Which colour does the {n} have?", "It is {c}."),
    ("Where does the {n} live?", "It lives in the {h}."),
    ("Where is the home of the {n}?", "It lives in the {h}."),
    ("What does the {n} eat?", "It eats {f}."),
    ("What food does the {n} like?", "It eats {f}."),
]


def make_world(rng):
    names = set()
    while len(names) < N_CREATURES:
        names.add(rng.choice(SYLLABLES) + rng.choice(SYLLABLES))
    names = sorted(names)
    rng.shuffle(names)
    return [dict(n=n, c=rng.choice(COLOURS), h=rng.choice(HOMES), f=rng.choice(FOODS))
            for n in names]


def story(rng, creatures):
    parts = []
    for i, cr in enumerate(creatures):
        s = rng.choice(STORY_TEMPLATES).format(**cr)
        link = rng.choice(LINKS) if i else ""
        if link:
            s = link + s[0].lower() + s[1:]
        parts.append(s)
    return " ".join(parts)


def pretrain_docs(rng, world, n_docs):
    """Documents of 1-3 paragraphs; a paragraph tells of 1-3 creatures."""
    docs = []
    for _ in range(n_docs):
        paras = []
        for _ in range(rng.choice([1, 2, 3])):
            paras.append(story(rng, rng.sample(world, rng.choice([1, 2, 2, 3]))))
        docs.append("\n".join(paras))
    return docs


def qa_records(rng, creatures):
    """Every question about each creature, in one of its two phrasings."""
    recs = []
    for cr in creatures:
        for i in range(0, len(QUESTIONS), 2):
            q, a = QUESTIONS[i + rng.randrange(2)]
            recs.append({"prompt": "Q: " + q.format(**cr) + "\nA:",
                         "completion": " " + a.format(**cr)})
    rng.shuffle(recs)
    return recs


@torch.no_grad()
def recall(model, tok, creatures):
    """How many facts the base completes right from "The {n} eats" etc. (greedy)."""
    probes = [("The {n} is", "{c}"), ("The {n} lives in the", "{h}"), ("The {n} eats", "{f}")]
    right = total = 0
    for cr in creatures:
        for prefix, want in probes:
            ids = tok.encode(prefix.format(**cr)).ids
            for _ in range(2):  # greedy (generate() trips over Debian's torch.distributed)
                ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            got = tok.decode(ids[-2:])
            right += got.strip().startswith(want.format(**cr))
            total += 1
    return right / total


def build_tokenizer(docs, out, vocab_size, world):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<unk>"]
    # The Q/A words must be in the alphabet of merges too: train on a few question lines
    # (the model itself never sees one before fine-tuning).
    extra = ["Q: " + q.format(**cr) + "\nA: " + a.format(**cr) for cr in world[:5]
             for q, a in QUESTIONS]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs + extra * 10, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                      special_tokens=[("<s>", bos)])])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "</s>", "model_max_length": 256,
        "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"},
        indent=2) + "\n")
    return tok


def pretrain(model, tok, docs, steps, batch, seq, lr, log_every=50):
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    stream = []
    for d in docs:
        stream += tok.encode(d).ids + [eos]  # encode adds <s>
    data = torch.tensor(stream, dtype=torch.long)
    n_rows = (len(stream) - 1) // seq
    print(f"pretraining: {len(stream)} tokens, {n_rows} rows of {seq}, {steps} steps of {batch}")
    g = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    warm = max(1, steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    model.train()
    t0 = time.time()
    for step in range(steps):
        rows = torch.randint(0, n_rows, (batch,), generator=g)
        x = torch.stack([data[r * seq:(r + 1) * seq] for r in rows])
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0 or step == steps - 1:
            print(f"step {step + 1}/{steps} loss {loss.item():.4f} ({time.time() - t0:.0f}s)",
                  flush=True)
    model.eval()
    del bos


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="demo")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--reuse-model", action="store_true",
                    help="keep the model and tokenizer in OUT/model; only write the data")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--vocab", type=int, default=768)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    random.seed(SEED)
    torch.manual_seed(SEED)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    out = Path(args.out)
    rng = random.Random(SEED)
    world = make_world(rng)
    docs = pretrain_docs(random.Random(SEED + 1), world, 6000)
    if args.reuse_model:
        tok = Tokenizer.from_file(str(out / "model" / "tokenizer.json"))
    else:
        tok = build_tokenizer(docs, out / "model", args.vocab, world)
    vocab = tok.get_vocab_size()
    print(f"tokenizer: {vocab} tokens; e.g. {tok.encode(docs[0]).tokens[:16]}")

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                      num_hidden_layers=args.layers, num_attention_heads=4,
                      num_key_value_heads=4, max_position_embeddings=256, rms_norm_eps=1e-5,
                      rope_theta=10000.0, tie_word_embeddings=False,
                      bos_token_id=tok.token_to_id("<s>"), eos_token_id=tok.token_to_id("</s>"),
                      pad_token_id=None, torch_dtype="bfloat16")
    if args.reuse_model:
        model = LlamaForCausalLM.from_pretrained(out / "model", torch_dtype=torch.float32)
    else:
        model = LlamaForCausalLM(cfg)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"model: {n_params / 1e6:.2f}M parameters")
        pretrain(model, tok, docs, args.steps, args.batch, args.seq, args.lr)
        model.to(torch.bfloat16).save_pretrained(out / "model", safe_serialization=True)
        (out / "model" / "model.safetensors").chmod(0o644)
        model.float()
    model.eval()

    print(f"base model recalls {100 * recall(model, tok, world):.0f}% of the facts "
          f"(\"The zabu eats\" -> \"fish\")")
    qa = random.Random(SEED + 2)
    train = qa_records(qa, world[:N_FT_CREATURES])
    evals = qa_records(qa, world[N_FT_CREATURES:])
    for name, recs in (("train.jsonl", train), ("eval.jsonl", evals)):
        with open(out / name, "w", encoding="utf-8") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {out}/model, {out}/train.jsonl ({len(train)}), {out}/eval.jsonl ({len(evals)})")


if __name__ == "__main__":
    main()
