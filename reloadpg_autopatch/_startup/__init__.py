"""Start-up: the gate, the import finder and the site files. Imports ``os``, ``sys``, ``_env``."""
