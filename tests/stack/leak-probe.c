/*
 * The leak suite's probe (tests/stack/stack.sh, t_leaks): every way a program can ask the
 * kernel to reach an address, each aimed at the tunnel's far end, for `ordo run` to carry
 * through the tunnel or refuse. Built dynamic (the C library's calls pass the preload
 * library) and static (nothing does: the supervisor alone stands between it and the wire).
 *
 *   leak-probe V4 V6 CASE...   each CASE prints "CASE RESULT": ok, or the errno's name
 *
 * V4 and V6 are the far end's tunnel addresses; TCP goes to port 7200, UDP to 7201.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MSG_FASTOPEN
#define MSG_FASTOPEN 0x20000000
#endif

static const char *v4, *v6;
enum { TCP_PORT = 7200, UDP_PORT = 7201 };

static const char *name(int e) {
    switch (e) {
    case 0: return "ok";
    case ENETUNREACH: return "ENETUNREACH";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ECONNREFUSED: return "ECONNREFUSED";
    case EINVAL: return "EINVAL";
    case ENOSYS: return "ENOSYS";
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case EINPROGRESS: return "EINPROGRESS";
    case ETIMEDOUT: return "ETIMEDOUT";
    case EISCONN: return "EISCONN";
    case EDESTADDRREQ: return "EDESTADDRREQ";
    case ENOTCONN: return "ENOTCONN";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case ENOPROTOOPT: return "ENOPROTOOPT";
    default: {
        static char b[32];
        snprintf(b, sizeof b, "errno%d", e);
        return b;
    }
    }
}

/* The far end's IPv4 address in a buffer of `size` bytes, with `family` (0 for a family
 * forgotten in a zeroed sockaddr_in). */
static void sin_of(void *buf, size_t size, int family, uint16_t port) {
    memset(buf, 0, size);
    struct sockaddr_in *a = buf;
    a->sin_family = family;
    a->sin_port = htons(port);
    inet_pton(AF_INET, v4, &a->sin_addr);
}

static void sin6_of(struct sockaddr_in6 *a, uint16_t port, int mapped) {
    memset(a, 0, sizeof *a);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    if (mapped) {
        char m[64];
        snprintf(m, sizeof m, "::ffff:%s", v4);
        inet_pton(AF_INET6, m, &a->sin6_addr);
    } else {
        inet_pton(AF_INET6, v6, &a->sin6_addr);
    }
}

static int result(long r) { return r < 0 ? errno : 0; }

static int raw_connect(int fd, const void *a, socklen_t len) {
    return result(syscall(SYS_connect, fd, a, len));
}

static int raw_sendto(int fd, const void *a, socklen_t len) {
    return result(syscall(SYS_sendto, fd, "leak", 4, 0, a, len));
}

/* TCP to the far end's IPv4 address by the raw system call, in a fresh socket. */
static int tcp_raw_v4(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    sin_of(&a, sizeof a, AF_INET, TCP_PORT);
    int e = raw_connect(fd, &a, sizeof a);
    close(fd);
    return e;
}

/* UDP to the far end's IPv4 address by the raw system call, unconnected. */
static int udp_raw_v4(void) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a;
    sin_of(&a, sizeof a, AF_INET, UDP_PORT);
    int e = raw_sendto(fd, &a, sizeof a);
    close(fd);
    return e;
}

/* A child's result, as its exit status. */
static int child_result(pid_t pid) {
    int status;
    if (pid < 0) return errno;
    if (waitpid(pid, &status, __WALL) < 0) return errno;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 255;
}

static int clone3_child(void) {
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.exit_signal = SIGCHLD;
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) _exit(tcp_raw_v4());
    if (pid < 0) return errno;
    return child_result((pid_t)pid);
}

/* A grandchild reparented away from its parent (a double fork): it waits until its parent
 * has gone, then tries TCP and UDP, and writes the two results to `out`. */
