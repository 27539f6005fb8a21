"""The machine's side, shared by servers, clients and launchers alike; standard library only.

- :mod:`~nemo_gym_env.system.net`: sockets and addresses (bind, name, probe);
- :mod:`~nemo_gym_env.system.processes`: process groups, and SIGTERM as
  :class:`~nemo_gym_env.errors.Stopped`;
- :mod:`~nemo_gym_env.system.child_env`: what a launcher hands a server process through its
  environment;
- :mod:`~nemo_gym_env.system.redaction`: secrets out of logs, configs, pages and files.

Every layer may import it; it imports nothing of the package but :mod:`nemo_gym_env.errors`.
"""
