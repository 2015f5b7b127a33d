"""foxdqn."""
from foxdqn import timings as _timings  # noqa: F401  first: the start-up clock's "interpreter" phase ends here
