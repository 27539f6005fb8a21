"""``reasoning_gym``: reasoning-gym's procedural tasks as a resources server (see README.md)."""
