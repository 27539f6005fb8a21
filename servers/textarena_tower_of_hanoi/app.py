"""``textarena_tower_of_hanoi``: TextArena's ``TowerOfHanoi-v0`` as a Gymnasium-protocol resources server (extra ``textarena``).

The server is the bridge's :class:`~nemo_gym_env.bridge.textarena_game.TextArenaServer`; its config
(``configs/textarena_tower_of_hanoi.yaml``) names the game. One game per session, reset with the row's seed.
"""

from nemo_gym_env.bridge.textarena_game import TextArenaServer

if __name__ == "__main__":
    TextArenaServer.run_webserver()
