"""foxdqn."""
