"""Runs inside the sandboxed interpreter, before and around the untrusted program.

Started by ``sandbox.py`` as ``python -I -S -B -X utf8 -c <this source> MODE SCRATCH CPU_S AS_BYTES
FILE_BYTES PROCESSES``. Its first act is to set those resource limits (``_apply_limits``). It reads ``SCRATCH/solution.py``, removes a few dangerous
functions that raise no audit event (``_remove_unaudited``), installs an audit hook
(``sys.addaudithook``) that denies process creation, signals to other processes, sockets
other than local socket pairs, native-code modules (``ctypes``) and file access outside
``SCRATCH`` (reading the standard library is allowed), then runs the program:

* ``MODE == "stdio"``: as ``__main__``, reading the real stdin and writing the real stdout;
* ``MODE == "call"``: as module ``solution``; then calls ``fn_name(*args)`` from
  ``SCRATCH/call.json`` (a method of ``Solution()`` when the program defines that class) and
  writes the JSON of the return value to ``SCRATCH/.result.json``.

Every denial writes ``[sandbox] denied: <event>`` to stderr before raising, so the parent can
tell a forbidden operation from an ordinary crash. Exit codes 101 (syntax error), 102
(out of memory) and 103 (return value not JSON) are reserved for the parent's classification.

An audit hook is not a security boundary: see the server's README for what it does not stop.
This file is not imported by the server; its source is passed with ``-c``.
"""

import sys

EXIT_SYNTAX = 101
EXIT_MEMORY = 102
EXIT_BAD_RETURN = 103


