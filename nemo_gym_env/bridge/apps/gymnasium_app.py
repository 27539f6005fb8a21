"""Serve a ``gymnasium.Env`` (the launcher's entrypoint for ``gymnasium:ENV_ID`` targets and configs)."""

from nemo_gym_env.bridge.gymnasium_env import GymnasiumEnvServer

if __name__ == "__main__":
    GymnasiumEnvServer.run_webserver()
