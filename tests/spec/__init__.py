"""Tests of the spec package (token trees, builders, LLM adapter)."""
