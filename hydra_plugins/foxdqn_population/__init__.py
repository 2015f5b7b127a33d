"""foxdqn's Hydra plugins: ``hydra/launcher=population`` (:mod:`.population_launcher`) and the basic
sweeper that checks each batch once per structure (:mod:`.sweeper`). They live in Hydra's
``hydra_plugins`` namespace package (no ``__init__.py`` above this folder), where Hydra looks for
plugins, and ship in foxdqn's wheel (pyproject.toml)."""
