"""Statistical correctness checks for speculative-sampling verifiers (DESIGN.md §5)."""
