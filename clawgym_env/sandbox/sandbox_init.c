/* The long-lived process inside each local sandbox: the C twin of sandbox_init.py (same protocol).
 *
 * Compiled once per machine by native_init.py; it starts in ~1 ms where the Python init needs ~15 ms of
 * interpreter start-up, which is most of what a sandbox costs beyond bubblewrap itself.
 *
 * argv: <control fd> <rlimits "name=value,..."> [<relay port> <proxy socket fd (O_PATH)>]
 * On the host, the same binary also starts bubblewrap inside the sandbox's cgroup, in place of a shell:
 *   --in-cgroup <cgroup.procs file>... -- <bwrap argv>   (joins each cgroup, then execs bwrap)
 * Requests (SOCK_SEQPACKET, one per message, fields separated by NUL):
 *   exec \0 <id> \0 <cwd> \0 <argc> \0 <argv...> \0 <NAME=value...>   with stdin/stdout/stderr attached
 *   kill \0 <id>                                                       (SCM_RIGHTS)
 * Replies (one line of text each): "ready <pid>", "exit <id> <code> <signal>", "error <id> <message>".
 * Commands are started with posix_spawn (vfork + exec) in their own session; their exits are collected
 * through a signalfd. When the control socket closes, every command's process group is killed and the
 * init exits (bubblewrap then kills whatever is left in the PID namespace).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_MESSAGE (1 << 20)
#define MAX_CHILDREN 4096

static int control = -1;
static struct { pid_t pid; long id; } children[MAX_CHILDREN];
static int n_children;

static void reply(const char *format, ...) {
    char text[4096];
    va_list args;
    va_start(args, format);
    int length = vsnprintf(text, sizeof text, format, args);
    va_end(args);
    if (length > (int)sizeof text - 1) length = sizeof text - 1;
    send(control, text, length, MSG_NOSIGNAL);
}

static void apply_limits(const char *spec) {
    static const struct { const char *name; int resource; } names[] = {
        {"core", RLIMIT_CORE}, {"fsize", RLIMIT_FSIZE}, {"nproc", RLIMIT_NPROC}, {"data", RLIMIT_DATA}};
    char *copy = strdup(spec), *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq) continue;
        *eq = 0;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (strcmp(item, names[i].name) != 0) continue;
            struct rlimit current;
            rlim_t value = strtoull(eq + 1, NULL, 10);
            getrlimit(names[i].resource, &current);
            if (current.rlim_max != RLIM_INFINITY && value > current.rlim_max) value = current.rlim_max;
            struct rlimit wanted = {value, value};
            setrlimit(names[i].resource, &wanted);
        }
    }
    free(copy);
}

/* ------------------------------------------------------------------------------------------- relay */
static int write_all(int fd, const char *data, ssize_t length) {
    while (length > 0) {
        ssize_t done = write(fd, data, length);
        if (done < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        data += done;
        length -= done;
    }
    return 0;
}

static void pump_connection(int client, const char *target) {
    int upstream = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strncpy(address.sun_path, target, sizeof address.sun_path - 1);
    if (upstream < 0 || connect(upstream, (struct sockaddr *)&address, sizeof address) < 0) return;
    int ends[2] = {client, upstream}, open_ends[2] = {1, 1};
    static char buffer[65536];
    while (open_ends[0] || open_ends[1]) {
        struct pollfd polls[2];
        int n = 0, which[2];
        for (int i = 0; i < 2; i++)
            if (open_ends[i]) { polls[n] = (struct pollfd){.fd = ends[i], .events = POLLIN}; which[n++] = i; }
        if (poll(polls, n, -1) < 0) {
            if (errno == EINTR) continue;
            return;
        }
        for (int k = 0; k < n; k++) {
            if (!polls[k].revents) continue;
            int from = which[k], to = 1 - from;
            ssize_t got = read(ends[from], buffer, sizeof buffer);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0 || write_all(ends[to], buffer, got) < 0) { /* this direction is over */
                shutdown(ends[to], SHUT_WR);
                shutdown(ends[from], SHUT_RD);
                open_ends[from] = 0;
            }
        }
    }
}

