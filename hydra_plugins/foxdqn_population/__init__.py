"""foxdqn's Hydra plugin: ``hydra/launcher=population`` (:mod:`.population_launcher`). It lives in
Hydra's ``hydra_plugins`` namespace package (no ``__init__.py`` above this folder), where Hydra
looks for plugins, and ships in foxdqn's wheel (pyproject.toml)."""