def _install_hook(scratch, read_roots):
    """Install the audit hook. All its state lives in this closure, in immutable values."""
    import os

    realpath = os.path.realpath
    join = os.path.join
    isdir = os.path.isdir
    fsdecode = os.fsdecode
    write = os.write
    sep = os.sep
    scratch_prefix = (realpath(scratch).rstrip(sep) + sep,)
    read_prefixes = tuple(realpath(r).rstrip(sep) + sep for r in read_roots) + scratch_prefix
    read_devices = frozenset(
        ("/dev/stdin", "/dev/null", "/dev/urandom", "/dev/random", "/dev/zero", "/dev/fd/0")
    )
    write_devices = frozenset(("/dev/null", "/dev/stdout", "/dev/stderr", "/dev/fd/1", "/dev/fd/2"))
    af_unix = 1  # socket.AF_UNIX on every POSIX system
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    denied_events = frozenset(
        (
            "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
            "os.kill", "os.killpg", "signal.pthread_kill", "subprocess.Popen", "pty.spawn",
            "os.link", "os.symlink", "os.chdir", "os.chroot",
            "sys.addaudithook", "sys.settrace", "sys.setprofile", "sys._current_frames",
            "sys._current_exceptions", "gc.get_objects", "gc.get_referrers", "gc.get_referents",
            "resource.setrlimit", "resource.prlimit",
            "webbrowser.open", "sqlite3.connect", "sqlite3.connect/handle", "sqlite3.enable_load_extension",
        )
    )  # fmt: skip
    denied_prefixes = (
        "socket.", "ctypes.", "http.client.", "urllib.", "ftplib.", "smtplib.", "poplib.", "imaplib.",
        "nntplib.", "telnetlib.", "winreg.", "_winapi.", "msvcrt.",
    )  # fmt: skip
    denied_modules = frozenset(
        (
            "ctypes", "_ctypes", "_posixsubprocess", "_testcapi", "_testinternalcapi", "_testbuffer",
            "_xxsubinterpreters", "_xxinterpchannels", "_posixshmem", "_multiprocessing", "_sqlite3",
            "_dbm", "_gdbm", "cffi", "_cffi_backend", "readline", "_tkinter",
        )
    )  # fmt: skip
    # Events that write (or remove) paths: {event: ((path argument index, its dir_fd index or None), ...)}.
    write_path_events = {
        "os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),), "os.rename": ((0, 2), (1, 3)),
        "os.chmod": ((0, 2),), "os.chown": ((0, 3),), "os.utime": ((0, 3),), "os.chflags": ((0, None),),
        "os.truncate": ((0, None),), "os.setxattr": ((0, None),), "os.removexattr": ((0, None),),
        "shutil.rmtree": ((0, None),), "shutil.copyfile": ((1, None),), "shutil.copymode": ((1, None),),
        "shutil.copystat": ((1, None),), "shutil.copytree": ((1, None),), "shutil.move": ((0, None), (1, None)),
        "shutil.chown": ((0, None),), "shutil.make_archive": ((0, None),), "shutil.unpack_archive": ((1, None),),
        "tempfile.mkstemp": ((0, None),), "tempfile.mkdtemp": ((0, None),),
    }  # fmt: skip
    read_path_events = {
        "os.listdir": (0,),
        "os.scandir": (0,),
        "os.getxattr": (0,),
        "os.listxattr": (0,),
        "glob.glob": (0,),
    }

    def resolve(path, dir_fd=None):
        """The real absolute path meant (file descriptors resolved through /proc), or None."""
        try:
            if isinstance(path, int):
                return realpath(f"/proc/self/fd/{path}")
            path = fsdecode(path)
            if isinstance(dir_fd, int) and dir_fd >= 0 and not path.startswith(sep):  # -1: no dir_fd
                path = join(realpath(f"/proc/self/fd/{dir_fd}"), path)
            return realpath(path)
        except (TypeError, ValueError, OSError):
            return None

    def under(full, prefixes):
        return full is not None and (full + sep).startswith(prefixes)

    def may_write(path, dir_fd=None):
        return under(resolve(path, dir_fd), scratch_prefix)

    def may_read(path, opening=False):
        if path is None or (isinstance(path, str) and path in read_devices):
            return True  # listdir()/scandir() of the working directory, or a harmless device
        if isinstance(path, int) and opening:
            return True  # re-opening a descriptor grants no new access
        full = resolve(path)
        if under(full, scratch_prefix):
            return True
        if not under(full, read_prefixes) or "/site-packages/" in full or "/dist-packages/" in full:
            return False
        # No descriptors of directories outside scratch: with one, a relative path given with
        # dir_fd= (which the "open" event does not show) would escape the checks above.
        return not (opening and isdir(full))

    def deny(event, what):
        try:
            write(2, f"[sandbox] denied: {event} {what}\n"[:300].encode("utf-8", "replace"))
        except OSError:
            pass
        if event == "import":
            raise ImportError(f"sandbox: importing {what} is not allowed")
        raise PermissionError(f"sandbox: {event} is not allowed")

    def hook(event, args):
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writing = bool((flags or 0) & write_flags) or (
                mode is not None and any(c in str(mode) for c in "wax+")
            )
            if writing:
                if not (isinstance(path, int) or path in write_devices or may_write(path)):
                    deny(event, f"{path!r} for writing")
            elif not may_read(path, opening=True):
                deny(event, repr(path))
        elif event == "import":
            name = str(args[0]) if args else ""
            # Every component: the init symbol of an extension comes from the last one.
            if any(part in denied_modules for part in name.split(".")):
                deny(event, name)
        elif event == "socket.__new__":
            # AF_UNIX only: asyncio's self-pipe is a socketpair. connect/bind/sendto stay denied.
            if len(args) < 2 or args[1] != af_unix:
                deny(event, f"family {args[1] if len(args) > 1 else None!r}")
        elif event in denied_events or event.startswith(denied_prefixes):
            deny(event, "")
        elif event in write_path_events:
            for index, dir_fd_index in write_path_events[event]:
                dir_fd = args[dir_fd_index] if dir_fd_index is not None and dir_fd_index < len(args) else None
                if index < len(args) and not may_write(args[index], dir_fd):
                    deny(event, repr(args[index]))
        elif event in read_path_events:
            for index in read_path_events[event]:
                if index < len(args) and not may_read(args[index]):
                    deny(event, repr(args[index]))

    sys.addaudithook(hook)


