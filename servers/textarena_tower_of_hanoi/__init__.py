"""``textarena_tower_of_hanoi``: TextArena's TowerOfHanoi-v0 served by the bridge (:mod:`nemo_gym_env.bridge.textarena_game`)."""
