"""splitinfer: split inference of decoder-only LLMs across an untrusted cloud."""

__version__ = "0.1.0"
