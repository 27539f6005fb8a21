"""``textarena_tic_tac_toe``: TextArena's TicTacToe-v0 served by the bridge (:mod:`nemo_gym_env.bridge.textarena_game`)."""
