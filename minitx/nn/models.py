"""Complete models (being written)."""
__all__ = []
