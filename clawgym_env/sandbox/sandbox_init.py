"""The long-lived process inside each local sandbox (run by the host's python with `-I -S`, stdlib only).

It holds the sandbox's namespaces, and
  * runs every command the host asks for: the host sends "exec\0<id>\0<cwd>\0<argc>\0<argv...>\0<NAME=value...>"
    (fields separated by NUL) over a SOCK_SEQPACKET control socket with the command's stdin/stdout/stderr
    pipe ends attached (SCM_RIGHTS), so output flows straight to the host without passing through here; it
    answers with one line of text, "exit <id> <code> <signal>" or "error <id> <message>";
  * relays 127.0.0.1:<port> inside the sandbox to the serving proxy's Unix socket, given as an O_PATH fd.
argv: <control fd> <rlimits "name=value,..."> [<relay port> <proxy socket fd>]. sandbox_init.c is the same
program in C (same arguments and protocol), used where a C compiler is available since it starts ~15 ms
faster; this one is the fallback. Only low-level modules are imported (_socket, _thread ...; ctypes once). When the
control socket closes (host gone or sandbox destroyed) this process exits, and bubblewrap kills everything
left in the PID namespace. This file is read as text and given to `python -c`; stdlib only.
"""

import _signal
import _socket as socket
import _thread
import array
import os
import resource
import sys

CONTROL = None  # set in main()
RLIMITS = {
    "core": resource.RLIMIT_CORE,
    "fsize": resource.RLIMIT_FSIZE,
    "nproc": resource.RLIMIT_NPROC,
    "data": resource.RLIMIT_DATA,
}
CHILDREN = {}  # request id -> pid
SEND_LOCK = _thread.allocate_lock()


def send(*words):
    with SEND_LOCK:
        CONTROL.send(" ".join(str(w) for w in words).encode(errors="replace"))


def apply_limits(spec):
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        limit, value = RLIMITS[name], int(value)
        soft, hard = resource.getrlimit(limit)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(limit, (value, value))


def pump(source, sink):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def relay_connection(client, target):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(target)
    except OSError:
        client.close()
        upstream.close()
        return
    done = _thread.allocate_lock()
    done.acquire()

    def backwards():
        pump(upstream, client)
        done.release()

    _thread.start_new_thread(backwards, ())
    pump(client, upstream)
    done.acquire()
    client.close()
    upstream.close()


def start_relay(port, target):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)

    def serve():
        while True:
            fd, _ = listener._accept()
            _thread.start_new_thread(relay_connection, (socket.socket(fileno=fd), target))

    _thread.start_new_thread(serve, ())


def find_program(name, env):
    """The file execvp would run for `name`, searched in the command's own PATH (not the init's)."""
    if b"/" in name:
        return name
    for folder in env.get(b"PATH", b"/usr/bin:/bin").split(b":"):
        candidate = (folder or b".") + b"/" + name
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    raise FileNotFoundError(2, "No such file or directory", os.fsdecode(name))


def spawn(request, fds):
    """posix_spawn (vfork + exec: no copy of this interpreter's memory) with the given pipe ends as 0, 1, 2.

    The received fds are close-on-exec (MSG_CMSG_CLOEXEC); dup2 onto 0-2 clears that flag on the copies
    only. chdir happens here, before the spawn, since posix_spawn cannot; requests are handled one at a time.
    Exec errors (missing program, no permission, bad cwd) come back as an "error" reply.
    """
    try:
        os.chdir(os.fsdecode(request["cwd"]))
        argv, env = request["argv"], request["env"]
        pid = os.posix_spawn(
            find_program(argv[0], env),
            argv,
            env,
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)],
            setsid=True,  # own session and process group: killpg reaches everything it starts
            setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ),  # python ignores these; commands expect defaults
        )
    except OSError as exc:
        send("error", request["id"], f"{type(exc).__name__}: {exc}")
        return
    finally:
        for fd in fds:
            os.close(fd)
    CHILDREN[request["id"]] = pid
    _thread.start_new_thread(wait_for, (request["id"], pid))


def wait_for(request_id, pid):
    _, status = os.waitpid(pid, 0)
    CHILDREN.pop(request_id, None)
    code = os.waitstatus_to_exitcode(status)
    send("exit", request_id, code if code >= 0 else 128 - code, -code if code < 0 else 0)


def kill(request_id):
    pid = CHILDREN.get(request_id)
    if pid is not None:
        try:
            os.killpg(pid, _signal.SIGKILL)
        except ProcessLookupError:
            pass


def not_dumpable():
    """A command (same uid, no capabilities) must not ptrace this process or take the control socket
    with pidfd_getfd; exec resets this for the commands. ctypes costs ~5 ms of start-up, worth it here."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (ImportError, OSError, AttributeError):
        pass


def main():
    global CONTROL
    not_dumpable()
    os.set_inheritable(int(sys.argv[1]), False)  # commands must not get the control socket
    CONTROL = socket.socket(fileno=int(sys.argv[1]))
    apply_limits(sys.argv[2])
    if len(sys.argv) >= 5:  # the proxy's socket comes as an open file: no host path is mounted, none shows
        os.set_inheritable(int(sys.argv[4]), False)
        start_relay(int(sys.argv[3]), "/proc/self/fd/" + sys.argv[4])
    send("ready", os.getpid())
    while True:
        try:
            data, ancdata, _, _ = CONTROL.recvmsg(1 << 20, socket.CMSG_SPACE(3 * 4), socket.MSG_CMSG_CLOEXEC)
        except OSError:
            break
        if not data:
            break
        fds = array.array("i")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
        fields = data.split(b"\0")
        if fields[0] == b"exec" and len(fields) >= 5 and len(fds) == 3:
            argc = int(fields[3])
            env = dict(entry.split(b"=", 1) for entry in fields[4 + argc :] if b"=" in entry)
            spawn({"id": int(fields[1]), "cwd": fields[2], "argv": fields[4 : 4 + argc], "env": env}, list(fds))
        else:
            for fd in fds:
                os.close(fd)
            if fields[0] == b"kill" and len(fields) >= 2:
                kill(int(fields[1]))
    for pid in list(CHILDREN.values()):
        try:
            os.killpg(pid, _signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
