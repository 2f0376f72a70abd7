"""Start-up: the gate, the import hook and the site files. Imports ``os`` and ``sys`` only."""
