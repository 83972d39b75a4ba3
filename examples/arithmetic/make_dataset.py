"""Writes chain_sum.jsonl: 400 train and 100 test prompts of reasoning-gym's `chain_sum` (sums and differences of
two to four integers), each with its answer, so the dataset task needs no network. Rerunning it gives the same file
(fixed seeds). Usage: python examples/arithmetic/make_dataset.py
"""

from __future__ import annotations

import json
from pathlib import Path

import reasoning_gym

OUT = Path(__file__).resolve().parent / "chain_sum.jsonl"
ASK = " Put the final answer in \\boxed{}."


def rows(split: str, size: int, seed: int) -> list[dict]:
    data = reasoning_gym.create_dataset(
        "chain_sum", size=size, seed=seed, min_terms=2, max_terms=4, min_digits=1, max_digits=2
    )
    return [
        {
            "prompt": entry["question"] + ASK,
            "answer": str(entry["answer"]),
            "split": split,
            "metadata": {"source": "reasoning_gym.chain_sum", "seed": seed, "index": i},
        }
        for i, entry in enumerate(data)
    ]


def main() -> None:
    lines = [json.dumps(row) for row in rows("train", 400, 1) + rows("test", 100, 2)]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} rows to {OUT}")


if __name__ == "__main__":
    main()
