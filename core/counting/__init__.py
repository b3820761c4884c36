"""Counting: tokens per encoding, media by provider rule, reasoning content, the request budget."""
