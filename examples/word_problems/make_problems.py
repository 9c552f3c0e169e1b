"""Writes problems.jsonl: the worked example's arithmetic word problems, made for the repo.

Run from the repository root to regenerate the file (it is committed, so a run
never needs this script):

    python examples/word_problems/make_problems.py

Each line is one JSON object with a ``prompt`` (the problem, in words) and an
``answer`` (the result, as a string of digits). The problems are drawn from a
few templates with a seeded generator, so the file is the same on every
machine.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

NUM_PROBLEMS = 240
SEED = 12
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Femi", "Gus", "Hana", "Ivo", "Jun")
THINGS = ("apples", "books", "coins", "pens", "shells", "stamps", "marbles", "cards")


def _problem(rng: random.Random) -> dict[str, str]:
    name = rng.choice(NAMES)
    thing = rng.choice(THINGS)
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randint(2, 60), rng.randint(2, 39)
        text = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?"
        answer = a + b
    elif kind == 1:
        a = rng.randint(20, 99)
        b = rng.randint(1, a - 1)
        text = f"{name} had {a} {thing} and gave away {b}. How many {thing} are left?"
        answer = a - b
    elif kind == 2:
        a, b = rng.randint(2, 9), rng.randint(2, 12)
        text = f"{name} buys {a} boxes with {b} {thing} in each box. How many {thing} is that?"
        answer = a * b
    else:
        b = rng.randint(2, 9)
        a = b * rng.randint(2, 11)
        text = f"{name} shares {a} {thing} equally among {b} friends. How many does each get?"
        answer = a // b
    return {"prompt": text, "answer": str(answer)}


def main() -> None:
    rng = random.Random(SEED)
    path = Path(__file__).with_name("problems.jsonl")
    with path.open("w", encoding="utf-8") as out:
        for _ in range(NUM_PROBLEMS):
            out.write(json.dumps(_problem(rng)) + "\n")
    print(f"wrote {NUM_PROBLEMS} problems to {path}")


if __name__ == "__main__":
    main()
