#!/usr/bin/env python3
"""abuse.py — attack helpers for tests/e2e/server_abuse.sh (loopback only, every loop bounded).

  abuse.py slowloris PORT N HOLD_S [KEY]
      opens N connections that each send a partial request header, keeps them alive by trickling
      one header byte a second, and meanwhile (after all N are open) times GET /health and one
      POST /v1/completions on fresh connections. Prints one JSON object:
      {"opened": n, "health_status": .., "health_s": .., "completion_status": .., "completion_s": ..,
       "slow_alive_after": k}   (k = slow connections the server had not closed at the end)
  abuse.py raw PORT FILE
      sends FILE's bytes verbatim, prints the status line, the Content-Type and the body (JSON).
"""
import json
import socket
import sys
import time


def request(port, method, path, body=None, key=None, timeout=10.0):
    t0 = time.time()
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        hdr = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        if key:
            hdr += f"Authorization: Bearer {key}\r\n"
        data = b""
        if body is not None:
            data = body.encode()
            hdr += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        s.sendall(hdr.encode() + b"\r\n" + data)
        resp = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            resp += chunk
        line = resp.split(b"\r\n", 1)[0].decode(errors="replace")
        status = int(line.split()[1]) if line.startswith("HTTP/") else 0
    except OSError:
        status = 0
    finally:
        s.close()
    return status, time.time() - t0


def slowloris(port, n, hold_s, key=None):
    conns = []
    for _ in range(n):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: ")
            s.setblocking(False)
            conns.append(s)
        except OSError:
            pass  # refused: fine, that is one of the defences
    opened = len(conns)
    hs, ht = request(port, "GET", "/health", key=key)
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})
    cs, ct = request(port, "POST", "/v1/completions", body=body, key=key, timeout=30)
    deadline = time.time() + hold_s
    while time.time() < deadline:  # trickle: one byte per connection per second
        for s in conns:
            try:
                s.send(b"a")
            except OSError:
                pass
        time.sleep(1.0)
    alive = 0
    for s in conns:
        try:
            s.send(b"a")
            d = s.recv(1)  # closed by the server -> b"" or an error
            alive += 0 if d == b"" else 1
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
        s.close()
    print(json.dumps({"opened": opened, "health_status": hs, "health_s": round(ht, 3),
                      "completion_status": cs, "completion_s": round(ct, 3), "slow_alive_after": alive}))


def raw(port, path):
    data = open(path, "rb").read()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    resp = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            resp += chunk
    except OSError:
        pass
    s.close()
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    ctype = ""
    for l in lines[1:]:
        if l.lower().startswith("content-type:"):
            ctype = l.split(":", 1)[1].strip()
    print(json.dumps({"status": lines[0], "content_type": ctype, "body": body.decode(errors="replace")[:500]}))


if __name__ == "__main__":
    if sys.argv[1] == "slowloris":
        slowloris(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5] if len(sys.argv) > 5 else None)
    elif sys.argv[1] == "raw":
        raw(int(sys.argv[2]), sys.argv[3])
    else:
        sys.exit("usage: abuse.py slowloris PORT N HOLD_S [KEY] | raw PORT FILE")
