"""Package list for the one distribution.

`servers/` and `adapters/` live at the top of the repository but install under
`nemo_gym_env.servers` and `nemo_gym_env.adapters`, so no top-level import name collides
with another PyPI package. Data folders (configs/, data/) are shipped as namespace packages.
"""

from setuptools import find_namespace_packages, setup


def _mapped(folder: str, prefix: str) -> list[str]:
    found = find_namespace_packages(folder, exclude=["*__pycache__*"])
    return [prefix] + [f"{prefix}.{name}" for name in found]


setup(
    packages=find_namespace_packages(include=["nemo_gym_env", "nemo_gym_env.*"])
    + _mapped("servers", "nemo_gym_env.servers")
    + _mapped("adapters", "nemo_gym_env.adapters"),
)
