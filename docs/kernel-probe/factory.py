"""Socket factory run inside a network namespace (see common.Factory). Our own code."""
import os
import socket
import subprocess
import sys

path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(1)
conn, _ = srv.accept()
f = conn.makefile("rb", buffering=0)
while True:
    line = f.readline()
    if not line or line.strip() == b"quit":
        break
    if line.strip() == b"sock":
        s = socket.socket(21, socket.SOCK_SEQPACKET, 0)
        socket.send_fds(conn, [b"x"], [s.fileno()])
        s.close()
    elif line.startswith(b"sh "):
        out = subprocess.run(line[3:].decode(), shell=True, capture_output=True)
        data = out.stdout + out.stderr
        conn.sendall(str(len(data)).encode() + b"\n" + data)
os.unlink(path)
