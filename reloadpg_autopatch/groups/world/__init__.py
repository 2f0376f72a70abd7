"""WORLD in the cycle: its registration, its own ways (the swap among them), and its end."""
