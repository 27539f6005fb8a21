"""Interoperability with the real NVIDIA NeMo Gym (see conftest.py and docs/porting.md)."""