def _apply_limits(cpu_s, address_space, file_bytes, processes):
    """Hard and soft limits of this process, before anything of the program is read; the audit hook
    then denies ``resource.setrlimit``, so the program cannot raise them (root included)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _main():
    import os

    _apply_limits(*(int(value) for value in sys.argv[3:7]))
    mode, scratch = sys.argv[1], sys.argv[2]
    program_path = os.path.join(scratch, "solution.py")
    with open(program_path, "rb") as f:
        source = f.read()
    call = None
    if mode == "call":
        import json

        with open(os.path.join(scratch, "call.json"), "rb") as f:
            call = json.loads(f.read())
    try:
        code = compile(source, program_path, "exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: null bytes in the source
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
        os._exit(EXIT_SYNTAX)

    read_roots = [p for p in sys.path if p and os.path.isdir(p)]
    _remove_unaudited()
    _install_hook(scratch, read_roots)
    # ``-S`` skips ``site``, which is what defines ``exit()`` and ``quit()``; programs use them.
    import builtins

    builtins.exit = builtins.quit = _quit

    module = type(sys)("__main__" if mode == "stdio" else "solution")
    module.__file__ = program_path
    module.__builtins__ = __builtins__
    sys.modules[module.__name__] = module
    sys.argv = [program_path]
    try:
        exec(code, module.__dict__)  # noqa: S102 (running the program is the point)
        if call is not None:
            _call(module.__dict__, call, os.path.join(scratch, ".result.json"))
    except MemoryError:
        os.write(2, b"MemoryError\n")
        os._exit(EXIT_MEMORY)
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 (report any crash, then exit 1)
        sys.excepthook(*sys.exc_info())
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)


# Dangerous functions that raise no audit event, removed before the program runs.
_UNAUDITED = {
    "posix": (
        "pidfd_open", "mkfifo", "mknod", "nice", "setpriority", "sched_setscheduler", "sched_setparam",
        "sched_setaffinity", "chroot", "setns", "unshare",
    ),
    "_signal": ("pidfd_send_signal",),
    "time": ("clock_settime", "clock_settime_ns"),
}  # fmt: skip


def _remove_unaudited():
    """Remove functions the audit hook cannot see, so that no copy of them stays reachable.

    ``os.pidfd_open`` + ``signal.pidfd_send_signal`` would kill any process (the server
    included), ``os.mknod`` would make a device node in scratch (raw disk access as root),
    ``time.clock_settime`` would set the machine's clock. Every built-in module is imported
    first and ``_imp.create_builtin`` is then disabled, so a fresh ``posix`` cannot be made;
    ``subprocess`` (and so ``asyncio``) needs ``_posixsubprocess``, loaded here with its
    process-spawning function replaced (the hook denies loading it again).
    """
    import _imp
    import _posixsubprocess
    import os

    for name in sys.builtin_module_names:
        __import__(name)
    removed = set()
    for module_name, names in _UNAUDITED.items():
        for name in names:
            function = getattr(sys.modules[module_name], name, None)
            if function is not None:
                removed.add(function)
                delattr(sys.modules[module_name], name)
                if module_name == "posix" and hasattr(os, name):
                    delattr(os, name)
    for functions in (
        os.supports_dir_fd,
        os.supports_fd,
        os.supports_follow_symlinks,
        os.supports_effective_ids,
    ):
        functions.difference_update(removed)
    _posixsubprocess.fork_exec = _no_fork_exec
    _imp.create_builtin = _no_create_builtin


def _no_fork_exec(*args, **kwargs):
    import os

    os.write(2, b"[sandbox] denied: _posixsubprocess.fork_exec\n")
    raise PermissionError("sandbox: starting processes is not allowed")


def _no_create_builtin(spec):
    import os

    os.write(2, f"[sandbox] denied: _imp.create_builtin {getattr(spec, 'name', spec)}\n".encode())
    raise ImportError("sandbox: re-creating a built-in module is not allowed")


def _quit(code=None):
    raise SystemExit(code)


def _call(namespace, call, result_path):
    import json
    import os

    name = call["fn_name"]
    solution = namespace.get("Solution")
    if isinstance(solution, type) and hasattr(solution, name):
        target = getattr(solution(), name)
    elif callable(namespace.get(name)):
        target = namespace[name]
    else:
        raise NameError(f"the program defines no function {name!r} (nor a Solution class with that method)")
    value = target(*call["args"])
    try:
        encoded = json.dumps(value).encode()
    except (TypeError, ValueError) as exc:
        sys.stderr.write(f"return value is not JSON: {exc}\n")
        sys.stderr.flush()
        os._exit(EXIT_BAD_RETURN)
    fd = os.open(result_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, encoded)
    finally:
        os.close(fd)


if __name__ == "__main__":
    _main()
