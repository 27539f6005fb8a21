"""``textarena_guess_the_number``: TextArena's GuessTheNumber-v0 served by the bridge (:mod:`nemo_gym_env.bridge.textarena_game`)."""
