"""The ctrlrun sidecar proxy (needs the proxy extra: pip install 'ctrlrun[proxy]')."""
