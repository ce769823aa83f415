"""Built-in reconcilers: ask the remote what really happened to an ambiguous effect."""
