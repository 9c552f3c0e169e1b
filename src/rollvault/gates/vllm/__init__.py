"""The vLLM gate: OpenAI-compatible vLLM servers as the generation engine."""
