"""Warm-up examples of tasks whose prompts carry their answer."""

from __future__ import annotations

from rollvault.tasks.protocols import PromptDataset

__all__ = ["warmup_examples"]


def warmup_examples(dataset: PromptDataset) -> list[tuple[str, str]]:
    """``(prompt_text, answer)`` of every prompt; the answer is ``extra_env_info["answer"]``."""
    examples = []
    for idx in range(len(dataset)):
        datum = dataset[idx]
        answer = (datum.get("extra_env_info") or {}).get("answer")
        text = datum.get("prompt_text")
        if not isinstance(answer, str) or not isinstance(text, str):
            raise ValueError(
                f"warm-up needs prompt_text and extra_env_info.answer strings; prompt {idx} "
                f"has {text!r} and {answer!r} (set trainer.warmup.steps=0 for this dataset)"
            )
        examples.append((text, answer))
    return examples
