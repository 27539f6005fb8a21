"""Trainer adapters, imported as ``nemo_gym_env.adapters.<name>``."""
