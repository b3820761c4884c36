"""The decision: skip, rest, clear or summarize, and what clearing costs in prompt-cache terms."""
