"""The long-lived process inside each local sandbox (run by the host's python with `-I -S`, stdlib only).

It holds the sandbox's namespaces, and
  * runs every command the host asks for: the host sends a marshal'ed {"op": "exec", ...} over a
    SOCK_SEQPACKET control socket with the command's stdin/stdout/stderr pipe ends attached (SCM_RIGHTS),
    so output flows straight to the host without passing through here; it answers with one line of text,
    "exit <id> <code> <signal>" (plain text, so the host never unmarshals anything from inside);
  * relays 127.0.0.1:<port> inside the sandbox to the serving proxy's Unix socket bound at /run/clawgym/.
The host passes `argv[1]` = control fd, `argv[2]` = hex of the marshal'ed config. Only builtin low-level
modules are imported (_socket, _thread, marshal ...): each sandbox start pays this interpreter's start-up. When the control socket closes (host gone
or sandbox destroyed) this process exits, and bubblewrap kills everything left in the PID namespace.
This file is read as text and given to `python -c`; it must not import anything outside the stdlib.
"""

import _signal
import _socket as socket
import _thread
import array
import marshal
import os
import resource
import sys

CONTROL = None  # set in main()
CONFIG = {}
CHILDREN = {}  # request id -> pid
SEND_LOCK = _thread.allocate_lock()


def send(*words):
    with SEND_LOCK:
        CONTROL.send(" ".join(str(w) for w in words).encode(errors="replace"))


def apply_limits():
    for name, value in CONFIG.get("rlimits", {}).items():
        limit = getattr(resource, name)
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
    if "/" in name:
        return name
    for folder in env.get("PATH", "/usr/bin:/bin").split(":"):
        candidate = (folder or ".") + "/" + name
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    raise FileNotFoundError(2, "No such file or directory", name)


def spawn(request, fds):
    """posix_spawn (vfork + exec: no copy of this interpreter's memory) with the given pipe ends as 0, 1, 2.

    The received fds are close-on-exec (MSG_CMSG_CLOEXEC); dup2 onto 0-2 clears that flag on the copies
    only. chdir happens here, before the spawn, since posix_spawn cannot; requests are handled one at a time.
    Exec errors (missing program, no permission, bad cwd) come back as an "error" reply.
    """
    try:
        os.chdir(request["cwd"])
        argv, env = request["argv"], request["env"]
        pid = os.posix_spawn(
            find_program(argv[0], env), argv, env,
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)],
            setsid=True,  # own session and process group: killpg reaches everything it starts
            setsigdef=(_signal.SIGPIPE, _signal.SIGXFSZ),  # python ignores these; commands expect defaults
        )
    except OSError as exc:
        send("error", request["id"], "%s: %s" % (type(exc).__name__, exc))
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


def main():
    global CONTROL, CONFIG
    os.set_inheritable(int(sys.argv[1]), False)  # commands must not get the control socket
    CONTROL = socket.socket(fileno=int(sys.argv[1]))
    CONFIG = marshal.loads(bytes.fromhex(sys.argv[2]))
    apply_limits()
    relay = CONFIG.get("relay")
    if relay:
        start_relay(relay["port"], relay["socket"])
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
        request = marshal.loads(data)
        if request["op"] == "exec":
            spawn(request, list(fds))
        elif request["op"] == "kill":
            kill(request["id"])
    for pid in list(CHILDREN.values()):
        try:
            os.killpg(pid, _signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
