# Python clients of an HTTP server at @B@:8000 (tests/stack/stack.sh fills it in), each the
# way real programs use sockets; each prints its name and the body it got ("through").
import asyncio
import os
import select
import selectors
import socket
import sys

B = ("@B@", 8000)
REQ = b"GET /where HTTP/1.0\r\n\r\n"


def body(data):
    return data.split(b"\r\n\r\n", 1)[1].decode().strip()


def read_all_blocking(s):
    data = b""
    while chunk := s.recv(4096):
        data += chunk
    return body(data)


def blocking():
    s = socket.create_connection(B, timeout=10)
    s.sendall(REQ)
    return read_all_blocking(s)


def connect_nonblocking(s):
    s.setblocking(False)
    try:
        s.connect(B)
    except BlockingIOError:
        pass


def with_selectors():
    s = socket.socket()
    connect_nonblocking(s)
    sel = selectors.DefaultSelector()
    sel.register(s, selectors.EVENT_WRITE)
    assert sel.select(10), "never writable"
    assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
    s.send(REQ)
    sel.modify(s, selectors.EVENT_READ)
    data = b""
    while sel.select(10):
        chunk = s.recv(4096)
        if not chunk:
            return body(data)
        data += chunk
    raise TimeoutError("no answer")


def epoll_before_connect():
    s = socket.socket()
    s.setblocking(False)
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLOUT)
    connect_nonblocking(s)
    assert ep.poll(10), "the registration made before connect was lost"
    s.send(REQ)
    ep.modify(s.fileno(), select.EPOLLIN)
    data = b""
    while ep.poll(10):
        chunk = s.recv(4096)
        if not chunk:
            return body(data)
        data += chunk
    raise TimeoutError("no answer")


async def with_asyncio():
    r, w = await asyncio.wait_for(asyncio.open_connection(*B), 10)
    w.write(REQ)
    data = await asyncio.wait_for(r.read(), 10)
    w.close()
    return body(data)


def with_destinations():
    # sendto and sendmsg with the connected peer's address, as the kernel's TCP takes them
    # (it ignores the address; a Unix stream socket would refuse it with EISCONN).
    s = socket.create_connection(B, timeout=10)
    s.sendto(REQ[:10], B)
    s.sendmsg([REQ[10:]], [], 0, B)
    return read_all_blocking(s)


def forked_child():
    s = socket.create_connection(B, timeout=10)
    pid = os.fork()
    if pid == 0:
        s.sendall(REQ)
        os._exit(0 if read_all_blocking(s) == "through" else 1)
    s.close()
    _, status = os.waitpid(pid, 0)
    return "through" if os.waitstatus_to_exitcode(status) == 0 else "child failed"


def exec_child():
    # A child that execs a new program with the connection: the new program's library
    # knows it for what it is (its peer, its name), and the bytes flow. The new program is
    # this script again, told by its arguments which descriptor to take.
    s = socket.create_connection(B, timeout=10)
    s.set_inheritable(True)
    pid = os.fork()
    if pid == 0:
        os.execv(sys.executable, [sys.executable, __file__, "exec", str(s.fileno())])
    s.close()
    _, status = os.waitpid(pid, 0)
    return "through" if os.waitstatus_to_exitcode(status) == 0 else "exec'd child failed"


def spawned_child():
    # As exec_child, the new program started with posix_spawn.
    s = socket.create_connection(B, timeout=10)
    s.set_inheritable(True)
    pid = os.posix_spawn(sys.executable, [sys.executable, __file__, "exec", str(s.fileno())], os.environ)
    s.close()
    _, status = os.waitpid(pid, 0)
    return "through" if os.waitstatus_to_exitcode(status) == 0 else "spawned child failed"


if sys.argv[1:2] == ["exec"]:
    s = socket.socket(fileno=int(sys.argv[2]))
    # The parent's timeout left the descriptor non-blocking; this socket object waits.
    s.settimeout(10)
    ok = s.getpeername()[:2] == B and s.getsockname()[0].startswith("10.99.0.")
    s.sendall(REQ)
    sys.exit(0 if ok and read_all_blocking(s) == "through" else 1)

for name, f in [
    ("blocking", blocking),
    ("destinations", with_destinations),
    ("selectors", with_selectors),
    ("epoll_before_connect", epoll_before_connect),
    ("asyncio", lambda: asyncio.run(with_asyncio())),
    ("fork", forked_child),
    ("exec", exec_child),
    ("spawn", spawned_child),
]:
    print(name, f())
