# tcp_goodput.py — used by tcp_ring_floor.sh (a plain TCP stream, timed).
# tcpgood.py server PORT BYTES | client ADDR PORT BYTES : bounded TCP goodput test
import socket, sys, time
mode = sys.argv[1]
if mode == "server":
    port, n = int(sys.argv[2]), int(sys.argv[3])
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(1); s.settimeout(30)
    c, _ = s.accept(); c.settimeout(60)
    buf = bytearray(1 << 20); got = 0; t0 = None
    while got < n:
        k = c.recv_into(buf)
        if k == 0: break
        if t0 is None: t0 = time.time()
        got += k
    t1 = time.time()
    c.sendall(b"x"); c.close()
    print("recv %d B in %.4f s: %.2f MB/s" % (got, t1 - t0, got / (t1 - t0) / 1e6))
else:
    addr, port, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    for i in range(100):
        try:
            c = socket.create_connection((addr, port), timeout=5); break
        except OSError: time.sleep(0.05)
    c.settimeout(60)
    data = b"\0" * (1 << 20); sent = 0; t0 = time.time()
    while sent < n:
        c.sendall(data); sent += len(data)
    c.recv(1); t1 = time.time()
    print("sent %d B, acked in %.4f s: %.2f MB/s" % (sent, t1 - t0, sent / (t1 - t0) / 1e6))
