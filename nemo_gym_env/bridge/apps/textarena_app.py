"""Serve a TextArena game (the launcher's entrypoint for ``textarena:GAME`` targets and configs)."""

from nemo_gym_env.bridge.textarena_game import TextArenaServer

if __name__ == "__main__":
    TextArenaServer.run_webserver()