/* 127.0.0.1:<port> -> the proxy's Unix socket; one process per connection. Listening before "ready". */
static void start_relay(int port, const char *target) {
    int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(port)};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&address, sizeof address) < 0 || listen(listener, 128) < 0) {
        perror("clawgym init: relay");
        exit(1);
    }
    if (fork() != 0) {
        close(listener);
        return;
    }
    close(control);
    signal(SIGCHLD, SIG_IGN); /* connection processes are reaped by the kernel */
    signal(SIGPIPE, SIG_IGN); /* a peer gone mid-write ends that direction, not the process */
    for (;;) {
        int client = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0) continue;
        if (fork() == 0) {
            close(listener);
            pump_connection(client, target);
            _exit(0);
        }
        close(client);
    }
}

/* ---------------------------------------------------------------------------------------- commands */
/* What execvp would run for `name`, searched in the command's own PATH; NULL with errno set if none. */
static const char *find_program(const char *name, char **env, char *path_buffer, size_t size) {
    if (strchr(name, '/')) return name;
    const char *search = "/usr/bin:/bin";
    for (char **entry = env; *entry; entry++)
        if (strncmp(*entry, "PATH=", 5) == 0) search = *entry + 5;
    int last_error = ENOENT;
    while (1) {
        const char *end = strchrnul(search, ':');
        int folder_length = (int)(end - search);
        snprintf(path_buffer, size, "%.*s/%s", folder_length, folder_length ? search : ".", name);
        struct stat info;
        if (stat(path_buffer, &info) == 0 && !S_ISDIR(info.st_mode)) {
            if (access(path_buffer, X_OK) == 0) return path_buffer;
            last_error = EACCES;
        }
        if (!*end) break;
        search = end + 1;
    }
    errno = last_error;
    return NULL;
}

static void run_command(long id, const char *cwd, char **argv, char **env, const int fds[3]) {
    char path[4096];
    const char *program = NULL;
    if (chdir(cwd) < 0) {
        reply("error %ld cannot enter %s: %s", id, cwd, strerror(errno));
        return;
    }
    if (n_children >= MAX_CHILDREN) {
        reply("error %ld too many running commands", id);
        return;
    }
    program = find_program(argv[0], env, path, sizeof path);
    if (!program) {
        reply("error %ld %s: %s", id, argv[0], strerror(errno));
        return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attributes;
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    int reset[] = {SIGPIPE, SIGXFSZ, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGCHLD};
    for (size_t i = 0; i < sizeof reset / sizeof reset[0]; i++) sigaddset(&defaults, reset[i]);
    posix_spawn_file_actions_init(&actions);
    for (int target = 0; target < 3; target++) posix_spawn_file_actions_adddup2(&actions, fds[target], target);
    posix_spawnattr_init(&attributes);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setsigmask(&attributes, &none); /* this process blocks SIGCHLD for its signalfd */
    posix_spawnattr_setsigdefault(&attributes, &defaults);
    pid_t pid;
    int error = posix_spawn(&pid, program, &actions, &attributes, argv, env);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    if (error) {
        reply("error %ld %s: %s", id, argv[0], strerror(error));
        return;
    }
    children[n_children].pid = pid;
    children[n_children++].id = id;
}

static void collect_exits(void) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (int i = 0; i < n_children; i++) {
            if (children[i].pid != pid) continue;
            if (WIFSIGNALED(status))
                reply("exit %ld %d %d", children[i].id, 128 + WTERMSIG(status), WTERMSIG(status));
            else
                reply("exit %ld %d 0", children[i].id, WEXITSTATUS(status));
            children[i] = children[--n_children];
            break;
        }
    }
}

static void kill_command(long id) {
    for (int i = 0; i < n_children; i++)
        if (children[i].id == id) killpg(children[i].pid, SIGKILL);
}

