#!/usr/bin/env python3
"""Needle-in-a-haystack prompts for KV-format retrieval checks (tessera generate --batch).

A sentence "The secret number of <name> is <NNNN>." is hidden at a given depth of a filler
text (the license corpus, cut at sentence ends), and the chat asks for it; one JSONL line per
trial. Answers are scored by needle_score.py (the number must appear in the answer).
--template chatml (SmolLM2's chat) asks the question in a chat; --template plain (base models
without a chat template, e.g. Gemma 3 270M) ends the text with a question and the start of
the answer sentence, so the model must copy the number from the haystack.

    python3 tools/kvquant/make_needles.py --chars 4000 --trials 5 --depths 0.1,0.5,0.9 > needles.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["the blue door", "the old lighthouse", "the red kettle", "Captain Mora", "the north tower",
         "the green notebook", "the garden gate", "the river boat"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chars", type=int, default=4000, help="filler length in characters")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--template", choices=["chatml", "plain"], default="chatml")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    text = (ROOT / "tests/fixtures/text/licenses_gpl3_apache2.txt").read_text()
    for depth in [float(d) for d in args.depths.split(",")]:
        for t in range(args.trials):
            start = rng.randrange(0, len(text) - args.chars - 1)
            filler = text[start:start + args.chars]
            cut = filler.rfind(". ", 0, int(depth * len(filler)) + 1)
            cut = cut + 2 if cut >= 0 else 0
            name, number = rng.choice(NAMES), rng.randrange(1000, 10000)
            hay = f"{filler[:cut]}The secret number of {name} is {number}. {filler[cut:]}"
            if args.template == "plain":
                prompt = (f"{hay}\n\nQuestion: What is the secret number of {name}?\n"
                          f"Answer: The secret number of {name} is")
            else:
                prompt = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                          f"<|im_end|>\n<|im_start|>user\n{hay}\n\nWhat is the secret number of {name}?<|im_end|>\n"
                          "<|im_start|>assistant\n")
            print(json.dumps({"prompt": prompt, "max_tokens": 24, "temperature": 0,
                              "meta": {"depth": depth, "trial": t, "number": number}}))


if __name__ == "__main__":
    main()
