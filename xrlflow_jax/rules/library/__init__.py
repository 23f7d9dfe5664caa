"""The built-in rule library, by family."""
