"""The bundled resources servers, one folder each (installed as ``nemo_gym_env.servers``).

This file makes ``servers/`` a regular package: setuptools' editable finder cannot resolve a
namespace sub-package of a regular package (``nemo_gym_env.servers``) otherwise.
"""
