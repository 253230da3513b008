"""Executable checks of the papers' theorems (DESIGN.md §2; a later issue)."""
