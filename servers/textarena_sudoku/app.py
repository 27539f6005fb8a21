"""``textarena_sudoku``: TextArena's ``Sudoku-v0-easy`` as a Gymnasium-protocol resources server (extra ``textarena``).

The server is the bridge's :class:`~nemo_gym_env.bridge.textarena_game.TextArenaServer`; its config
(``configs/textarena_sudoku.yaml``) names the game. One game per session, reset with the row's seed.
"""

from nemo_gym_env.bridge.textarena_game import TextArenaServer

if __name__ == "__main__":
    TextArenaServer.run_webserver()
