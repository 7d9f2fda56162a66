"""Plain TCP client: connect to HOST:16385, report what happens (our own code)."""
import socket, sys, time
s = socket.create_connection((sys.argv[1], 16385))
print("connected from", s.getsockname(), flush=True)
s.settimeout(3)
t = time.monotonic()
try:
    d = s.recv(100)
    print("recv", len(d), "bytes (0 = EOF) after", round(time.monotonic() - t, 2), "s")
except Exception as e:
    print("recv error", e, "after", round(time.monotonic() - t, 2), "s")
