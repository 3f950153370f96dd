"""A room for the persistent cache: keys, entries, store. Empty for now."""
