"""Conversions between agent frameworks' message types and Recap's messages (OpenAI's
chat-completions format), one module per framework. Each is pure: values in, values out."""
