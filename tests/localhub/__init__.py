"""A small, local stand-in for the Hugging Face Hub HTTP API, for tests.

See `server.py`. Only the endpoints that `huggingface_hub` (upload, download)
and the `kernels` loader actually call are implemented.
"""

from .server import LocalHub

__all__ = ["LocalHub"]
