"""A preloaded process that forks real `nph` processes for the tests (`zygote` in conftest.py).

It imports torch, safetensors, FAISS (when installed) and the CLI once, then waits on a socket.
For each request (JSON: arguments, working directory, environment, an optional cap on address
space; with three file descriptors that become the child's stdin, stdout and stderr) it forks a
child in a session of its own and answers with the child's pid; when a child ends it sends its
exit status (as `subprocess` reports it: negative for a signal). A fresh interpreter spends about
3 s importing torch; a fork starts with it loaded.

The fork is a clean copy because this process never runs torch: no thread pool has started, and
OMP_NUM_THREADS=1 is set before the import. The child leaves this file's loop and runs the command
at the top level, so an uncaught exception, `SystemExit`, `KeyboardInterrupt`, atexit hooks and the
final flush behave as in `python -m nphcli`.
"""

import importlib
import importlib.util
import io
import json
import os
import resource
import runpy
import select
import socket
import sys
import types

for name in ("torch", "safetensors.torch", "nphcli.cli.app", "nphcli.memory.open", "faiss"):
    if name != "faiss" or importlib.util.find_spec(name):  # faiss: the ann extra
        importlib.import_module(name)


def serve(channel: socket.socket) -> dict:
    """Forks a child per request; returns only in a child, with its request."""
    children: dict[int, tuple[int, int]] = {}  # pidfd: (request id, pid)
    while True:
        ready, _, _ = select.select([channel, *children], [], [])
        for pidfd in ready:
            if pidfd is channel:
                continue
            number, pid = children.pop(pidfd)
            os.close(pidfd)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            channel.send(json.dumps({"id": number, "exit": code}).encode())
        if channel not in ready:
            continue
        message, fds, _, _ = socket.recv_fds(channel, 1 << 20, 3)
        if not message:  # the tests closed their end
            sys.exit(0)
        request = json.loads(message)
        pid = os.fork()
        if pid == 0:
            channel.close()
            for pidfd in children:
                os.close(pidfd)
            os.setsid()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            return request
        for fd in fds:
            os.close(fd)
        children[os.pidfd_open(pid)] = (request["id"], pid)
        channel.send(json.dumps({"id": request["id"], "pid": pid}).encode())


request = serve(socket.socket(fileno=int(sys.argv[1])))
os.chdir(request["cwd"])
os.environ.clear()
os.environ.update(request["env"])
# The streams as a fresh interpreter opens them on these descriptors: stdout line-buffered at a
# terminal, stderr always; both written through under PYTHONUNBUFFERED.
unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
sys.stdin = open(0, closefd=False)
for fd, stream in ((1, "stdout"), (2, "stderr")):
    raw = open(fd, "wb", buffering=0, closefd=False)
    binary = raw if unbuffered else io.BufferedWriter(raw)
    errors = "backslashreplace" if fd == 2 else "strict"
    tty = fd == 2 or raw.isatty()
    text = io.TextIOWrapper(binary, errors=errors, line_buffering=tty, write_through=unbuffered)
    setattr(sys, stream, text)
if request["headroom"] is not None:  # cap the address space at what the imports use plus this
    pages = int(open("/proc/self/statm").read().split()[0])
    limit = pages * resource.getpagesize() + request["headroom"]
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
args = request["args"]
del request
# sys.path[0] and __main__ as `python -c` and `python -m` set them: multiprocessing's spawned
# workers run the main module's file again, which must not be this one.
if args[0] == "-c":  # as `python -c CODE ARGS`
    sys.argv = ["-c", *args[2:]]
    sys.path[0] = ""
    sys.modules["__main__"] = main = types.ModuleType("__main__")
    exec(compile(args[1], "<string>", "exec"), main.__dict__)
else:
    sys.argv = ["nph", *args]
    sys.path[0] = os.getcwd()
    runpy.run_module("nphcli", run_name="__main__", alter_sys=True)
