"""KV forensics: incident forensics for cross-tenant KV cache exposure in LLM serving."""

__version__ = "0.1.0"
