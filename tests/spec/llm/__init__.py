"""Tests of spec.llm (need torch and transformers; marker llm)."""
