"""``frozen_lake``: Gymnasium's ``FrozenLake-v1`` as a Gymnasium-protocol resources server.

The server is the bridge's :class:`~nemo_gym_env.bridge.gymnasium_env.GymnasiumEnvServer`; its
config (``configs/frozen_lake.yaml``) names the env. One env per session, reset with the row's seed;
the observation is the state in words; the model answers ``<action>NAME</action>``.
"""

from nemo_gym_env.bridge.gymnasium_env import GymnasiumEnvServer

if __name__ == "__main__":
    GymnasiumEnvServer.run_webserver()
