#!/usr/bin/env python3
"""A server that lets its accept queue overflow (tcp_mode.sh, case backlog).

late_accept.py IP PORT COUNT DELAY_S: listens on IP:PORT with a backlog of 1, prints
"listening", then accepts nothing for DELAY_S seconds while clients connect: the kernel
completes two handshakes into the full queue and drops the last ACK of the others, whose
clients believe themselves connected. Then it accepts COUNT connections and echoes each (a
thread a connection) until the client closes; exits 0 when all COUNT ended, 1 when none came
for 30 s.
"""
import socket
import sys
import threading
import time


def echo(conn):
    with conn:
        while True:
            data = conn.recv(65536)
            if not data:
                return
            conn.sendall(data)


def main():
    ip, port, count, delay = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((ip, port))
    listener.listen(1)
    print("listening", flush=True)
    time.sleep(delay)
    listener.settimeout(30)
    threads = []
    try:
        for _ in range(count):
            conn, _ = listener.accept()
            conn.settimeout(None)
            thread = threading.Thread(target=echo, args=(conn,))
            thread.start()
            threads.append(thread)
    except socket.timeout:
        print(f"accepted {len(threads)} of {count} connections; none more for 30 s", flush=True)
        return 1
    for thread in threads:
        thread.join()
    print(f"echoed {count} connections", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
