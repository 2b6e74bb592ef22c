#!/usr/bin/env python3
"""Makes the demo's preference pairs (demo/pref_train.jsonl, demo/pref_eval.jsonl) from its
question-answer data (scripts/make-demo.py): each question keeps its answer as "chosen"
and gets as "rejected" a wrong answer of the same kind (another colour, place or food,
drawn with a fixed seed). make train-dpo trains on the first, evaluates on the second.

    python3 scripts/make-demo-pref.py   (from the repository root; no packages needed)
"""
import json
import random


def kind(completion):
    """' It is green.' -> ('It is ', 'green')"""
    for lead in (" It lives in ", " It eats ", " It is "):
        if completion.startswith(lead):
            return lead, completion[len(lead):-1]
    raise ValueError(completion)


def pairs(rows, n, rng):
    answers = {}
    for r in rows:
        lead, a = kind(r["completion"])
        answers.setdefault(lead, set()).add(a)
    out = []
    for r in rows[:n]:
        lead, a = kind(r["completion"])
        wrong = rng.choice(sorted(answers[lead] - {a}))
        out.append({"prompt": r["prompt"], "chosen": r["completion"],
                    "rejected": f"{lead}{wrong}."})
    return out


def main():
    rng = random.Random(26)
    for src, dst, n in (("demo/train.jsonl", "demo/pref_train.jsonl", 128),
                        ("demo/eval.jsonl", "demo/pref_eval.jsonl", 32)):
        rows = [json.loads(line) for line in open(src)]
        with open(dst, "w") as f:
            for p in pairs(rows, n, rng):
                f.write(json.dumps(p) + "\n")


if __name__ == "__main__":
    main()