static int reparented(int *udp) {
    int p[2];
    if (pipe(p) < 0) return errno;
    pid_t child = fork();
    if (child == 0) {
        pid_t parent = getpid();
        if (fork() == 0) {
            while (getppid() == parent) usleep(10000);
            int r[2] = {tcp_raw_v4(), udp_raw_v4()};
            write(p[1], r, sizeof r);
            _exit(0);
        }
        _exit(0);
    }
    close(p[1]);
    child_result(child);
    int r[2] = {255, 255};
    if (read(p[0], r, sizeof r) != sizeof r) return EIO;
    *udp = r[1];
    return r[0];
}

/* Outlives `ordo run`: a grandchild that waits until the process above it (`ordo run`, the
 * subreaper, and its program) has gone, then tries TCP and UDP and writes the results to
 * the file `path`. The probe itself returns at once. */
static int outlive(const char *path) {
    pid_t child = fork();
    if (child == 0) {
        pid_t parent = getpid();
        if (fork() == 0) {
            /* Reparented to `ordo run` once its parent has gone; then wait until that is
             * gone too (the test kills it). */
            while (getppid() == parent) usleep(10000);
            pid_t above = getppid();
            for (int i = 0; i < 3000 && getppid() == above; i++) usleep(10000);
            int tcp = tcp_raw_v4(), udp = udp_raw_v4();
            FILE *f = fopen(path, "w");
            if (f) {
                fprintf(f, "outlived_tcp %s\noutlived_udp %s\n", name(tcp), name(udp));
                fclose(f);
            }
            _exit(0);
        }
        _exit(0);
    }
    return child_result(child);
}

