"""Start-up: the gate, the import hook and the site files. Imports ``os``, ``sys`` and ``_env``."""
