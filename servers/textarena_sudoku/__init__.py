"""``textarena_sudoku``: TextArena's Sudoku-v0-easy served by the bridge (:mod:`nemo_gym_env.bridge.textarena_game`)."""
