"""Summaries: where to cut, what the summarizer is sent, the offline summarizer, and the checks."""
