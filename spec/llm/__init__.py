"""The LLM side of speculative decoding: Hugging Face causal LMs as draft and target (DESIGN.md §8)."""
