"""``blackjack``: Blackjack-v1 served by the bridge (:mod:`nemo_gym_env.bridge.gymnasium_env`)."""
