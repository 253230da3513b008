"""Speculative decoding: token trees, tree builders and the LLM adapter (DESIGN.md §7-§8; later issues)."""