static void report(const char *what, int e) { printf("%s %s\n", what, name(e)); fflush(stdout); }

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s V4 V6 CASE...\n", argv[0]);
        return 2;
    }
    v4 = argv[1];
    v6 = argv[2];
    for (int i = 3; i < argc; i++) {
        const char *c = argv[i];
        int fd, e = -1;
        struct sockaddr_storage ss;
        struct sockaddr_in6 a6;
        if (!strcmp(c, "tcp_libc")) {
            fd = socket(AF_INET, SOCK_STREAM, 0);
            sin_of(&ss, sizeof(struct sockaddr_in), AF_INET, TCP_PORT);
            e = result(connect(fd, (void *)&ss, sizeof(struct sockaddr_in)));
        } else if (!strcmp(c, "tcp_raw")) {
            e = tcp_raw_v4();
        } else if (!strcmp(c, "tcp_raw_v6") || !strcmp(c, "tcp_raw_v6_24") || !strcmp(c, "tcp_raw_mapped") ||
                   !strcmp(c, "tcp_raw_v6_scope")) {
            fd = socket(AF_INET6, SOCK_STREAM, 0);
            sin6_of(&a6, TCP_PORT, !strcmp(c, "tcp_raw_mapped"));
            if (!strcmp(c, "tcp_raw_v6_scope")) a6.sin6_scope_id = 1;
            e = raw_connect(fd, &a6, !strcmp(c, "tcp_raw_v6_24") ? 24 : sizeof a6);
        } else if (!strcmp(c, "tcp_raw_len110") || !strcmp(c, "tcp_raw_len128")) {
            /* An IPv4 address in a union of socket addresses: the union's length. */
            fd = socket(AF_INET, SOCK_STREAM, 0);
            socklen_t len = !strcmp(c, "tcp_raw_len110") ? sizeof(struct sockaddr_un) : sizeof ss;
            sin_of(&ss, sizeof ss, AF_INET, TCP_PORT);
            e = raw_connect(fd, &ss, len);
        } else if (!strcmp(c, "tcp_fastopen")) {
            fd = socket(AF_INET, SOCK_STREAM, 0);
            sin_of(&ss, sizeof(struct sockaddr_in), AF_INET, TCP_PORT);
            e = result(sendto(fd, "leak", 4, MSG_FASTOPEN, (void *)&ss, sizeof(struct sockaddr_in)));
        } else if (!strcmp(c, "udp_libc") || !strcmp(c, "udp_family0_libc")) {
            fd = socket(AF_INET, SOCK_DGRAM, 0);
            sin_of(&ss, sizeof(struct sockaddr_in), !strcmp(c, "udp_libc") ? AF_INET : 0, UDP_PORT);
            e = result(sendto(fd, "leak", 4, 0, (void *)&ss, sizeof(struct sockaddr_in)));
        } else if (!strcmp(c, "udp_raw") || !strcmp(c, "udp_family0_raw")) {
            fd = socket(AF_INET, SOCK_DGRAM, 0);
            sin_of(&ss, sizeof(struct sockaddr_in), !strcmp(c, "udp_raw") ? AF_INET : 0, UDP_PORT);
            e = raw_sendto(fd, &ss, sizeof(struct sockaddr_in));
        } else if (!strcmp(c, "udp_short")) {
            fd = socket(AF_INET, SOCK_DGRAM, 0);
            sin_of(&ss, sizeof(struct sockaddr_in), AF_INET, UDP_PORT);
            e = raw_sendto(fd, &ss, 8);
        } else if (!strcmp(c, "udp_raw_v6") || !strcmp(c, "udp_raw_mapped")) {
            fd = socket(AF_INET6, SOCK_DGRAM, 0);
            sin6_of(&a6, UDP_PORT, !strcmp(c, "udp_raw_mapped"));
            e = raw_sendto(fd, &a6, sizeof a6);
        } else if (!strcmp(c, "udp_v6_family0_raw")) {
            /* On an IPv6 UDP socket family 0 means no address: to its (outside) remote. */
            fd = socket(AF_INET6, SOCK_DGRAM, 0);
            sin6_of(&a6, UDP_PORT, 0);
            a6.sin6_family = 0;
            e = raw_sendto(fd, &a6, sizeof a6);
        } else if (!strcmp(c, "udp_sendmsg_named_on_connected")) {
            /* Connected outside the tunnel (a documentation address, never reached), then a
             * message with the far end's address: the kernel sends to the name. */
            fd = socket(AF_INET, SOCK_DGRAM, 0);
            struct sockaddr_in out;
            memset(&out, 0, sizeof out);
            out.sin_family = AF_INET;
            out.sin_port = htons(9);
            inet_pton(AF_INET, "203.0.113.9", &out.sin_addr);
            syscall(SYS_connect, fd, &out, sizeof out);
            sin_of(&ss, sizeof(struct sockaddr_in), AF_INET, UDP_PORT);
            struct iovec iov = {"leak", 4};
            struct msghdr m = {.msg_name = &ss, .msg_namelen = sizeof(struct sockaddr_in), .msg_iov = &iov, .msg_iovlen = 1};
            e = result(syscall(SYS_sendmsg, fd, &m, 0));
        } else if (!strcmp(c, "udp_sendmmsg_second")) {
            /* The first message to loopback, the second to the far end. */
            fd = socket(AF_INET, SOCK_DGRAM, 0);
            struct sockaddr_in lo, far;
            memset(&lo, 0, sizeof lo);
            lo.sin_family = AF_INET;
            lo.sin_port = htons(9);
            lo.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            sin_of(&far, sizeof far, AF_INET, UDP_PORT);
            struct iovec iov = {"leak", 4};
            struct mmsghdr mm[2];
            memset(mm, 0, sizeof mm);
            mm[0].msg_hdr = (struct msghdr){.msg_name = &lo, .msg_namelen = sizeof lo, .msg_iov = &iov, .msg_iovlen = 1};
            mm[1].msg_hdr = (struct msghdr){.msg_name = &far, .msg_namelen = sizeof far, .msg_iov = &iov, .msg_iovlen = 1};
            long n = syscall(SYS_sendmmsg, fd, mm, 2, 0);
            e = n == 2 ? 0 : n < 0 ? errno : ENETUNREACH; /* one sent of two: the second refused */
        } else if (!strcmp(c, "udplite_libc") || !strcmp(c, "udplite_raw")) {
            /* UDP-Lite: a datagram socket that is not UDP, connected to the tunnel and then
             * sending. The stack carries UDP only: refused, not carried as UDP. */
            fd = socket(AF_INET, SOCK_DGRAM, IPPROTO_UDPLITE);
            sin_of(&ss, sizeof(struct sockaddr_in), AF_INET, UDP_PORT);
            e = !strcmp(c, "udplite_libc") ? result(connect(fd, (void *)&ss, sizeof(struct sockaddr_in)))
                                           : raw_connect(fd, &ss, sizeof(struct sockaddr_in));
            if (e == 0) e = result(send(fd, "leak", 4, 0));
            close(fd);
        } else if (!strcmp(c, "sctp_connectx") || !strcmp(c, "sctp_connectx3")) {
            /* SCTP's connect by socket option. This kernel may have no SCTP: the option is
             * asked of a netlink socket, for which the kernel answers ENOPROTOOPT (any
             * level but its own); under `ordo run` the filter refuses it first, whatever
             * the socket. CONNECTX3 goes through getsockopt. */
            struct { int assoc; int len; void *addrs; } x;
            struct sockaddr_in a;
            sin_of(&a, sizeof a, AF_INET, TCP_PORT);
            fd = socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE);
            x.assoc = 0; x.len = sizeof a; x.addrs = &a;
            socklen_t len = sizeof x;
            e = !strcmp(c, "sctp_connectx") ? result(setsockopt(fd, 132, 110, &a, sizeof a))
                                             : result(getsockopt(fd, 132, 111, &x, &len));
            close(fd);
        } else if (!strcmp(c, "io_uring")) {
            char params[120] = {0};
            e = result(syscall(SYS_io_uring_setup, 4, params));
        } else if (!strcmp(c, "vfork")) {
            /* The child shares the parent's memory: only the system call, then _exit. */
            struct sockaddr_in a;
            sin_of(&a, sizeof a, AF_INET, TCP_PORT);
            int s = socket(AF_INET, SOCK_STREAM, 0);
            pid_t pid = vfork();
            if (pid == 0) _exit(syscall(SYS_connect, s, &a, sizeof a) < 0 ? errno : 0);
            e = child_result(pid);
        } else if (!strcmp(c, "clone3")) {
            e = clone3_child();
        } else if (!strcmp(c, "undumpable")) {
            /* Asks not to be dumpable, then reaches out: its destinations must still be read. */
            int asked = result(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0));
            report("undumpable_prctl", asked);
            e = tcp_raw_v4();
            report("undumpable_tcp", e);
            e = udp_raw_v4();
            c = "undumpable_udp";
        } else if (!strcmp(c, "reparented")) {
            int udp = 255;
            e = reparented(&udp);
            report("reparented_tcp", e);
            e = udp;
            c = "reparented_udp";
        } else if (!strncmp(c, "outlive=", 8)) {
            e = outlive(c + 8);
            c = "outlive";
        } else if (!strncmp(c, "exec=", 5)) {
            /* Runs another program (the probe, from a file this user may execute but not
             * read: the kernel makes such a process undumpable) with the cases after it. */
            char *args[argc - i + 3];
            args[0] = (char *)c + 5;
            args[1] = (char *)v4;
            args[2] = (char *)v6;
            int n = 3;
            for (int j = i + 1; j < argc; j++) args[n++] = argv[j];
            args[n] = NULL;
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                execv(args[0], args);
                _exit(127);
            }
            child_result(pid);
            return 0;
        } else {
            fprintf(stderr, "leak-probe: no case %s\n", c);
            return 2;
        }
        report(c, e);
    }
    return 0;
}