/* One request; `fds` are the attached pipe ends (closed here whatever happens). */
static void handle(char *data, ssize_t length, int *fds, int n_fds) {
    data[length] = 0; /* the buffer has one byte to spare */
    int n_fields = 0;
    for (ssize_t i = 0; i <= length; i++) n_fields += data[i] == 0;
    char **fields = calloc(n_fields + 1, sizeof(char *));
    n_fields = 0;
    for (char *at = data; at <= data + length; at += strlen(at) + 1) fields[n_fields++] = at;
    if (n_fields >= 2 && strcmp(fields[0], "kill") == 0) {
        kill_command(atol(fields[1]));
    } else if (n_fields >= 5 && strcmp(fields[0], "exec") == 0) {
        long id = atol(fields[1]);
        int argc = atoi(fields[3]);
        if (n_fds != 3 || argc < 1 || argc > n_fields - 4) {
            reply("error %ld malformed request", id);
        } else {
            /* argv: fields 4 .. 4+argc-1, NULL-ended in a copy; env: the rest, which ends with the NULL
               that calloc left after the last field */
            char **command = calloc(argc + 1, sizeof(char *));
            memcpy(command, fields + 4, argc * sizeof(char *));
            run_command(id, fields[2], command, fields + 4 + argc, fds);
            free(command);
        }
    }
    free(fields);
    for (int i = 0; i < n_fds; i++) close(fds[i]);
}

/* Host side: join the cgroups (writing "0" moves the writer), then exec the rest (bwrap). */
static int exec_in_cgroups(char **args) {
    for (; *args && strcmp(*args, "--") != 0; args++) {
        int fd = open(*args, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "0", 1) != 1) {
            fprintf(stderr, "clawgym: cannot join the cgroup %s: %s\n", *args, strerror(errno));
            return 127;
        }
        close(fd);
    }
    if (!*args || !args[1]) {
        fprintf(stderr, "usage: --in-cgroup <cgroup.procs>... -- <command>\n");
        return 2;
    }
    execvp(args[1], args + 1);
    fprintf(stderr, "clawgym: cannot run %s: %s\n", args[1], strerror(errno));
    return 127;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "--in-cgroup") == 0) return exec_in_cgroups(argv + 2);
    if (argc < 3) {
        fprintf(stderr, "usage: %s <control fd> <rlimits> [<relay port> <proxy socket fd>]\n", argv[0]);
        return 2;
    }
    control = atoi(argv[1]);
    fcntl(control, F_SETFD, FD_CLOEXEC); /* commands must not get the control socket */
    /* not dumpable: a command (same uid, no capabilities) cannot ptrace this process, read its
       /proc/<pid>/fd, or take the control socket with pidfd_getfd; exec resets this for commands */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    apply_limits(argv[2]);
    if (argc >= 5) { /* the proxy's socket comes as an open file: no host path is mounted, none shows */
        int socket_fd = atoi(argv[4]);
        fcntl(socket_fd, F_SETFD, FD_CLOEXEC);
        static char target[64];
        snprintf(target, sizeof target, "/proc/self/fd/%d", socket_fd);
        start_relay(atoi(argv[3]), target);
    }
    sigset_t child_signal;
    sigemptyset(&child_signal);
    sigaddset(&child_signal, SIGCHLD);
    sigprocmask(SIG_BLOCK, &child_signal, NULL);
    int exits = signalfd(-1, &child_signal, SFD_CLOEXEC | SFD_NONBLOCK);
    reply("ready %d", (int)getpid());
    char *message = malloc(MAX_MESSAGE + 1);
    char fd_space[CMSG_SPACE(3 * sizeof(int))];
    for (;;) {
        struct pollfd polls[2] = {{.fd = control, .events = POLLIN}, {.fd = exits, .events = POLLIN}};
        if (poll(polls, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (polls[1].revents) {
            struct signalfd_siginfo info;
            while (read(exits, &info, sizeof info) > 0) {}
            collect_exits();
        }
        if (!polls[0].revents) continue;
        struct iovec part = {.iov_base = message, .iov_len = MAX_MESSAGE};
        struct msghdr header = {.msg_iov = &part, .msg_iovlen = 1, .msg_control = fd_space,
                                .msg_controllen = sizeof fd_space};
        ssize_t length = recvmsg(control, &header, MSG_CMSG_CLOEXEC);
        if (length < 0 && errno == EINTR) continue;
        if (length <= 0) break;
        int fds[3], n_fds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&header); c; c = CMSG_NXTHDR(&header, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            int count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            int *received = (int *)CMSG_DATA(c);
            for (int i = 0; i < count; i++) {
                if (n_fds < 3) fds[n_fds++] = received[i];
                else close(received[i]);
            }
        }
        handle(message, length, fds, n_fds);
    }
    for (int i = 0; i < n_children; i++) killpg(children[i].pid, SIGKILL);
    return 0;
}
